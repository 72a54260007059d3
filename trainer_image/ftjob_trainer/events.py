"""The trainer's structured events: one JSON line per moment on the log stream (names and fields: contract.py).

People read the log lines; the demo, the benches and the tests read these. Never call emit() from a signal
handler: it takes a lock and writes to a stream (the handler records a time; the loop emits stop_signal).
Torch-free, so that it can stamp the process start before torch is imported.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, TextIO

from ftjob_trainer import contract

_lock = threading.Lock()
_rank: int | None = None  # set_rank's; until then torchrun's RANK, read when an event is written
_stream: TextIO | None = None  # None: sys.stderr at the moment of writing (the log handler's stream)


def process_start_time() -> float:
    """When this process started (unix seconds): from /proc, so it includes the interpreter's start and imports;
    the time of this module's import where /proc is not there."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after "(comm)", which may hold spaces
        ticks = int(fields[19])  # field 22 of stat(5): starttime, clock ticks after boot
        # boot time from /proc/uptime (centiseconds), not /proc/stat's btime (whole seconds: up to 1 s early)
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        boot = time.time() - uptime
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return _IMPORTED_AT


_IMPORTED_AT = time.time()
STARTED_AT = process_start_time()


def _forked() -> None:
    """A process forked from one that imported this module (ftjob_trainer.launch's warm workers) started at the
    fork, not when its parent did."""
    global STARTED_AT, _IMPORTED_AT, _rank
    _IMPORTED_AT = time.time()
    STARTED_AT = process_start_time()
    _rank = None


os.register_at_fork(after_in_child=_forked)


def set_rank(rank: int | None) -> None:
    """The global rank stamped on every later event (once the process group exists)."""
    global _rank
    _rank = rank


def set_stream(stream: TextIO | None) -> None:
    """Where events go (None: sys.stderr, where the log lines go too); tests that run the trainer in-process."""
    global _stream
    _stream = stream


def emit(name: str, **fields: Any) -> dict[str, Any]:
    """Write one event line (time, rank and pid added) and flush it at once: a reader may be waiting on it, and a
    process killed right after must not lose it in a buffer. Returns the event as written."""
    rank = _rank if _rank is not None else _env_rank()
    event = {"time": round(time.time(), 6), "rank": rank, "pid": os.getpid(), **fields}
    line = contract.event_line(name, **event) + "\n"
    with _lock:
        stream = _stream or sys.stderr
        stream.write(line)
        stream.flush()
    return {"event": name, **event}


def _env_rank() -> int | None:
    value = os.environ.get("RANK", "")
    return int(value) if value.isdigit() else None


def since_start() -> float:
    """Seconds since this process started."""
    return time.time() - STARTED_AT
