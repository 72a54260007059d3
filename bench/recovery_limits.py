"""The machine's limits for a checkpoint load, measured in the same run as bench/recovery_gpu.py's recoveries:
the checkpoint medium's write (fsync) and cold-read bandwidth, one stream and in parallel, with the page cache
dropped before each read, and /dev/shm's (memory) write and read bandwidth; and what a fresh launcher's forkserver
imports, step by step, in fresh interpreters (the floor of a replacement that starts after the old pod ended).
Stdlib only (the imports run in child interpreters).

The page cache is dropped with `echo 3 > /proc/sys/vm/drop_caches` when that works (root, a writable /proc);
otherwise each probe file is evicted with posix_fadvise(DONTNEED) (allowed: the files are fsynced). The method
used is part of the result.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BLOCK = 16 << 20  # bytes per write/read call


def drop_page_cache(files: list[Path]) -> str:
    """Evict the files' pages; returns the method that worked: "drop_caches" or "fadvise"."""
    os.sync()
    with contextlib.suppress(OSError):
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "drop_caches"
    evict(files)
    return "fadvise"


def evict(files: list[Path]) -> None:
    """Ask the kernel to drop the files' clean pages (no sync: a page still dirty stays until written back)."""
    for f in files:
        with contextlib.suppress(OSError):  # a file renamed or removed in the meantime
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def checkpoint_files(root: Path) -> list[Path]:
    return [p for p in Path(root).rglob("*") if p.is_file()]


def _write(path: Path, size: int, block: bytes) -> int:
    written = 0
    with open(path, "wb") as f:
        while written < size:
            written += f.write(block[: min(len(block), size - written)])
        f.flush()
        os.fsync(f.fileno())
    return written


def _read(path: Path) -> int:
    buf = bytearray(BLOCK)
    view, total = memoryview(buf), 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while n := os.readv(fd, [view]):
            total += n
    finally:
        os.close(fd)
    return total


def _parallel(fn, jobs: list[tuple], threads: int) -> tuple[int, float]:
    """(bytes, seconds) of fn over jobs in `threads` threads."""
    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(lambda job: fn(*job), jobs))
    return total, time.perf_counter() - t


def _gbps(nbytes: int, seconds: float) -> float:
    return round(nbytes / seconds / 1e9, 4) if seconds > 0 else 0.0


def mount_of(path: Path) -> dict:
    """The mount point and file system type that hold path (from /proc/mounts; empty where unknown)."""
    best = {"mount": "", "fstype": ""}
    with contextlib.suppress(OSError):
        real = str(Path(path).resolve())
        for line in Path("/proc/mounts").read_text().splitlines():
            _, mnt, fstype, *_ = line.split()
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best["mount"]):
                best = {"mount": mnt, "fstype": fstype}
    return best


def medium(root: Path, size_mb: int, threads: int) -> dict:
    """Write `threads` files of size_mb/threads MiB with fsync in parallel, then read them cold: in parallel, and
    one of them in one stream. The files are removed afterwards."""
    root.mkdir(parents=True, exist_ok=True)
    per = max(1, size_mb // threads) << 20
    files = [root / f"probe-{i}.bin" for i in range(threads)]
    block = os.urandom(BLOCK)
    try:
        wrote, write_s = _parallel(_write, [(f, per, block) for f in files], threads)
        method = drop_page_cache(files)
        read, read_s = _parallel(_read, [(f,) for f in files], threads)
        drop_page_cache(files)
        t = time.perf_counter()
        one = _read(files[0])
        one_s = time.perf_counter() - t
    finally:
        for f in files:
            f.unlink(missing_ok=True)
    return {
        "path": str(root),
        **mount_of(root),
        "bytes": wrote,
        "threads": threads,
        "write_fsync_parallel_gbps": _gbps(wrote, write_s),
        "cold_read_parallel_gbps": _gbps(read, read_s),
        "cold_read_one_stream_gbps": _gbps(one, one_s),
        "cache_drop": method,
    }


def shm(size_mb: int, threads: int, root: Path = Path("/dev/shm")) -> dict:
    """/dev/shm: one stream written, then read in one stream and in parallel (a quarter of its free space at
    most). Files removed afterwards."""
    if not root.is_dir():
        return {"error": f"{root} does not exist"}
    free = shutil.disk_usage(root).free
    size = min(size_mb << 20, free // 4) // threads * threads
    if size < threads:
        return {"error": f"{root} has {free} bytes free"}
    d = root / f"ftjob-bench-{os.getpid()}"
    d.mkdir()
    files = [d / f"probe-{i}.bin" for i in range(threads)]
    block = os.urandom(BLOCK)
    try:
        t = time.perf_counter()
        wrote = sum(_write(f, size // threads, block) for f in files)
        write_s = time.perf_counter() - t
        t = time.perf_counter()
        one = sum(_read(f) for f in files)
        one_s = time.perf_counter() - t
        read, read_s = _parallel(_read, [(f,) for f in files], threads)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return {
        "path": str(root),
        "bytes": wrote,
        "threads": threads,
        "write_one_stream_gbps": _gbps(wrote, write_s),
        "read_one_stream_gbps": _gbps(one, one_s),
        "read_parallel_gbps": _gbps(read, read_s),
    }


# The built-in trainer's forkserver imports (ftjob_trainer.launch.builtin_trainer_imports, the one list), each step
# after the ones before it; then whether torch's modules came from compiled bytecode (an install without .pyc
# compiles every module in each new interpreter).
IMPORT_STEPS = """
import importlib, importlib.util, json, os, sys, time
from ftjob_trainer import launch
out = {}
for module in launch.builtin_trainer_imports():
    t = time.perf_counter()
    importlib.import_module(module)
    out[module] = round(time.perf_counter() - t, 4)
out["bytecode_cached"] = os.path.exists(importlib.util.cache_from_source(sys.modules["torch._dynamo"].__file__))
print(json.dumps(out))
"""


def imports(tries: int = 2) -> dict:
    """Seconds of each step of the forkserver's imports (IMPORT_STEPS), each try in a fresh interpreter, and whether
    torch's bytecode is cached; an error says what failed."""
    runs = []
    for _ in range(tries):
        step = _import_steps()
        if "error" in step:
            return step
        runs.append(step)
    return {"tries": runs}


def _import_steps() -> dict:
    """IMPORT_STEPS in a fresh interpreter: its output with the interpreter's seconds, or the error's last line."""
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", IMPORT_STEPS], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1:]
        return {"error": last[0] if last else f"exit {done.returncode}"}
    return json.loads(done.stdout) | {"interpreter_s": round(time.perf_counter() - t, 4)}


def cache_bytecode(prefix: Path) -> dict:
    """From now on every process this one starts reads and writes compiled bytecode under prefix, as in an image
    built with its .pyc; the forkserver's imports are compiled now (the rest at their first import, by the first
    launcher of each phase). Returns the seconds that took, or an error."""
    os.environ["PYTHONPYCACHEPREFIX"] = str(prefix)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    step = _import_steps()
    if "error" in step:
        return {"prefix": str(prefix), "error": step["error"]}
    return {"prefix": str(prefix), "compile_s": round(step["interpreter_s"], 2)}


def evict_until(ckpt: Path, done: threading.Event, every_s: float = 0.1) -> None:
    """Evicts the checkpoint's files from the page cache every every_s until done: a new node reads them cold."""
    while not done.wait(every_s):
        with contextlib.suppress(OSError):  # a folder renamed (the commit) while it is walked
            evict(checkpoint_files(ckpt))
