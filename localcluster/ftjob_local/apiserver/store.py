"""Object storage: every object in memory for fast reads, written through to sqlite in the state dir so a restart
keeps them; a global resourceVersion counter; per kind, indexes (namespace, label key and key=value, chosen fields)
and a bounded event history that watches replay from.

Durability. Writes change the memory at once and reach sqlite in batches: every write of one event-loop iteration
goes into one transaction (the last state of each object only), committed at the end of that iteration, before
any watcher hears of them. The server answers a request only once everything written so far is committed
(`durable()`; app.py's middleware), so a crash of the server process loses nothing that was acknowledged, and no
watch event, list or get ever showed a write that a crash then lost. What a crash can lose: the writes of requests
not yet answered (their clients see a dropped connection and retry). resourceVersions are reserved ahead in blocks
(`RV_BLOCK`), so a restart never hands out a version that an unanswered write had already used. sqlite runs in WAL
mode with synchronous=NORMAL: a process crash loses no commit; a power cut or OS crash may lose the last commits.
"""

from __future__ import annotations

import asyncio
import collections
import fcntl
import json
import logging
import os
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

Key = tuple[str, str]  # (group, plural)
Ref = tuple[str, str]  # (namespace, name)

HISTORY = 20000  # events of one kind a watch can resume from; older resourceVersions get 410 Gone
RV_BLOCK = 10000  # resourceVersions reserved on disk at a time (a restart continues after the reserved block)

log = logging.getLogger(__name__)


@dataclass
class Event:
    rv: int
    key: Key
    type: str  # ADDED, MODIFIED, DELETED
    old: dict[str, Any] | None
    new: dict[str, Any]


CLOSE_WATCH = None  # put on a watch queue: the stream ends (as on a server restart)


def field_value(obj: dict[str, Any], path: str) -> str:
    """A dotted path's value as a field selector compares it ("" when absent)."""
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


@dataclass
class Kind:
    """The objects of one kind and their indexes; each index maps to the refs of the objects it holds."""

    fields: tuple[str, ...] = ()  # dotted paths indexed by value (field selectors, allocation checks)
    objects: dict[Ref, dict[str, Any]] = field(default_factory=dict)
    by_ns: dict[str, set[Ref]] = field(default_factory=lambda: collections.defaultdict(set))
    by_label: dict[tuple[str, str], set[Ref]] = field(default_factory=lambda: collections.defaultdict(set))
    by_label_key: dict[str, set[Ref]] = field(default_factory=lambda: collections.defaultdict(set))
    by_field: dict[tuple[str, str], set[Ref]] = field(default_factory=lambda: collections.defaultdict(set))
    history: collections.deque[Event] = field(default_factory=lambda: collections.deque(maxlen=HISTORY))
    history_start: int = 0  # every event of this kind after this resourceVersion is in `history`
    watchers: set[asyncio.Queue[Event | None]] = field(default_factory=set)

    def _entries(self, ref: Ref, obj: dict[str, Any]) -> Iterable[tuple[dict[Any, set[Ref]], Any]]:
        yield self.by_ns, ref[0]
        labels = obj.get("metadata", {}).get("labels") or {}
        for k, v in labels.items():
            yield self.by_label, (k, str(v))
            yield self.by_label_key, k
        for path in self.fields:
            yield self.by_field, (path, field_value(obj, path))

    def index(self, ref: Ref, obj: dict[str, Any] | None, add: bool) -> None:
        if obj is None:
            return
        for table, value in self._entries(ref, obj):
            if add:
                table[value].add(ref)
            else:
                refs = table.get(value)
                if refs is not None:
                    refs.discard(ref)
                    if not refs:
                        del table[value]

    def candidates(
        self,
        ns: str | None,
        labels: Iterable[tuple[str, str]] = (),
        label_keys: Iterable[str] = (),
        fields: Iterable[tuple[str, str]] = (),
    ) -> Iterable[dict[str, Any]]:
        """The objects in `ns` (None: any) with these labels, label keys and field values (fields this kind does not
        index do not narrow it): intersections of the index entries, smallest first; a scan only without terms."""
        sets = [self.by_label.get(lv, set()) for lv in labels]
        sets += [self.by_label_key.get(k, set()) for k in label_keys]
        sets += [self.by_field.get(fv, set()) for fv in fields if fv[0] in self.fields]
        if ns is not None:
            sets.append(self.by_ns.get(ns, set()))
        if not sets:
            return list(self.objects.values())
        sets.sort(key=len)
        refs = sets[0]
        for other in sets[1:]:  # each intersection costs the size of the (already small) result
            if not refs:
                break
            refs = refs & other
        return [self.objects[r] for r in refs]


class Store:
    def __init__(self, state_dir: str, indexed_fields: dict[Key, tuple[str, ...]] | None = None):
        os.makedirs(state_dir, exist_ok=True)
        # One server per state dir: a second one would fork the resourceVersion history.
        self._lock = open(os.path.join(state_dir, "apiserver.lock"), "w")  # noqa: SIM115 (held until close)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            self._lock.close()
            raise RuntimeError(
                f"another API server is already using the state dir {state_dir}; stop it first "
                "(or pick another --state-dir)"
            ) from e
        self.db = sqlite3.connect(
            os.path.join(state_dir, "objects.sqlite"), isolation_level=None, check_same_thread=False
        )
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS objects (grp TEXT, res TEXT, ns TEXT, name TEXT, data TEXT, "
            "PRIMARY KEY (grp, res, ns, name))"
        )
        self.db.execute("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT)")
        rows = dict(self.db.execute("SELECT k, v FROM meta WHERE k IN ('rv', 'rv_reserved')").fetchall())
        # Continue after the reserved block: versions an unanswered write used before a crash are never reused.
        self.rv = max(int(rows.get("rv", 0)), int(rows.get("rv_reserved", 0)))
        self._reserved = self.rv
        self.emitted_rv = self.rv  # the last event watchers were told of (later writes wait for their commit)
        self._history_floor = self.rv  # every event since start (or the last compaction) is in some history
        self._indexed_fields = dict(indexed_fields or {})
        self.kinds: dict[Key, Kind] = {}
        self.by_uid: dict[str, tuple[Key, str, str]] = {}
        self.dependents: dict[str, set[tuple[Key, str, str]]] = collections.defaultdict(
            set
        )  # owner uid -> objects
        for grp, res, ns, name, data in self.db.execute("SELECT grp, res, ns, name, data FROM objects"):
            obj = json.loads(data)
            kind = self.kind((grp, res))
            kind.objects[(ns, name)] = obj
            kind.index((ns, name), obj, add=True)
            self.by_uid[obj["metadata"]["uid"]] = ((grp, res), ns, name)
            self._index_owners((grp, res), ns, name, obj, add=True)
        # Written but not committed yet: the last state of each object (None: removed), and their events.
        self._pending: dict[tuple[Key, Ref], dict[str, Any] | None] = {}
        self._pending_events: list[Event] = []
        self._flush_handle: asyncio.Handle | None = None
        self._flushed: asyncio.Future[None] | None = None

    def kind(self, key: Key) -> Kind:
        kind = self.kinds.get(key)
        if kind is None:
            kind = self.kinds[key] = Kind(
                self._indexed_fields.get(key, ()), history_start=self._history_floor
            )
        return kind

    def close(self) -> None:
        self.flush()
        # Nothing is left unanswered after a clean stop: the next start continues right after the last version.
        self.db.execute("INSERT OR REPLACE INTO meta VALUES ('rv_reserved', ?)", (str(self.rv),))
        self.db.close()
        self._lock.close()

    def next_rv(self) -> int:
        self.rv += 1
        if self.rv > self._reserved:
            self._reserved = self.rv + RV_BLOCK
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('rv_reserved', ?)", (str(self._reserved),))
        return self.rv

    # --- reads --------------------------------------------------------------------------------------------------
    def get(self, key: Key, ns: str, name: str) -> dict[str, Any] | None:
        kind = self.kinds.get(key)
        return kind.objects.get((ns, name)) if kind is not None else None

    def list(self, key: Key, ns: str | None = None) -> list[dict[str, Any]]:
        return sort_objects(self.kind(key).candidates(ns))

    def locate(self, uid: str) -> tuple[Key, str, str] | None:
        """Where the object with this uid lives: (key, namespace, name), or None when it is gone."""
        return self.by_uid.get(uid)

    def by_field(self, key: Key, path: str, value: str) -> list[dict[str, Any]]:
        """Objects whose indexed field `path` has this value (the path must be one of the kind's indexed fields)."""
        kind = self.kind(key)
        assert path in kind.fields, f"{path} is not indexed for {key}"
        return [kind.objects[r] for r in kind.by_field.get((path, value), ())]

    def by_owner(self, uid: str) -> list[tuple[Key, dict[str, Any]]]:
        out = []
        for key, ns, name in sorted(self.dependents.get(uid, ())):
            obj = self.get(key, ns, name)
            if obj is not None and any(
                r.get("uid") == uid for r in obj["metadata"].get("ownerReferences") or []
            ):
                out.append((key, obj))
        return out

    # --- watches ------------------------------------------------------------------------------------------------
    def subscribe(self, key: Key) -> asyncio.Queue[Event | None]:
        """A queue that receives every event of this kind from now on (CLOSE_WATCH: end the stream); unsubscribe()
        it when done."""
        queue: asyncio.Queue[Event | None] = asyncio.Queue()
        self.kind(key).watchers.add(queue)
        return queue

    def unsubscribe(self, key: Key, queue: asyncio.Queue[Event | None]) -> None:
        self.kind(key).watchers.discard(queue)

    def close_watches(self) -> None:
        """End every open watch stream, as a restart of the server would (clients watch again from their last
        resourceVersion)."""
        for kind in self.kinds.values():
            for queue in kind.watchers:
                queue.put_nowait(CLOSE_WATCH)
            kind.watchers.clear()

    def compact(self) -> None:
        """Forget the event history (etcd's compaction): a watch from an older resourceVersion gets 410 Gone."""
        self.flush()
        self._history_floor = self.rv
        for kind in self.kinds.values():
            kind.history.clear()
            kind.history_start = self.rv

    def history_start(self, key: Key) -> int:
        return self.kind(key).history_start

    def events_since(self, rv: int, key: Key) -> list[Event] | None:
        """Events of `key` after `rv`, or None when they are no longer all known (the caller answers 410 Gone)."""
        kind = self.kind(key)
        if rv < kind.history_start:
            return None
        out = []
        for event in reversed(kind.history):  # resuming watches are recent: walk back only as far as needed
            if event.rv <= rv:
                break
            out.append(event)
        out.reverse()
        return out

    # --- writes -------------------------------------------------------------------------------------------------
    def _index_owners(self, key: Key, ns: str, name: str, obj: dict[str, Any] | None, add: bool) -> None:
        for ref in (obj or {}).get("metadata", {}).get("ownerReferences") or []:
            uid = ref.get("uid")
            if not uid:
                continue
            if add:
                self.dependents[uid].add((key, ns, name))
            else:
                self.dependents[uid].discard((key, ns, name))
                if not self.dependents[uid]:
                    del self.dependents[uid]

    def put(self, key: Key, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        """Store `obj` (its resourceVersion already set from next_rv()); watchers hear of it once committed."""
        meta = obj["metadata"]
        ref = (meta.get("namespace", ""), meta["name"])
        kind = self.kind(key)
        previous = kind.objects.get(ref)
        self._index_owners(key, *ref, previous, add=False)
        kind.index(ref, previous, add=False)
        kind.objects[ref] = obj
        kind.index(ref, obj, add=True)
        self._index_owners(key, *ref, obj, add=True)
        self.by_uid[meta["uid"]] = (key, *ref)
        event = Event(int(meta["resourceVersion"]), key, "ADDED" if old is None else "MODIFIED", old, obj)
        self._write(key, ref, obj, event)

    def remove(self, key: Key, obj: dict[str, Any]) -> None:
        """Remove an object for good; `obj` is its final state with a fresh resourceVersion."""
        meta = obj["metadata"]
        ref = (meta.get("namespace", ""), meta["name"])
        kind = self.kind(key)
        old = kind.objects.pop(ref, None)
        kind.index(ref, old, add=False)
        self._index_owners(key, *ref, old, add=False)
        self.by_uid.pop(meta["uid"], None)
        self._write(key, ref, None, Event(int(meta["resourceVersion"]), key, "DELETED", old, obj))

    def _write(self, key: Key, ref: Ref, obj: dict[str, Any] | None, event: Event) -> None:
        self._pending[(key, ref)] = obj
        self._pending_events.append(event)
        if self._flush_handle is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (startup, tools): commit now
            self.flush()
            return
        self._flush_handle = loop.call_soon(self.flush)
        if self._flushed is None or self._flushed.done():
            self._flushed = loop.create_future()

    async def durable(self) -> None:
        """Return once every write made so far is committed (raises if the commit failed)."""
        if self._flushed is not None and not self._flushed.done():
            await asyncio.shield(self._flushed)

    def flush(self) -> None:
        """Commit the pending writes in one transaction, then tell the watchers."""
        self._flush_handle = None
        waiters, self._flushed = self._flushed, None
        if self._pending:
            puts = [(k[0], k[1], r[0], r[1], json.dumps(o, separators=(",", ":"))) for (k, r), o in
                    self._pending.items() if o is not None]  # fmt: skip
            removes = [(k[0], k[1], r[0], r[1]) for (k, r), o in self._pending.items() if o is None]
            try:
                self.db.execute("BEGIN")  # one transaction (autocommit mode would commit each statement)
                try:
                    self.db.executemany("INSERT OR REPLACE INTO objects VALUES (?, ?, ?, ?, ?)", puts)
                    self.db.executemany(
                        "DELETE FROM objects WHERE grp=? AND res=? AND ns=? AND name=?", removes
                    )
                    self.db.execute("INSERT OR REPLACE INTO meta VALUES ('rv', ?)", (str(self.rv),))
                    self.db.execute("COMMIT")
                except BaseException:
                    self.db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as e:  # kept pending: the next write retries; these requests fail
                log.error("committing %d objects failed: %s", len(self._pending), e)
                if waiters is not None and not waiters.done():
                    waiters.set_exception(RuntimeError(f"the object store could not commit: {e}"))
                return
            self._pending.clear()
        events, self._pending_events = self._pending_events, []
        for event in events:
            self._emit(event)
        if waiters is not None and not waiters.done():
            waiters.set_result(None)

    def _emit(self, event: Event) -> None:
        self.emitted_rv = event.rv
        kind = self.kind(event.key)
        if len(kind.history) == kind.history.maxlen:
            kind.history_start = kind.history[0].rv
        kind.history.append(event)
        for q in list(kind.watchers):
            q.put_nowait(event)


def sort_objects(objs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """In the order lists are served: by namespace, then name."""
    return sorted(objs, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
