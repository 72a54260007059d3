"""Where committed checkpoints live: a folder (local disk or a mounted volume), or an fsspec URL (s3://, gs://, any
fsspec protocol whose package is installed). The checkpointer talks to a store; the store knows how to commit.

A folder commits by rename (checkpoint_layout.py). Object stores have no rename, so a save writes straight into
its final prefix and commits with a marker object written last:

  <url>/step-000000120/ftjob.json    the commit marker: the loop's state (as on a folder) plus "files", every other
                                     object of the checkpoint with its size in bytes
  <url>/step-000000120/...           DCP shards, .metadata, rng-rank<r>.pt
  <url>/failed-step-000000110-<t>/   a committed checkpoint that failed to load, moved aside as evidence

A checkpoint counts only when its marker exists and every file it lists is there with that size: a save killed
half-way (no marker) or a shard lost or cut short afterwards is never loaded and never counted. Retention deletes
the marker first, then the objects; the next start deletes prefixes without a marker (saves killed half-way and
deletions cut short). A single PUT is atomic on S3 and GCS, and their listings are strongly consistent.

Credentials and endpoints are fsspec's and the cloud SDKs' own: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
AWS_SESSION_TOKEN, AWS_ENDPOINT_URL (MinIO, Ceph, a local test server), IRSA or EKS pod identity; GCS application
default credentials or workload identity.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

from ftjob_trainer import checkpoint_layout as layout
from ftjob_trainer.config import ConfigError, is_url
from ftjob_trainer.contract import TIER_DURABLE
from ftjob_trainer.shard_io import ReadStats

log = logging.getLogger("ftjob_trainer.checkpoint")

Deleter = Callable[[], None]  # the slow part of dropping a checkpoint, run in the background


def open_store(root: str) -> LocalStore | ObjectStore:
    return ObjectStore(root) if is_url(root) else LocalStore(root)


def torch_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


class LocalStore:
    """A folder shared by all ranks: commit by rename (see checkpoint_layout.py), with the node-local memory tier
    in front of it when the pods have one (memory_tier.py; tiered: the loader reads each file from either tier)."""

    tiered = True

    def __init__(self, root: str):
        self.root = root

    def start(self) -> None:
        os.makedirs(self.root, exist_ok=True)
        layout.remove_leftovers(self.root)

    def list_committed(self) -> list[tuple[int, str]]:
        return layout.list_committed(self.root)

    def list_memory_committed(self) -> list[tuple[int, str]]:
        return layout.list_memory_committed(self.root)

    def save_path(self, step: int) -> str:
        """Where a save of `step` writes before its commit."""
        return layout.tmp_path(self.root, step)

    def prepare(self, path: str) -> None:
        """Rank 0, before a save: an empty directory for it."""
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)

    def discard(self, path: str) -> None:
        """Rank 0: a save that failed before its commit."""
        shutil.rmtree(path, ignore_errors=True)

    def write_bytes(self, path: str, data: bytes) -> None:
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def read_bytes(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def writer(self, path: str, threads: int) -> FileSystemWriter:
        return FileSystemWriter(path, sync_files=True, thread_count=threads)

    def reader(self, path: str) -> FileSystemReader:
        return FileSystemReader(path)

    def commit(self, tmp: str, step: int, meta: dict) -> str:
        final = os.path.join(self.root, layout.committed_name(step))
        layout.commit(tmp, final, meta)
        return final

    def validate(self, path: str) -> dict:
        return layout.validate(path)

    def set_aside(self, path: str, step: int) -> str:
        return layout.set_aside(self.root, path, step)

    def nbytes(self, path: str) -> int:
        return layout.dir_bytes(path)

    def drop(self, path: str) -> Deleter:
        """Retention: out of the committed set now (a rename), deleted later."""
        trash = os.path.join(self.root, layout.TRASH_PREFIX + os.path.basename(path).removeprefix("step-"))
        os.rename(path, trash)
        return lambda: shutil.rmtree(trash, ignore_errors=True)


class ObjectStore:
    """An fsspec URL: writes go to the final prefix; a marker object written last is the commit. No memory tier in
    front of it (yet): every save is written straight to the store."""

    tiered = False

    def __init__(self, url: str):
        import fsspec  # torch depends on it; the protocol's package (s3fs, gcsfs) is an extra

        self.root = url.rstrip("/")
        try:
            self.fs, self.base = fsspec.core.url_to_fs(self.root)
        except ImportError as e:
            raise ConfigError(f"--checkpoint-dir={url}: {e} (pip install 'ftjob[s3]' or 'ftjob[gcs]')") from e
        self.base = self.base.rstrip("/")

    # --- listing --------------------------------------------------------------------------------------------------
    def _sizes(self, under: str = "") -> dict[str, int]:
        """Every object under the root (or one of its prefixes): path relative to the root -> size."""
        self.fs.invalidate_cache()  # fsspec caches listings; a save or a peer's deletion just changed them
        top = f"{self.base}/{under}".rstrip("/")
        try:
            found = self.fs.find(top, detail=True)
        except FileNotFoundError:
            return {}
        return {p[len(self.base) :].lstrip("/"): int(info.get("size") or 0) for p, info in found.items()}

    def _by_checkpoint(self) -> dict[str, dict[str, int]]:
        """step-* prefix name -> {file inside it: size}."""
        groups: dict[str, dict[str, int]] = {}
        for rel, size in self._sizes().items():
            name, _, inner = rel.partition("/")
            if inner and layout.COMMITTED_RE.match(name):
                groups.setdefault(name, {})[inner] = size
        return groups

    def _marker(self, name: str) -> dict | None:
        try:
            return json.loads(self.fs.cat_file(f"{self.base}/{name}/{layout.META_FILE}"))
        except (OSError, ValueError):
            return None

    def list_committed(self) -> list[tuple[int, str]]:
        """Checkpoints whose marker exists and whose every listed file is there with its size, newest first."""
        out = []
        for name, files in self._by_checkpoint().items():
            if layout.META_FILE not in files:
                continue
            marker = self._marker(name)
            if marker is not None and not missing_files(marker, files):
                out.append((int(layout.COMMITTED_RE.match(name).group(1)), self.path(name)))
        return sorted(out, reverse=True)

    def list_memory_committed(self) -> list[tuple[int, str]]:
        return []

    def path(self, name: str) -> str:
        return f"{self.root}/{name}"

    # --- save -----------------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Rank 0 at start: delete prefixes without a marker (saves killed half-way, deletions cut short)."""
        for name, files in self._by_checkpoint().items():
            if layout.META_FILE not in files:
                log.warning("removing incomplete save %s (no commit marker)", self.path(name))
                self.fs.rm(f"{self.base}/{name}", recursive=True)

    def save_path(self, step: int) -> str:
        """A save writes straight into its final prefix: the marker, not a rename, commits it."""
        return self.path(layout.committed_name(step))

    def prepare(self, path: str) -> None:
        """Rank 0, before a save: its prefix emptied (a killed save of the same step may have left files)."""
        self.discard(path)

    def discard(self, path: str) -> None:
        name = path.rsplit("/", 1)[1]
        if self._sizes(name):
            self.fs.rm(f"{self.base}/{name}", recursive=True)

    def write_bytes(self, path: str, data: bytes) -> None:
        with self.fs.open(path, "wb") as f:
            f.write(data)

    def read_bytes(self, path: str) -> bytes | None:
        try:
            return self.fs.cat_file(path)
        except FileNotFoundError:
            return None

    def writer(self, path: str, threads: int):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        return FsspecWriter(path, sync_files=False, thread_count=threads)

    def reader(self, path: str):
        return TimedFsspecReader(path)

    def commit(self, tmp: str, step: int, meta: dict) -> str:
        """Rank 0, once every rank's objects are written: the marker, listing each of them with its size."""
        name = layout.committed_name(step)
        files = {rel: size for rel, size in self._files(name).items() if rel != layout.META_FILE}
        self.write_bytes(f"{tmp}/{layout.META_FILE}", json.dumps(dict(meta, files=files), indent=1).encode())
        return tmp

    def _files(self, name: str) -> dict[str, int]:
        return {rel.partition("/")[2]: size for rel, size in self._sizes(name).items()}

    # --- load -----------------------------------------------------------------------------------------------------
    def validate(self, path: str) -> dict:
        """The marker is readable and complete; then the same checks as on a folder (DCP metadata, shard lengths,
        every rank's RNG state)."""
        name = path.rsplit("/", 1)[1]
        files = self._files(name)
        marker = self._marker(name)
        if marker is None:
            raise layout.CorruptCheckpoint(f"{path}: commit marker {layout.META_FILE} missing or unreadable")
        missing = missing_files(marker, files)
        if missing:
            raise layout.CorruptCheckpoint(f"{path}: {missing[0]} (and {len(missing) - 1} more)")
        return layout.check_contents(path, marker, self.reader(path), files)

    def set_aside(self, path: str, step: int) -> str:
        """Out of the committed set (marker deleted first), then moved aside as evidence."""
        name = path.rsplit("/", 1)[1]
        aside = f"{layout.FAILED_PREFIX}{step:09d}-{int(time.time())}"
        marker = f"{self.base}/{name}/{layout.META_FILE}"
        self.fs.copy(marker, f"{self.base}/{aside}/{layout.META_FILE}")
        self.fs.rm(marker)
        for rel in self._files(name):  # no rename: each object is copied, then deleted
            self.fs.mv(f"{self.base}/{name}/{rel}", f"{self.base}/{aside}/{rel}")
        return self.path(aside)

    def nbytes(self, path: str) -> int:
        return sum(self._files(path.rsplit("/", 1)[1]).values())

    def drop(self, path: str) -> Deleter:
        """Retention: the marker goes first (the checkpoint stops counting), the objects in the background."""
        prefix = f"{self.base}/{path.rsplit('/', 1)[1]}"
        self.fs.rm(f"{prefix}/{layout.META_FILE}")
        return lambda: self.fs.rm(prefix, recursive=True)


def missing_files(marker: dict, files: dict[str, int]) -> list[str]:
    """What a marker lists that is absent or of another size ([] when complete)."""
    listed = marker.get("files")
    if not isinstance(listed, dict) or not listed:
        return ["the marker lists no files"]
    out = []
    for rel, size in listed.items():
        if rel not in files:
            out.append(f"{rel} is missing")
        elif files[rel] != size:
            out.append(f"{rel} has {files[rel]} bytes, the marker says {size}")
    return out


def _fsspec_reader_class():
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    return FsspecReader


class TimedFsspecReader(_fsspec_reader_class()):
    """DCP's FsspecReader that fills the ReadStats the load's event reports (one stream, the durable tier)."""

    def __init__(self, path: str, **kwargs):
        super().__init__(path, **kwargs)
        self.stats = ReadStats(threads=1)

    def read_data(self, plan, planner):
        started = time.monotonic()
        fut = super().read_data(plan, planner)
        fut.wait()
        self.stats.seconds += time.monotonic() - started
        names = {self.storage_data[i.storage_index].relative_path for i in plan.items}
        self.stats.files[TIER_DURABLE] = self.stats.files.get(TIER_DURABLE, 0) + len(names)
        nbytes = sum(self.storage_data[i.storage_index].length for i in plan.items)
        self.stats.bytes[TIER_DURABLE] = self.stats.bytes.get(TIER_DURABLE, 0) + nbytes
        return fut
