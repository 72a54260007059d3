"""A trainer that exits EXIT_CONFIG_ERROR (2) said its configuration is wrong (bad flags, environment, an hf:
path that holds no model): a retry runs the same configuration, so the job fails at once, with the trainer's
message in its Failed condition, spending no backoff and starting no restart. The failure is still counted
(status.failures, status.lastFailure). Only failures reach here: a preemption or a coordinator's collateral
that happens to exit 2 is classified before (losses.py)."""

from __future__ import annotations

from ftjob_trainer import contract

from .. import conditions as cond
from .context import Context, Ending
from .lifecycle import finish
from .losses import Loss


def is_config_error(loss: Loss) -> bool:
    """The container's exit code, or the trainer's own (termination message or error report), is 2."""
    return contract.EXIT_CONFIG_ERROR in (loss.exit_code, loss.trainer_exit_code)


def fail_on_config_error(ctx: Context, loss: Loss, described: str) -> Ending | None:
    """Failed now when the loss is a configuration error; None otherwise (the failure policy decides)."""
    if not is_config_error(loss):
        return None
    return finish(
        ctx,
        Ending.FAILED,
        cond.REASON_CONFIG_ERROR,
        f"{described}; exit code {contract.EXIT_CONFIG_ERROR} means the configuration is wrong and a retry "
        "would fail the same way: fix the spec and create the job again",
    )
