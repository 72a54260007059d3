"""The `ftjob.dev/v1alpha1` `TrainingJob` API: pydantic models that are the single source of truth.

`crd.py` generates the CRD's openAPIV3Schema from these models; the planner parses a job's spec and status with
them. Every field's description starts with its JSON name (JobSet's habit). Kubernetes sub-objects that ftjob only
passes through (resources, tolerations, affinity, env, volumes, securityContext) stay free-form objects, marked
with `x-kubernetes-preserve-unknown-fields`; what ftjob itself reads is modelled and validated here.

The package by concern: `base` (names, base models), `spec`, `status`, `job` (the whole object, parsers),
`reserved` (what ftjob sets in every pod) and `checks` (what the schema cannot express). Import from here.
"""

from .base import (
    API_VERSION,
    DEFAULT_TRAINER_COMMAND,
    FREE_OBJECT,
    GROUP,
    JOB_NAME_PATTERN,
    KIND,
    LIST_KIND,
    MAX_JOB_NAME_LENGTH,
    PLURAL,
    PRESERVE,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
)
from .checks import spec_problems, validation_problems
from .job import (
    LABEL_SELECTOR_PATH,
    SPEC_REPLICAS_PATH,
    STATUS_REPLICAS_PATH,
    TrainingJob,
    parse_spec,
    parse_status,
)
from .spec import (
    CheckpointSpec,
    CheckpointVolume,
    EmptyDirRef,
    FailurePolicySpec,
    HostPathRef,
    MemoryTierSpec,
    PersistentVolumeClaimRef,
    PodTemplateSpec,
    PreemptionSpec,
    RendezvousSpec,
    SchedulingRoles,
    SchedulingSpec,
    TrainerSpec,
    TrainingJobSpec,
    WorkersSpec,
)
from .status import (
    CONDITION_TYPES,
    FINISHED_PHASES,
    PHASES,
    CheckpointStatus,
    Condition,
    ConditionType,
    FailureStatus,
    Phase,
    TrainingJobStatus,
    WorkersStatus,
)

__all__ = [
    "API_VERSION",
    "CONDITION_TYPES",
    "DEFAULT_TRAINER_COMMAND",
    "FINISHED_PHASES",
    "FREE_OBJECT",
    "GROUP",
    "JOB_NAME_PATTERN",
    "KIND",
    "LABEL_SELECTOR_PATH",
    "LIST_KIND",
    "MAX_JOB_NAME_LENGTH",
    "PHASES",
    "PLURAL",
    "PRESERVE",
    "SHORT_NAMES",
    "SINGULAR",
    "SPEC_REPLICAS_PATH",
    "STATUS_REPLICAS_PATH",
    "VERSION",
    "CheckpointSpec",
    "CheckpointStatus",
    "CheckpointVolume",
    "Condition",
    "ConditionType",
    "EmptyDirRef",
    "FailurePolicySpec",
    "FailureStatus",
    "HostPathRef",
    "MemoryTierSpec",
    "PersistentVolumeClaimRef",
    "Phase",
    "PodTemplateSpec",
    "PreemptionSpec",
    "RendezvousSpec",
    "SchedulingRoles",
    "SchedulingSpec",
    "TrainerSpec",
    "TrainingJob",
    "TrainingJobSpec",
    "TrainingJobStatus",
    "WorkersSpec",
    "WorkersStatus",
    "parse_spec",
    "parse_status",
    "spec_problems",
    "validation_problems",
]
