"""`spec.workers`: the elastic worker count (torchrun --nnodes=MIN:MAX), the scale subresource's replicas and
the warm spares."""

from __future__ import annotations

from pydantic import ConfigDict, Field, model_validator

from .base import Model, cel_rules


class WorkersSpec(Model):
    """How many worker pods (torchrun agents, one per node) the job runs."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            ("self.min <= self.max", "spec.workers.min must be <= spec.workers.max"),
            (
                "!has(self.replicas) || (self.replicas >= self.min && self.replicas <= self.max)",
                "spec.workers.replicas must be within spec.workers.min..spec.workers.max",
            ),
        )
    )

    min: int = Field(
        1,
        ge=1,
        le=1024,
        description="min is the fewest workers training runs with (torchrun --nnodes=MIN:MAX); "
        "losing workers below it pauses training until replacements join.",
    )
    max: int = Field(
        1,
        ge=1,
        le=1024,
        description="max is the most workers training uses; equal to min for a fixed-size job.",
    )
    replicas: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="replicas is the desired worker count inside min..max, moved by `kubectl scale tj` and HPAs "
        "through the scale subresource; unset means max.",
    )
    spares: int = Field(
        0,
        ge=0,
        le=16,
        description="spares is how many warm spare worker pods run beyond max: each has started its agent and "
        "imported torch and the trainer, and waits in the rendezvous (c10d keeps agents beyond max on its "
        "redundancy list), so a lost worker's place is taken without starting a pod; the operator then starts a "
        "new spare. Only while the desired count is max (below it a spare would join training). Each holds a "
        "node: give workers one node each (resources or anti-affinity) so a spare is not lost with a worker.",
    )

    @model_validator(mode="after")
    def _within_bounds(self) -> WorkersSpec:
        # The same rules as the CEL above, for clients (and servers) that do not evaluate CEL.
        if self.min > self.max:
            raise ValueError(f"spec.workers.min ({self.min}) must be <= spec.workers.max ({self.max})")
        if self.replicas is not None and not self.min <= self.replicas <= self.max:
            raise ValueError(
                f"spec.workers.replicas ({self.replicas}) must be within min..max ({self.min}..{self.max})"
            )
        return self

    @property
    def desired(self) -> int:
        return self.max if self.replicas is None else self.replicas

    @property
    def pods(self) -> int:
        """Worker pods the operator keeps: the desired count, and the spares while that count is max."""
        return self.desired + (self.spares if self.desired == self.max else 0)
