"""Read ahead (FTJOB_READ_AHEAD, ftjob_trainer.launch): once a round forms, the launcher's agent reads the checkpoint
its new workers will load into this node's page cache, while those workers are still being forked, import and build
their model. Their load then finds the bytes in memory instead of on the medium.

Why: a replacement launched at the preemption signal (the notice path of bench/recovery_gpu.py) had its round
formed right after the stop commit, but its forkserver finished importing torch and the trainer 1.9 s later on the
H100 machine, and the worker's load of 11.4 GB then read at the medium's 1.5 GB/s: the disk sat idle for the
imports. A new node reads the durable tier (a network file system in a cluster) the same way: into its own page
cache. The read stays a cold read of the medium; it only starts sooner.

What it reads: the newest committed checkpoint, unless a newer save is only memory-committed (survivors load that
from their memory tier, and its durable copy is being written: reading an older checkpoint would slow both). Of
it, the shards that this node's share of the new world will need: FSDP shards each tensor by rows, so the ranks of
node g of n load the rows [g/n, (g+1)/n) of every tensor, which the old world's ranks floor(g W/n) to
ceil((g+1) W/n) - 1 saved (W ranks, read from ftjob.json); plus every file no rank prefix names and the side files
of small whole tensors every rank reads. A local folder only: an object store has no page cache to fill.

A job of one node starts reading when its launcher starts, before the agent imports torch: its node's workers
load every file whatever the round, and a replacement's launcher then spent 3.6 s of imports and its round before
the disk was asked for anything. Unless a save is in progress (a newer step folder): the step its workers load is
then not committed yet, and reading the older one would take the medium from that save. A read begun before the
round stops as soon as such a folder appears; the round reads the newer step.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ftjob_trainer import contract, events
from ftjob_trainer.checkpoint_layout import (
    COMMITTED_RE,
    META_FILE,
    TMP_PREFIX,
    list_committed,
    list_memory_committed,
)

log = logging.getLogger("ftjob.launch")

ENV_READ_AHEAD = "FTJOB_READ_AHEAD"
RANK_FILE_RE = re.compile(r"^__(\d+)_")  # DCP's shard files: __<saving rank>_<n>.distcp
SIDE_MARK = "replicated_"  # shard_io's side files of small whole tensors, read by every rank
CHUNK_BYTES = 16 << 20
NEWER_POLL_SECONDS = 0.05  # how often a read begun before the round looks for a newer save


@dataclass
class Plan:
    step: int
    path: str
    files: list[str]
    bytes: int


def checkpoint_source(trainer_args: list[str]) -> tuple[str, int] | None:
    """(checkpoint folder, read threads) of the built-in trainer's command line (its flags, then FTJOB_*), or None:
    no checkpoint folder, an object store, or a command line the trainer will refuse with a message of its own."""
    from ftjob_trainer.config import is_url, parse_args_quietly

    parsed = parse_args_quietly(trainer_args)
    if parsed is None:
        return None
    cfg = parsed.checkpoint
    if not cfg.checkpoint_dir or is_url(cfg.checkpoint_dir):
        return None
    return cfg.checkpoint_dir, cfg.read_threads


def plan(root: str, node: int, nodes: int) -> Plan | None:
    """What node `node` of `nodes` reads ahead in the checkpoint folder `root` (see the module's docstring)."""
    committed = list_committed(root)
    if not committed:
        return None
    step, path = committed[0]
    memory = list_memory_committed(root)
    if memory and memory[0][0] > step:
        return None
    try:
        with open(os.path.join(path, META_FILE)) as f:
            saved = int(json.load(f)["world_size"])
        names = os.listdir(path)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # retention took it, or it is unreadable: the load will say so
    lo, hi = math.floor(node * saved / nodes), math.ceil((node + 1) * saved / nodes)
    files, total = [], 0
    for name in sorted(names):
        m = RANK_FILE_RE.match(name)
        if m and not lo <= int(m.group(1)) < hi and SIDE_MARK not in name:
            continue
        try:
            total += os.path.getsize(os.path.join(path, name))
        except OSError:
            continue
        files.append(name)
    return Plan(step, path, files, total)


def newer_save(root: str, step: int) -> bool:
    """A step folder newer than `step` exists under root: committed, or a save in progress."""
    try:
        names = os.listdir(root)
    except OSError:
        return False
    for name in names:
        m = COMMITTED_RE.match(name)
        digits = m.group(1) if m else name[len(TMP_PREFIX) :] if name.startswith(TMP_PREFIX) else ""
        if digits.isdigit() and int(digits) > step:
            return True
    return False


class NewerSave:
    """stop() for read_files: True once a step newer than `step` appears under root (looked for at most every
    NEWER_POLL_SECONDS, whichever thread asks)."""

    def __init__(self, root: str, step: int):
        self.root, self.step = root, step
        self.found, self.checked = False, 0.0
        self.lock = threading.Lock()

    def __call__(self) -> bool:
        with self.lock:
            now = time.monotonic()
            if not self.found and now - self.checked >= NEWER_POLL_SECONDS:
                self.checked = now
                self.found = newer_save(self.root, self.step)
            return self.found


def read_files(folder: str, names: list[str], threads: int, stop: Callable[[], bool] | None = None) -> int:
    """Read each file once, `threads` at a time, into a buffer per thread that is dropped: the bytes stay in the
    page cache. Returns the bytes read (a file retention deletes meanwhile counts what was read of it). Once
    stop() says so (asked before every chunk), what is left is not read."""
    local = threading.local()

    def read_one(name: str) -> int:
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = bytearray(CHUNK_BYTES)
        done = 0
        try:
            with open(os.path.join(folder, name), "rb", buffering=0) as f:
                while not (stop and stop()) and (n := f.readinto(buf)):
                    done += n
        except OSError:
            pass
        return done

    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="ftjob-read-ahead") as pool:
        return sum(pool.map(read_one, names))


class ReadAhead:
    """Started by the agent when a round forms (round_formed), and for a job of one node also when the launcher
    starts (before_round); one read at a time. A step read in full is not read again."""

    def __init__(self, root: str, threads: int):
        self.root, self.threads = root, threads
        self.thread: threading.Thread | None = None
        self.done: tuple[int, frozenset[str]] | None = None  # (step, files) of the last read that ended whole

    def before_round(self) -> None:
        """A job of one node (the launcher knows from torchrun's --nnodes): read every file from now on."""
        self._start(0, 1, before_round=True)

    def round_formed(self, node: int, nodes: int) -> None:
        self._start(node, nodes, before_round=False)

    def _start(self, node: int, nodes: int, before_round: bool) -> None:
        if self.thread is not None and self.thread.is_alive():
            return  # the same workers will load the same checkpoint (a read begun early stops for a newer one)
        self.thread = threading.Thread(
            target=self._run, args=(node, nodes, before_round), name="ftjob-read-ahead", daemon=True
        )
        self.thread.start()

    def _run(self, node: int, nodes: int, before_round: bool) -> None:
        started = time.monotonic()
        p = plan(self.root, node, nodes)
        if p is None or not p.files or (p.step, frozenset(p.files)) == self.done:
            return
        stop = NewerSave(self.root, p.step) if before_round else None
        if stop is not None and stop():
            return  # a save in progress: the round reads what it commits
        done = read_files(p.path, p.files, self.threads, stop)
        stopped = bool(stop and stop())
        if not stopped:
            self.done = (p.step, frozenset(p.files))
        seconds = time.monotonic() - started
        events.emit(
            contract.EVENT_READ_AHEAD_DONE,
            step=p.step,
            files=len(p.files),
            bytes=done,
            seconds=round(seconds, 4),
            threads=self.threads,
            before_round=before_round,
            stopped=stopped,
        )
        log.info(
            "read ahead step %d%s: %d files, %.2f GB in %.2fs%s",
            p.step,
            " (from the launcher's start)" if before_round else "",
            len(p.files),
            done / 1e9,
            seconds,
            "; stopped: a newer save began" if stopped else "",
        )
