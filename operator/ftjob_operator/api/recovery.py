"""How a job recovers: `spec.preemption` (notice and grace), `spec.failurePolicy` (budget and backoff) and
`spec.rendezvous` (torchrun's c10d timing, which shapes how fast training resumes)."""

from __future__ import annotations

from pydantic import Field, model_validator

from .base import Model


class PreemptionSpec(Model):
    """Preemption handling. torchrun's --shutdown-timeout and the trainer's save deadline derive from the grace period."""

    grace_period_seconds: int = Field(
        30,
        ge=10,
        le=3600,
        description="gracePeriodSeconds is the worker pods' terminationGracePeriodSeconds; torchrun's "
        "--shutdown-timeout and the save deadline (FTJOB_SAVE_DEADLINE_SECONDS) fit inside it.",
    )
    max_preemptions: int | None = Field(
        None,
        ge=0,
        le=1_000_000,
        description="maxPreemptions fails the job after more preemptions than this; unset means unlimited.",
    )
    checkpoint_on_notice: bool = Field(
        True,
        description="checkpointOnNotice asks the coordinator for a checkpoint as soon as a worker's node gets a "
        "termination taint or a worker pod gets DisruptionTarget, before the SIGTERM.",
    )


class FailurePolicySpec(Model):
    """Failures (the trainer exited non-zero on its own, OOM, bad image) restart the job after a backoff."""

    max_failures: int = Field(
        3,
        ge=0,
        le=10000,
        description="maxFailures is how many failures the job survives; one more marks it Failed. "
        "Preemptions never count here.",
    )
    backoff_base_seconds: int = Field(
        10, ge=0, le=3600, description="backoffBaseSeconds is the delay before the first failure restart."
    )
    backoff_max_seconds: int = Field(
        300, ge=0, le=86400, description="backoffMaxSeconds caps the doubling delay between failure restarts."
    )
    jitter: float = Field(
        0.2,
        ge=0,
        le=1,
        description="jitter shortens each delay by up to this fraction, derived from the job uid and failure count.",
    )

    @model_validator(mode="after")
    def _base_below_max(self) -> FailurePolicySpec:
        if self.backoff_base_seconds > self.backoff_max_seconds:
            raise ValueError(
                f"spec.failurePolicy.backoffBaseSeconds ({self.backoff_base_seconds}) must be <= "
                f"backoffMaxSeconds ({self.backoff_max_seconds})"
            )
        return self


class RendezvousSpec(Model):
    """c10d rendezvous timing (torchrun --rdzv-conf); these shape how fast training resumes after a loss."""

    last_call_timeout_seconds: int = Field(
        5,
        ge=1,
        le=3600,
        description="lastCallTimeoutSeconds is how long a round waits for more than min workers before it starts.",
    )
    join_timeout_seconds: int = Field(
        600, ge=10, le=86400, description="joinTimeoutSeconds is how long an agent waits for min workers."
    )
    keep_alive_interval_seconds: int = Field(
        1, ge=1, le=60, description="keepAliveIntervalSeconds is the agents' heartbeat period."
    )
    keep_alive_max_attempts: int = Field(
        2,
        ge=1,
        le=100,
        description="keepAliveMaxAttempts heartbeats may be missed before a silent agent leaves the rendezvous.",
    )
