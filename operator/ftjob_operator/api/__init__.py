"""The `ftjob.dev/v1alpha1` `TrainingJob` API: pydantic models that are the single source of truth.

`crd.py` generates the CRD's openAPIV3Schema from these models; the planner parses a job's spec and status with
them. Every field's description starts with its JSON name (JobSet's habit). Kubernetes sub-objects that ftjob only
passes through (resources, tolerations, affinity, env, volumes, securityContext) stay free-form objects, marked
with `x-kubernetes-preserve-unknown-fields`; what ftjob itself reads is modelled and validated here.

The package by concern: `base` (names, base models, schema helpers), `reserved` (what ftjob sets in every pod),
the spec's sub-objects (`workers`, `checkpoint`, `recovery`: preemption, failure policy and rendezvous, `trainer`,
`spread`: spec.scheduling.spread, `pods`: scheduling and pod template), `spec` (the whole spec), `status`, `job` (the whole object, parsers) and
`checks` (what the schema cannot express). Import from here.
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
from .checkpoint import (
    CheckpointSpec,
    CheckpointVolume,
    EmptyDirRef,
    HostPathRef,
    MemoryTierSpec,
    PersistentVolumeClaimRef,
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
from .pods import PodTemplateSpec, SchedulingRoles, SchedulingSpec
from .recovery import FailurePolicySpec, PreemptionSpec, RendezvousSpec
from .spec import TrainingJobSpec
from .spread import SPREAD_MODES, SPREAD_NONE, SPREAD_PREFERRED, SPREAD_REQUIRED, Spread
from .status import (
    CONDITION_TYPES,
    FINISHED_PHASES,
    LEGACY_BOOKKEEPING,
    LEGACY_DESCRIPTION,
    PHASES,
    CheckpointFailureStatus,
    CheckpointStatus,
    Condition,
    ConditionType,
    FailureStatus,
    InterruptionStatus,
    LostStatus,
    LostTime,
    OperatorStatus,
    Phase,
    ProgressStatus,
    TrainerRunStatus,
    TrainingJobStatus,
    WorkersStatus,
    has_legacy_bookkeeping,
    with_legacy_bookkeeping,
)
from .trainer import TrainerSpec
from .workers import WorkersSpec

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
    "LEGACY_BOOKKEEPING",
    "LEGACY_DESCRIPTION",
    "LIST_KIND",
    "MAX_JOB_NAME_LENGTH",
    "PHASES",
    "PLURAL",
    "PRESERVE",
    "SHORT_NAMES",
    "SPREAD_MODES",
    "SPREAD_NONE",
    "SPREAD_PREFERRED",
    "SPREAD_REQUIRED",
    "SINGULAR",
    "SPEC_REPLICAS_PATH",
    "STATUS_REPLICAS_PATH",
    "VERSION",
    "CheckpointSpec",
    "CheckpointFailureStatus",
    "CheckpointStatus",
    "CheckpointVolume",
    "Condition",
    "ConditionType",
    "EmptyDirRef",
    "FailurePolicySpec",
    "FailureStatus",
    "HostPathRef",
    "InterruptionStatus",
    "LostStatus",
    "LostTime",
    "MemoryTierSpec",
    "OperatorStatus",
    "PersistentVolumeClaimRef",
    "Phase",
    "PodTemplateSpec",
    "ProgressStatus",
    "PreemptionSpec",
    "RendezvousSpec",
    "SchedulingRoles",
    "SchedulingSpec",
    "Spread",
    "TrainerRunStatus",
    "TrainerSpec",
    "TrainingJob",
    "TrainingJobSpec",
    "TrainingJobStatus",
    "WorkersSpec",
    "WorkersStatus",
    "has_legacy_bookkeeping",
    "parse_spec",
    "parse_status",
    "spec_problems",
    "validation_problems",
    "with_legacy_bookkeeping",
]
