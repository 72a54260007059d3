"""The on-disk layout of --checkpoint-dir: names, the commit, the checks before a load, retention. No torch state
here, no collectives: checkpoint.py orchestrates saves and loads across ranks on top of this.

Under --checkpoint-dir:
  step-000000120/            committed: DCP shards + .metadata + ftjob.json (the loop's state) + rng-rank<r>.pt
  .tmp-step-000000130/       a save in progress (or killed half-way): never loaded, never counted. Once it holds
                             ftjob.json, every rank's files of the step are written, some maybe only in their pod's
                             memory tier (memory_tier.py): "memory-committed", resumable where every rank can read
                             what it needs; the durable copy fills it in and rank 0 renames it (the commit)
  .trash-step-000000100/     dropped by retention, being deleted in the background (or left by an exit: removed
                             at the next start)
  failed-step-000000110-<t>/ a committed checkpoint that failed to load, set aside as evidence (never deleted)
A save writes into the tmp directory (DCP fsyncs every file and writes .metadata last), then rank 0 writes
ftjob.json, fsyncs, and renames the directory: the rename is the commit. "Latest" is the newest committed step.
Object stores (no rename) commit with a marker instead: checkpoint_store.py.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
from typing import Any

log = logging.getLogger("ftjob_trainer.checkpoint")  # the name people grep the log for

FORMAT = 1
META_FILE = "ftjob.json"
COMMITTED_RE = re.compile(r"^step-(\d{9})$")
TMP_PREFIX = ".tmp-step-"
TRASH_PREFIX = ".trash-step-"  # retention's victims, renamed first, deleted in the background
FAILED_PREFIX = "failed-step-"


class CorruptCheckpoint(RuntimeError):
    pass


def committed_name(step: int) -> str:
    return f"step-{step:09d}"


def tmp_path(root: str, step: int) -> str:
    return os.path.join(root, f"{TMP_PREFIX}{step:09d}")


def rng_file(path: str, rank: int) -> str:
    return os.path.join(path, f"rng-rank{rank}.pt")


def list_committed(root: str) -> list[tuple[int, str]]:
    """Committed checkpoints, newest first. A directory counts only if its name says committed and it holds the
    DCP .metadata and our ftjob.json (both written before the rename)."""
    if not os.path.isdir(root):
        return []
    out = []
    for name in os.listdir(root):
        m = COMMITTED_RE.match(name)
        path = os.path.join(root, name)
        if (
            m
            and os.path.isfile(os.path.join(path, ".metadata"))
            and os.path.isfile(os.path.join(path, META_FILE))
        ):
            out.append((int(m.group(1)), path))
    return sorted(out, reverse=True)


def list_memory_committed(root: str) -> list[tuple[int, str]]:
    """Saves whose files are all written but not all durable yet (a .tmp- folder holding ftjob.json), newest first."""
    if not os.path.isdir(root):
        return []
    out = []
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.startswith(TMP_PREFIX) and os.path.isfile(os.path.join(path, META_FILE)):
            step = name.removeprefix(TMP_PREFIX)
            if step.isdigit():
                out.append((int(step), path))
    return sorted(out, reverse=True)


def retention_victims(committed: list[tuple[int, str]], keep_last: int) -> list[str]:
    """Which committed checkpoints to delete: all but the newest keep_last (never the newest one)."""
    return [path for _, path in committed[max(1, keep_last) :]]


def _dcp_reader(path: str) -> Any:
    """DCP's reader of one folder, imported on first use: importing torch.distributed.checkpoint takes 0.6 s and
    more, and the launcher's agent imports this module (read_ahead lists the folders) on its way to a rendezvous."""
    from torch.distributed.checkpoint import FileSystemReader

    return FileSystemReader(path)


def needed_files(path: str, world_size: int) -> dict[str, int]:
    """name -> bytes of every file a complete checkpoint in `path` holds: the shards its DCP .metadata names
    (read from `path`) and each rank's RNG state."""
    need: dict[str, int] = {}
    for info in (_dcp_reader(path).read_metadata().storage_data or {}).values():
        need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
    for r in range(world_size):
        need[os.path.basename(rng_file(path, r))] = 1
    return need


def validate(path: str) -> dict[str, Any]:
    """Cheap checks before a collective load, identical on every rank (shared storage): metadata readable, every
    shard file present and long enough, ftjob.json parseable. Raises CorruptCheckpoint saying what is wrong."""
    try:
        meta = json.load(open(os.path.join(path, META_FILE)))
    except (OSError, ValueError) as e:
        raise CorruptCheckpoint(f"{path}: {META_FILE} unreadable ({e})") from e
    sizes = {e.name: e.stat().st_size for e in os.scandir(path) if e.is_file()}
    return check_contents(path, meta, _dcp_reader(path), sizes)


def check_contents(path: str, meta: dict[str, Any], reader: Any, sizes: dict[str, int]) -> dict[str, Any]:
    """The checks shared by every store: the format, the DCP .metadata (read by `reader`), each shard it names
    long enough in `sizes` (file name -> bytes), every rank's RNG state present. Returns meta."""
    if meta.get("format") != FORMAT:
        raise CorruptCheckpoint(f"{path}: format {meta.get('format')!r}, this trainer reads format {FORMAT}")
    try:
        md = reader.read_metadata()
    except Exception as e:  # noqa: BLE001 - any failure to parse means unusable
        raise CorruptCheckpoint(f"{path}: DCP .metadata unreadable ({type(e).__name__}: {e})") from e
    need: dict[str, int] = {}
    for info in (md.storage_data or {}).values():
        need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
    for rel, length in need.items():
        if rel not in sizes:
            raise CorruptCheckpoint(f"{path}: shard {rel} is missing")
        if sizes[rel] < length:
            raise CorruptCheckpoint(f"{path}: shard {rel} is truncated ({sizes[rel]} < {length} bytes)")
    for r in range(int(meta.get("world_size") or 1)):  # each rank's RNG state, read after the load
        if not sizes.get(os.path.basename(rng_file(path, r))):
            raise CorruptCheckpoint(f"{path}: rng-rank{r}.pt is missing or empty")
    return meta


def validate_memory_committed(path: str) -> dict[str, Any]:
    """The checks a memory-committed save allows before a load: ftjob.json and the DCP .metadata readable (which
    file comes from which tier, and whether it is complete there, is the reader's per-file decision)."""
    try:
        meta = json.load(open(os.path.join(path, META_FILE)))
    except (OSError, ValueError) as e:
        raise CorruptCheckpoint(f"{path}: {META_FILE} unreadable ({e})") from e
    if meta.get("format") != FORMAT or not meta.get("save_id"):
        raise CorruptCheckpoint(f"{path}: not a memory-committed save of format {FORMAT}")
    try:
        _dcp_reader(path).read_metadata()
    except Exception as e:  # noqa: BLE001 - any failure to parse means unusable
        raise CorruptCheckpoint(f"{path}: DCP .metadata unreadable ({type(e).__name__}: {e})") from e
    return meta


def remove_leftovers(root: str) -> None:
    """At start (rank 0): saves killed half-way and retention's deletions cut short by an exit. The newest
    memory-committed save stays when it is newer than every committed one: this start may resume from it and
    finish its durable copy."""
    committed = list_committed(root)
    newest = committed[0][0] if committed else -1
    pending = [path for step, path in list_memory_committed(root) if step > newest][:1]
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.startswith(TMP_PREFIX) and path not in pending:  # incomplete, or superseded
            log.warning("removing save %s (never committed, and no longer the newest)", name)
            shutil.rmtree(path, ignore_errors=True)
        elif name.startswith(TRASH_PREFIX):
            shutil.rmtree(path, ignore_errors=True)


def fsync_file(path: str) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json_durable(path: str, doc: dict) -> None:
    """tmp + fsync + rename: a crash leaves the previous document or the new one, never half of one."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_meta(tmp: str, meta: dict) -> None:
    """Rank 0, once every rank's files are written somewhere: the memory commit (ftjob.json in the .tmp- folder)."""
    _write_json_durable(os.path.join(tmp, META_FILE), meta)
    _fsync_dir(tmp)


def commit(tmp: str, final: str, meta: dict) -> None:
    """Rank 0, once every rank's shards are durable: ftjob.json, fsync, rename (the commit), fsync the parent."""
    write_meta(tmp, meta)
    os.rename(tmp, final)
    _fsync_dir(os.path.dirname(final))


def set_aside(root: str, path: str, step: int) -> str:
    """A committed checkpoint that failed to load leaves the committed set, kept as evidence (rank 0)."""
    aside = os.path.join(root, f"{FAILED_PREFIX}{step:09d}-{int(time.time())}")
    os.rename(path, aside)
    return aside


def dir_bytes(path: str) -> int:
    """The bytes of a checkpoint directory's files (every rank's shards)."""
    return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())


class Retention:
    """Retention off the save's critical path: the store takes a victim out of the committed set at once (a rename
    on a folder, the marker's deletion on an object store: checkpoint_store.py), a background thread deletes the
    rest (deleting 11 GB took 3.6 s of a 11 s preemption save on the H200 machine). A deletion cut short by an exit
    is finished by the next start."""

    def __init__(self, store: Any, keep_last: int):
        self.store, self.keep_last = store, keep_last
        self._deleters: list[threading.Thread] = []

    def apply(self) -> None:
        for victim in retention_victims(self.store.list_committed(), self.keep_last):
            log.info("retention: deleting %s (keeping the newest %d committed)", victim, self.keep_last)
            self._delete(self.store.drop(victim))
        self._deleters = [t for t in self._deleters if t.is_alive()]

    def discard(self, path: str) -> None:
        """A memory-committed save that no longer counts (superseded, or unreadable by this world): out of the
        listing at once (renamed to .trash-), deleted in the background."""
        trash = os.path.join(self.store.root, TRASH_PREFIX + os.path.basename(path).removeprefix(TMP_PREFIX))
        try:
            os.rename(path, trash)
        except OSError:
            return  # already gone
        self._delete(lambda: shutil.rmtree(trash, ignore_errors=True))

    def _delete(self, delete) -> None:
        t = threading.Thread(target=_quietly, args=(delete,), daemon=True)
        t.start()
        self._deleters.append(t)

    def wait(self, timeout: float | None = None) -> None:
        for t in self._deleters:
            t.join(timeout)


def _quietly(delete) -> None:
    """A background deletion that fails is logged, not raised: the next start removes what is left."""
    try:
        delete()
    except Exception as e:  # noqa: BLE001
        log.warning("retention: background deletion failed (%s: %s)", type(e).__name__, e)
