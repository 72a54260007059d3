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


@pytest.fixture
def world_of_one():
    """An in-process gloo world of one: the real engine and checkpointer without torchrun."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def captured_events():
    """The structured events this process emits (in-process tests), as a function returning them so far."""
    import io

    from ftjob_trainer import contract, events

    stream = io.StringIO()
    events.set_stream(stream)
    try:
        yield lambda: contract.parse_events(stream.getvalue().splitlines())
    finally:
        events.set_stream(None)
