"""Where the local cluster keeps things under its state folder (DIR): one place for paths several parts read.

Stdlib only: the bottom layer. The API server serves the same log files (apiserver.server logs_dir).
"""

from __future__ import annotations

from pathlib import Path


def log_path(state_dir: Path, namespace: str, name: str, container: str, previous: bool = False) -> Path:
    """DIR/logs/<namespace>/<pod>/<container>.log, or <container>.previous.log for the run before."""
    return (
        Path(state_dir) / "logs" / namespace / name / (container + (".previous.log" if previous else ".log"))
    )
