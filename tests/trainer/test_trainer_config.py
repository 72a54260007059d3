"""Trainer flags: every flag has an FTJOB_* twin (flag wins), bad values get fix-it errors, the surface is pinned."""

from __future__ import annotations

import subprocess
import sys

import pytest
from ftjob_trainer import contract
from ftjob_trainer.config import ConfigError, all_flags, parse_args

# The public surface (issue 3 + INTERFACES.md). Changing it is an interface change: update the operator too.
EXPECTED_FLAGS = {
    "--model", "--model-factory", "--compile", "--activation-checkpointing",
    "--data", "--data-factory", "--seq-len", "--global-batch-size", "--grad-accum", "--seed",
    "--lr", "--min-lr-ratio", "--warmup-steps", "--weight-decay", "--grad-clip",
    "--checkpoint-dir", "--checkpoint-every", "--keep-last", "--async-checkpoint", "--save-deadline-seconds",
    "--checkpoint-write-threads", "--checkpoint-read-threads", "--memory-checkpoint-dir", "--compile-cache",
    "--cpu-offload", "--param-offload",
    "--stop-signals", "--peer-stop-signals", "--termination-log", "--coordinator-url", "--poll-interval", "--progress-every",
    "--steps", "--report", "--log-every", "--hash-on-load",
}  # fmt: skip


def test_flag_surface_and_env_names():
    flags = all_flags()
    assert set(flags) == EXPECTED_FLAGS
    assert all(env == "FTJOB_" + f[2:].replace("-", "_").upper() for f, env in flags.items())
    # the names the operator sets on worker pods (INTERFACES.md) are flags' env twins
    for env in (
        "FTJOB_CHECKPOINT_DIR",
        "FTJOB_CHECKPOINT_EVERY",
        "FTJOB_KEEP_LAST",
        contract.ENV_SAVE_DEADLINE,
        contract.ENV_COORDINATOR_URL,
        contract.ENV_TERMINATION_LOG,
    ):
        assert env in flags.values()


def test_env_then_flag_precedence_and_types():
    env = {
        "FTJOB_STEPS": "7",
        "FTJOB_ASYNC_CHECKPOINT": "true",
        "FTJOB_CHECKPOINT_DIR": "/ck",
        "FTJOB_SAVE_DEADLINE_SECONDS": "12.5",
        "FTJOB_LR": "1e-3",
    }
    cfg = parse_args(["--steps", "9", "--no-async-checkpoint"], env=env)
    assert cfg.run.steps == 9 and cfg.checkpoint.async_checkpoint is False  # the flag wins
    assert cfg.checkpoint.checkpoint_dir == "/ck" and cfg.checkpoint.save_deadline_seconds == 12.5
    assert cfg.optimizer.lr == 1e-3
    assert parse_args([], env={}).preemption.termination_log == contract.DEFAULT_TERMINATION_LOG


@pytest.mark.parametrize(
    ("argv", "env", "says"),
    [
        (["--model", "7b"], {}, "--model-factory"),
        (["--keep-last", "0"], {}, "keep at least 1"),
        (["--global-batch-size", "6", "--grad-accum", "4"], {}, "not divisible"),
        (["--cpu-offload", "--param-offload"], {}, "pick one"),
        (["--checkpoint-every", "5"], {}, "--checkpoint-dir"),
        ([], {"FTJOB_ASYNC_CHECKPOINT": "maybe"}, "FTJOB_ASYNC_CHECKPOINT='maybe': expected one of"),
        ([], {"FTJOB_STEPS": "ten"}, "expected an integer"),
        (["--stop-signals", "SIGFOO"], {}, "subset of"),
        (["--data", "/no/such/file"], {}, "no such file"),
        (["--model-factory", "nocolon"], {}, "module:function"),
    ],
)
def test_bad_config_says_what_to_fix(argv, env, says):
    with pytest.raises(ConfigError, match=None) as e:
        parse_args(argv, env=env)
    assert says in str(e.value)


def test_world_size_divisibility_is_checked_with_a_fix():
    cfg = parse_args(["--global-batch-size", "6"], env={})
    with pytest.raises(ConfigError, match="multiple of every world size"):
        cfg.data.check_world_size(4)


def test_bad_flags_exit_with_the_config_code():
    p = subprocess.run(
        [sys.executable, "-m", "ftjob_trainer.train", "--keep-last", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == contract.EXIT_CONFIG_ERROR and "keep at least 1" in p.stderr
