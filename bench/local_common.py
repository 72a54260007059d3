"""What the local-cluster benchmarks share: a cluster for the run, the machine's description, and writing a
section of bench/RESULTS.md (each benchmark owns the text between its two markers)."""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import tempfile
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from ftjob_local.cluster import LocalCluster
from ftjob_local.session import Session

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def machine() -> str:
    model = ""
    with contextlib.suppress(OSError):
        m = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        model = m.group(1).strip() if m else ""
    mem = ""
    with contextlib.suppress(OSError, AttributeError):
        kb = int(re.search(r"^MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text(), re.M).group(1))
        mem = f", {kb / 2**20:.0f} GiB RAM"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        import torch

        torch_version = f", torch {torch.__version__}"
    except ImportError:
        torch_version = ""
    return (
        f"{cores} CPU cores{f' ({model})' if model else ''}{mem}, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}{torch_version}"
    )


def now_utc() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def write_section(key: str, markdown: str, path: Path = RESULTS) -> None:
    """Replace this benchmark's section (between its markers) or append it; other sections stay as they are."""
    start, end = f"<!-- {key}: start -->", f"<!-- {key}: end -->"
    block = f"{start}\n{markdown.strip()}\n{end}"
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    text = (
        pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    )
    path.write_text(text)


@contextlib.contextmanager
def local_cluster(state_dir: Path | None, *, nodes: int = 1, spot_nodes: int = 2) -> Iterator[Session]:
    """A local cluster with the operator and the CRD, torn down on every path (Ctrl-C too)."""
    temporary = state_dir is None
    state = Path(tempfile.mkdtemp(prefix="ftjob-bench-")) if temporary else state_dir
    cluster = LocalCluster(state)
    try:
        cluster.up(nodes=nodes, spot_nodes=spot_nodes, operator=True, say=lambda *_: None)
        if not cluster.alive("operator"):
            raise SystemExit(f"the operator did not start; see {cluster.log_dir / 'operator.log'}")
        session = Session(cluster)
        session.install_crd()
        yield session
    finally:
        cluster.down(say=lambda *_: None)
        if temporary:
            shutil.rmtree(state, ignore_errors=True)
