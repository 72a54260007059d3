"""The node-local memory tier of checkpoints and the durable copy made from it (torch-free file handling).

A save writes each rank's files into the pod's memory folder first (--memory-checkpoint-dir, on the pod's /dev/shm
volume); a background copy then makes them durable in the checkpoint folder. Layout:

  <memory>/step-000000120/rank-3/     rank 3's DCP shards and rng-rank3.pt (rank 0: also .metadata), and last
                                      ftjob-files.json {"save_id", "step", "rank", "files": {name: bytes}}
  <checkpoint-dir>/.tmp-step-000000120/
      ftjob.json                      rank 0 writes it once every rank's files are written (in memory or here): from
                                      then on the step is "memory-committed": resumable where every file is readable
      durable-rank3.json              which of rank 3's files are complete and fsynced here (same shape as
                                      ftjob-files.json): its small whole values at once, the rest once copied
  <checkpoint-dir>/step-000000120/    the durable commit: rank 0 renames the folder once the markers cover every
                                      file the save needs (its .metadata's shards, every rank's rng file)

The pod's memory folder outlives a worker process (torchrun restarts workers in the same container), not the pod.
A restarted worker finishes the durable copy of the rank folders its pod holds (DurableCopy.continue_from).
A marker's save_id ties files to one save: a memory folder left by another save of the same step is never read.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

log = logging.getLogger(__name__)

FILES_MARKER = "ftjob-files.json"  # in a memory rank folder, written last
DURABLE_MARKER_RE = re.compile(r"^durable-rank(\d+)\.json$")
RANK_DIR_RE = re.compile(r"^rank-(\d+)$")
STEP_DIR_RE = re.compile(r"^step-(\d{9})$")
COPY_CHUNK = 64 << 20  # bytes per sendfile call: the copy notices a cancel between chunks
MARKER_POLL_SECONDS = 0.2


def durable_marker(rank: int) -> str:
    return f"durable-rank{rank}.json"


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step-{step:09d}")


def rank_dir(root: str, step: int, rank: int) -> str:
    return os.path.join(step_dir(root, step), f"rank-{rank}")


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_marker(path: str, save_id: str, step: int, rank: int, files: dict[str, int], durable: bool) -> None:
    """tmp + rename, so a reader never sees half a marker; fsynced (file and folder) on the durable tier."""
    doc = {"save_id": save_id, "step": step, "rank": rank, "files": dict(sorted(files.items()))}
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        _fsync(os.path.dirname(path))


def read_marker(path: str) -> dict | None:
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    ok = isinstance(doc, dict) and isinstance(doc.get("files"), dict) and isinstance(doc.get("rank"), int)
    return doc if ok else None


def _intact(folder: str, files: dict[str, int]) -> bool:
    for name, size in files.items():
        try:
            if os.path.getsize(os.path.join(folder, name)) < size:
                return False
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class RankFolder:
    """One rank's files of one save, held in this pod's memory."""

    rank: int
    path: str
    files: dict[str, int]


def held(root: str | None, step: int, save_id: str) -> list[RankFolder]:
    """The rank folders of this save that this pod's memory holds intact (marker of this save, files long enough)."""
    folder = step_dir(root, step) if root else ""
    if not root or not os.path.isdir(folder):
        return []
    out = []
    for name in sorted(os.listdir(folder)):
        m = RANK_DIR_RE.match(name)
        path = os.path.join(folder, name)
        doc = read_marker(os.path.join(path, FILES_MARKER)) if m else None
        if (
            doc
            and doc.get("save_id") == save_id
            and doc["rank"] == int(m.group(1))
            and _intact(path, doc["files"])
        ):
            out.append(RankFolder(doc["rank"], path, {k: int(v) for k, v in doc["files"].items()}))
    return out


def memory_files(folders: list[RankFolder]) -> dict[str, str]:
    """file name -> the memory folder holding it (what TieredReader reads from memory)."""
    return {name: rf.path for rf in folders for name in rf.files}


def durable_markers(durable_dir: str, save_id: str) -> dict[int, dict[str, int]]:
    """rank -> its files, for every rank whose files are complete in the durable folder of this save."""
    out: dict[int, dict[str, int]] = {}
    try:
        names = os.listdir(durable_dir)
    except OSError:
        return out
    for name in names:
        m = DURABLE_MARKER_RE.match(name)
        doc = read_marker(os.path.join(durable_dir, name)) if m else None
        if doc and doc.get("save_id") == save_id and doc["rank"] == int(m.group(1)):
            out[doc["rank"]] = {k: int(v) for k, v in doc["files"].items()}
    return out


def durable_sizes(markers: dict[int, dict[str, int]]) -> dict[str, int]:
    return {name: size for files in markers.values() for name, size in files.items()}


def superseded(root: str | None, keep: set[int]) -> list[str]:
    """This pod's memory copies of every step not in keep (a newer step is memory-committed), as they are now: a
    save started after this call is never among them."""
    if not root or not os.path.isdir(root):
        return []
    names = (n for n in os.listdir(root) if STEP_DIR_RE.match(n))
    return [os.path.join(root, n) for n in sorted(names) if int(STEP_DIR_RE.match(n).group(1)) not in keep]


def remove(folders: list[str]) -> None:
    """Delete step folders (one cut short by an exit has files missing: never held, and pruned again later)."""
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def prune(root: str | None, keep: set[int]) -> None:
    """Delete this pod's memory copies of every step not in keep, now."""
    remove(superseded(root, keep))


def copy_file(src: str, dst: str, cancel: threading.Event) -> int:
    """Copy in the kernel (sendfile), chunk by chunk so a cancel is noticed, then fsync. Returns bytes copied."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        size, done = os.fstat(fin.fileno()).st_size, 0
        while done < size:
            if cancel.is_set():
                raise CopyCancelled(dst)
            sent = os.sendfile(fout.fileno(), fin.fileno(), done, min(COPY_CHUNK, size - done))
            if sent == 0:
                break
            done += sent
        fout.flush()
        os.fsync(fout.fileno())
    return done


class CopyCancelled(RuntimeError):
    pass


def covered(durable_dir: str, save_id: str, needed: dict[str, int]) -> bool:
    """Whether the durable markers of this save list every needed file, complete."""
    have = durable_sizes(durable_markers(durable_dir, save_id))
    return all(have.get(name, -1) >= size for name, size in needed.items())


class DurableCopy:
    """Copies rank folders from memory to the durable folder of one save (one thread per file, fsynced) and adds
    them to each rank's durable marker; on the committing rank (rank 0, `needed` given), waits until the markers
    cover every file the save needs and calls commit(). result(): the commit's return value (None where this rank
    does not commit). cancel(): a newer save supersedes this one (or the process exits): stop, never commit."""

    def __init__(
        self,
        durable_dir: str,
        save_id: str,
        step: int,
        folders: list[RankFolder],
        *,
        threads: int,
        needed: dict[str, int] | None = None,
        commit: Callable[[], object] | None = None,
    ):
        self.durable_dir, self.save_id, self.step = durable_dir, save_id, step
        self.folders, self.threads, self.needed = folders, max(1, threads), needed
        self.commit_fn = commit
        self.cancelled = threading.Event()
        self.copied_bytes = 0
        self.copied_at: float | None = None  # monotonic time this rank's files were all durable
        self.started = time.monotonic()
        self.future: Future = Future()
        self.thread = threading.Thread(target=self._run, name=f"ftjob-durable-copy-{step}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.future.set_result(self._copy_and_commit())
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the future
            self.future.set_exception(e)

    def _copy_and_commit(self) -> object:
        for rf in self.folders:
            marker = os.path.join(self.durable_dir, durable_marker(rf.rank))
            listed = (read_marker(marker) or {}).get("files", {}) if os.path.exists(marker) else {}
            names = sorted((n for n in rf.files if n not in listed), key=lambda n: -rf.files[n])
            if not names:
                continue  # already durable (a previous worker finished this folder)
            with ThreadPoolExecutor(min(self.threads, max(1, len(names)))) as pool:
                copies = [
                    pool.submit(
                        copy_file, os.path.join(rf.path, n), os.path.join(self.durable_dir, n), self.cancelled
                    )
                    for n in names
                ]
                self.copied_bytes += sum(c.result() for c in copies)
            _fsync(self.durable_dir)
            files = {**{k: int(v) for k, v in listed.items()}, **rf.files}
            write_marker(marker, self.save_id, self.step, rf.rank, files, durable=True)
        self.copied_at = time.monotonic()
        if self.commit_fn is None or self.needed is None:
            return None
        while not covered(self.durable_dir, self.save_id, self.needed):
            if self.cancelled.wait(MARKER_POLL_SECONDS):
                raise CopyCancelled(self.durable_dir)
        if self.cancelled.is_set():
            raise CopyCancelled(self.durable_dir)
        return self.commit_fn()

    def done(self) -> bool:
        return self.future.done()

    def result(self, timeout: float | None = None) -> object:
        return self.future.result(timeout)

    def cancel(self) -> None:
        self.cancelled.set()

    def own_files_durable(self) -> bool:
        return self.copied_at is not None
