"""A real filesystem that fills up: a tmpfs of a given size mounted on a folder. Mounting needs root
(CAP_SYS_ADMIN), which CI has; elsewhere the test is skipped with the reason."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_tmpfs(folder: Path, size: str) -> Iterator[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def grow(folder: Path, size: str) -> None:
    """Room again: the same tmpfs, larger (its files stay)."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(folder)], check=True)
