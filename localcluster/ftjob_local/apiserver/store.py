"""Object storage: every object in memory for fast reads, written through to sqlite in the state dir so a restart
keeps them; a global resourceVersion counter; a bounded event history that watches replay from."""

from __future__ import annotations

import asyncio
import collections
import fcntl
import json
import os
import sqlite3
from dataclasses import dataclass
from typing import Any

Key = tuple[str, str]  # (group, plural)

HISTORY = 20000  # events a watch can resume from; older resourceVersions get 410 Gone


@dataclass
class Event:
    rv: int
    key: Key
    type: str  # ADDED, MODIFIED, DELETED
    old: dict[str, Any] | None
    new: dict[str, Any]


class Store:
    def __init__(self, state_dir: str):
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
        row = self.db.execute("SELECT v FROM meta WHERE k='rv'").fetchone()
        self.rv = int(row[0]) if row else 0
        self.objects: dict[Key, dict[tuple[str, str], dict[str, Any]]] = collections.defaultdict(dict)
        for grp, res, ns, name, data in self.db.execute("SELECT grp, res, ns, name, data FROM objects"):
            self.objects[(grp, res)][(ns, name)] = json.loads(data)
        self.history: collections.deque[Event] = collections.deque(maxlen=HISTORY)
        self.history_start = self.rv  # every event after this resourceVersion is in `history`
        self.watchers: set[asyncio.Queue[Event]] = set()
        self.by_uid: dict[str, tuple[Key, str, str]] = {}
        self.dependents: dict[str, set[tuple[Key, str, str]]] = collections.defaultdict(
            set
        )  # owner uid -> objects
        for key, objs in self.objects.items():
            for (ns, name), obj in objs.items():
                self.by_uid[obj["metadata"]["uid"]] = (key, ns, name)
                self._index_owners(key, ns, name, obj, add=True)

    def close(self) -> None:
        self.db.close()
        self._lock.close()

    def next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def get(self, key: Key, ns: str, name: str) -> dict[str, Any] | None:
        return self.objects[key].get((ns, name))

    def list(self, key: Key, ns: str | None = None) -> list[dict[str, Any]]:
        objs = self.objects[key]
        items = [o for (n, _), o in objs.items() if ns is None or n == ns]
        items.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        return items

    def locate(self, uid: str) -> tuple[Key, str, str] | None:
        """Where the object with this uid lives: (key, namespace, name), or None when it is gone."""
        return self.by_uid.get(uid)

    def subscribe(self) -> asyncio.Queue[Event]:
        """A queue that receives every event from now on; unsubscribe() it when done."""
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self.watchers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[Event]) -> None:
        self.watchers.discard(queue)

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

    def by_owner(self, uid: str) -> list[tuple[Key, dict[str, Any]]]:
        out = []
        for key, ns, name in sorted(self.dependents.get(uid, ())):
            obj = self.objects[key].get((ns, name))
            if obj is not None and any(
                r.get("uid") == uid for r in obj["metadata"].get("ownerReferences") or []
            ):
                out.append((key, obj))
        return out

    def put(self, key: Key, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        """Store `obj` (its resourceVersion already set from next_rv()) and tell the watchers."""
        meta = obj["metadata"]
        ns, name = meta.get("namespace", ""), meta["name"]
        with self.db:
            self.db.execute(
                "INSERT OR REPLACE INTO objects VALUES (?, ?, ?, ?, ?)",
                (key[0], key[1], ns, name, json.dumps(obj, separators=(",", ":"))),
            )
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('rv', ?)", (str(self.rv),))
        self._index_owners(key, ns, name, self.objects[key].get((ns, name)), add=False)
        self.objects[key][(ns, name)] = obj
        self._index_owners(key, ns, name, obj, add=True)
        self.by_uid[meta["uid"]] = (key, ns, name)
        self._emit(Event(int(meta["resourceVersion"]), key, "ADDED" if old is None else "MODIFIED", old, obj))

    def remove(self, key: Key, obj: dict[str, Any]) -> None:
        """Remove an object for good; `obj` is its final state with a fresh resourceVersion."""
        meta = obj["metadata"]
        ns, name = meta.get("namespace", ""), meta["name"]
        with self.db:
            self.db.execute(
                "DELETE FROM objects WHERE grp=? AND res=? AND ns=? AND name=?", (key[0], key[1], ns, name)
            )
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('rv', ?)", (str(self.rv),))
        old = self.objects[key].pop((ns, name), None)
        self._index_owners(key, ns, name, old, add=False)
        self.by_uid.pop(meta["uid"], None)
        self._emit(Event(int(meta["resourceVersion"]), key, "DELETED", old, obj))

    def _emit(self, event: Event) -> None:
        if len(self.history) == self.history.maxlen:
            self.history_start = self.history[0].rv
        self.history.append(event)
        for q in list(self.watchers):
            q.put_nowait(event)

    def events_since(self, rv: int, key: Key) -> list[Event] | None:
        """Events of `key` after `rv`, or None when they are no longer all known (the caller answers 410 Gone)."""
        if rv < self.history_start:
            return None
        return [e for e in self.history if e.rv > rv and e.key == key]
