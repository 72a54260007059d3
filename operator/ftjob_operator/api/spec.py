"""`spec`: what a TrainingJob asks for. Every field's description starts with its JSON name (JobSet's habit).

Each sub-object has its module: `workers`, `checkpoint`, `recovery` (preemption, failure policy, rendezvous),
`trainer`, `pods` (scheduling, pod template). This one puts them together and holds the cross-field CEL rules.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from .base import (
    IMAGE_PATTERN,
    MAX_IMAGE_LENGTH,
    MAX_SECONDS,
    Model,
    cel_rules,
    free_object,
    sub_object,
)
from .checkpoint import CheckpointSpec
from .pods import PodTemplateSpec, SchedulingRoles
from .recovery import FailurePolicySpec, PreemptionSpec, RendezvousSpec
from .trainer import TrainerSpec
from .workers import WorkersSpec


class TrainingJobSpec(Model):
    """The desired state of a TrainingJob."""

    image: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_IMAGE_LENGTH,
        pattern=IMAGE_PATTERN,
        description="image is the trainer image (torch, torchrun, ftjob_trainer); unset means the operator's "
        "default trainer image (the chart's trainer.image, env FTJOB_DEFAULT_TRAINER_IMAGE on the operator).",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="imagePullPolicy is the containers' image pull policy."
    )
    command: list[str] | None = Field(
        None,
        description="command is what torchrun launches on every worker: a script path or ['-m', 'module']; "
        "unset means the built-in trainer (-m ftjob_trainer.train).",
        # The CRD refuses [] at the door; the planner's check (checks.py) says the same of a stored one.
        json_schema_extra={"minItems": 1},
    )
    args: list[str] | None = Field(None, description="args are appended after command.")
    # Required, like a Job's template: an empty spec says nothing about the job and is refused at the door.
    workers: WorkersSpec = Field(
        ...,
        description="workers is the elastic worker count (required; `workers: {}` is one worker).",
    )
    processes_per_worker: int = Field(
        1, ge=1, le=64, description="processesPerWorker is ranks per worker pod (torchrun --nproc-per-node)."
    )
    resources: dict[str, Any] | None = free_object(
        "resources are the worker containers' resources (core/v1 ResourceRequirements)."
    )
    coordinator_resources: dict[str, Any] | None = free_object(
        "coordinatorResources are the coordinator container's resources."
    )
    checkpoint: CheckpointSpec = sub_object(
        CheckpointSpec, "checkpoint is storage and cadence of checkpoints."
    )
    preemption: PreemptionSpec = sub_object(PreemptionSpec, "preemption is notice and grace handling.")
    failure_policy: FailurePolicySpec = sub_object(
        FailurePolicySpec, "failurePolicy is the failure budget and backoff."
    )
    rendezvous: RendezvousSpec = sub_object(RendezvousSpec, "rendezvous is torchrun's c10d timing.")
    trainer: TrainerSpec = sub_object(TrainerSpec, "trainer is the built-in trainer's settings.")
    suspend: bool = Field(
        False,
        description="suspend checkpoints, deletes the pods and keeps the job; false again resumes from the checkpoint.",
    )
    ttl_seconds_after_finished: int | None = Field(
        None,
        ge=0,
        le=MAX_SECONDS,
        description="ttlSecondsAfterFinished deletes the job this long after Succeeded or Failed.",
    )
    clean_pod_policy: Literal["All", "None"] = Field(
        "All",
        description="cleanPodPolicy: All deletes finished pods when the job ends; None keeps them (logs).",
    )
    scheduling: SchedulingRoles = sub_object(
        SchedulingRoles, "scheduling is placement of workers and coordinator."
    )
    pod_template: PodTemplateSpec = sub_object(
        PodTemplateSpec, "podTemplate adds labels, env, volumes, security settings."
    )

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "self.failurePolicy.backoffBaseSeconds <= self.failurePolicy.backoffMaxSeconds",
                "spec.failurePolicy.backoffBaseSeconds must be <= backoffMaxSeconds",
            ),
            (
                "!has(self.podTemplate.labels) || self.podTemplate.labels.all(k, !k.startsWith('ftjob.dev/'))",
                "spec.podTemplate.labels must not set ftjob.dev/* labels (the operator owns them)",
            ),
            (
                "!has(self.podTemplate.volumeMounts) || "
                "self.podTemplate.volumeMounts.all(m, !has(m.mountPath) || m.mountPath != self.checkpoint.mountPath)",
                "spec.podTemplate.volumeMounts[].mountPath must differ from spec.checkpoint.mountPath "
                "(the checkpoint volume is mounted there)",
            ),
        )
    )
