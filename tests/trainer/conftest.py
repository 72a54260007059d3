"""Fixtures of the trainer tests (helpers live in trainer_testlib.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_testlib import Procs


@pytest.fixture
def procs(tmp_path: Path):
    p = Procs(tmp_path)
    try:
        yield p
    finally:
        p.cleanup()
