"""Retention off the save's critical path: victims leave the committed set by a rename at once and are deleted in
the background; a deletion cut short by an exit is finished by the next start. Real checkpointer, world of one."""

from __future__ import annotations

import os

from engine_testlib import tiny_engine
from ftjob_trainer.checkpoint import Checkpointer
from ftjob_trainer.checkpoint_layout import TRASH_PREFIX, list_committed


def test_retention_renames_then_deletes_and_a_restart_finishes_cut_deletions(world_of_one, tmp_path):
    engine = tiny_engine(10)
    ckpt = Checkpointer(str(tmp_path), keep_last=2, engine=engine, rank=0, world_size=1)
    for step in (1, 2, 3, 4):
        path = ckpt.save(step, {})
        # right after each save returns, only committed directories count, and never more than keep_last
        assert [s for s, _ in list_committed(str(tmp_path))] == [step, step - 1][: min(step, 2)]
        assert path.endswith(f"step-{step:09d}")
    ckpt.close(wait_for_retention=True)
    assert sorted(os.listdir(tmp_path)) == ["step-000000003", "step-000000004"]

    cut = tmp_path / f"{TRASH_PREFIX}000000002"  # an exit cut this deletion short
    cut.mkdir()
    (cut / "__0_0.distcp").write_bytes(b"x" * 100)
    Checkpointer(str(tmp_path), keep_last=2, engine=engine, rank=0, world_size=1).close()
    assert sorted(os.listdir(tmp_path)) == ["step-000000003", "step-000000004"]
