"""examples/custom_model.py runs as documented; data sources; the stream does not depend on the world size."""

from __future__ import annotations

import pytest
import torch
from ftjob_trainer.config import ConfigError, DataConfig
from ftjob_trainer.data import GlobalBatches, SyntheticSource, TokenFileSource
from trainer_testlib import finish, log_of, read_json


@pytest.mark.slow
def test_custom_model_example_trains_checkpoints_and_resumes(procs, tmp_path):
    ckpt = tmp_path / "ckpt"
    args = [
        "--model-factory",
        "examples.custom_model:make_model",
        "--data-factory",
        "examples.custom_model:make_data",
        "--seq-len",
        "32",
        "--global-batch-size",
        "4",
        "--checkpoint-dir",
        str(ckpt),
        "--log-every",
        "5",
    ]
    for steps, name in ((10, "a"), (20, "b")):
        p = procs.torchrun(
            [*args, "--steps", str(steps), "--report", str(tmp_path / f"{name}.json")],
            name=name,
            env={"FTJOB_TERMINATION_LOG": str(tmp_path / f"{name}.term")},
        )
        assert finish(p) == 0, log_of(p)[-3000:]
    a, b = read_json(tmp_path / "a.json"), read_json(tmp_path / "b.json")
    assert b["resumed_from_step"] == 10 and b["step"] == 20
    assert b["loss"] < a["loss"]  # it learns the counting sequences


def concat_step(source, cfg, world_size, step):
    return torch.cat(
        [
            torch.cat([x for x, _ in GlobalBatches(source, cfg, r, world_size).micro_batches(step)])
            for r in range(world_size)
        ]
    )


def test_global_stream_is_the_same_at_any_world_size():
    cfg = DataConfig(seq_len=16, global_batch_size=8, grad_accum=2)
    src = SyntheticSource(16, 1000, seed=3)
    for step in (0, 5):
        one = concat_step(src, cfg, 1, step)
        assert torch.equal(one, concat_step(src, cfg, 2, step)) and torch.equal(
            one, concat_step(src, cfg, 4, step)
        )
    assert not torch.equal(concat_step(src, cfg, 1, 0), concat_step(src, cfg, 1, 1))
    resumed = GlobalBatches(src, cfg, 0, 1, base_step=5, base_cursor=40)
    assert resumed.cursor(6) == 48 and torch.equal(
        resumed.micro_batches(5)[0][0], concat_step(src, cfg, 1, 5)[:4]
    )


def test_token_and_text_files(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("hello world, " * 20)
    src = TokenFileSource(str(text), seq_len=8, vocab_size=256)
    assert bytes(src[0].tolist()) == b"hello wor"
    tokens = tmp_path / "t.bin"
    tokens.write_bytes(torch.arange(100, dtype=torch.int16).numpy().tobytes())
    assert TokenFileSource(str(tokens), seq_len=4, vocab_size=128)[1].tolist() == [4, 5, 6, 7, 8]
    with pytest.raises(ConfigError, match="does not fit the model's vocabulary"):
        TokenFileSource(str(tokens), seq_len=4, vocab_size=50)
