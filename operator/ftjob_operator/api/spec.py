"""`spec`: what a TrainingJob asks for. Every field's description starts with its JSON name (JobSet's habit)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from .base import (
    IMAGE_PATTERN,
    MAX_IMAGE_LENGTH,
    MAX_SAFE_INT,
    QUANTITY_PATTERN,
    Model,
    cel_rules,
    free_list,
    free_object,
    sub_object,
)
from .reserved import (
    RESERVED_ENV,
    RESERVED_TRAINER_FLAGS,
    RESERVED_VOLUMES,
    SHM_PATH,
    SHM_VOLUME,
)

# The trainer's built-in presets (ftjob_trainer.models.PRESETS; a test keeps the two equal) and `hf:<repo or path>`.
MODEL_PRESETS = ("tiny", "125m", "1b")
MODEL_PATTERN = rf"^({'|'.join(MODEL_PRESETS)}|hf:[^\s].*)$"
# Cardinality bounds of the pass-through lists: the API server bounds the cost of CEL rules by them.
MAX_ENV = 256
MAX_VOLUMES = 64
# Sane maxima for counts and durations (a step count of 1e30 is a typo, not a plan).
MAX_STEPS = 10**12
MAX_SECONDS = 10 * 365 * 86400


def _cel_list(names: frozenset[str] | tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{n}'" for n in sorted(names)) + "]"


def _named_items(
    max_name_length: int,
    *rules: tuple[str, str],
    strings: tuple[str, ...] = (),
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A pass-through list of core/v1 objects with a required `name` and the required string fields `strings`
    (CEL sees only declared properties); the rest of each item passes through unchecked."""
    props = {"name": {"description": "name of the item.", "type": "string", "minLength": 1}}
    props["name"]["maxLength"] = max_name_length
    props |= {
        key: {"description": f"{key} of the item.", "type": "string", "minLength": 1, "maxLength": 4096}
        for key in strings
    }
    item = {
        "type": "object",
        "required": list(props),
        "properties": props,
        "x-kubernetes-preserve-unknown-fields": True,
        **cel_rules(*rules),
    }
    return {"items": item, **(extra or {})}


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


class PersistentVolumeClaimRef(Model):
    """A PVC shared by every worker."""

    claim_name: str = Field(
        ..., min_length=1, description="claimName is the PersistentVolumeClaim in the job's namespace."
    )


class HostPathRef(Model):
    """A directory on the node (single-node clusters, the local cluster, tests)."""

    path: str = Field(
        ...,
        min_length=2,
        pattern=r"^/",
        description="path is the absolute directory on the node that holds the checkpoints.",
    )
    type: Literal["", "DirectoryOrCreate", "Directory"] = Field(
        "DirectoryOrCreate",
        description="type is the hostPath type; DirectoryOrCreate makes the directory if missing.",
    )


class EmptyDirRef(Model):
    """A per-pod scratch directory: survives torchrun restarts inside a pod, not a replaced pod."""

    medium: Literal["", "Memory"] = Field("", description="medium is empty (node disk) or Memory (tmpfs).")
    size_limit: str | None = Field(
        None, pattern=QUANTITY_PATTERN, description="sizeLimit is a quantity such as 10Gi."
    )


class CheckpointVolume(Model):
    """Where checkpoints live: exactly one of persistentVolumeClaim, hostPath, emptyDir."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "(has(self.persistentVolumeClaim) ? 1 : 0) + (has(self.hostPath) ? 1 : 0) + "
                "(has(self.emptyDir) ? 1 : 0) == 1",
                "spec.checkpoint.volume needs exactly one of persistentVolumeClaim, hostPath, emptyDir",
            )
        )
    )

    persistent_volume_claim: PersistentVolumeClaimRef | None = Field(
        None,
        description="persistentVolumeClaim names a claim every worker mounts (ReadWriteMany for several nodes).",
    )
    host_path: HostPathRef | None = Field(None, description="hostPath mounts a node directory.")
    empty_dir: EmptyDirRef | None = Field(
        None,
        description="emptyDir keeps checkpoints only for the pod's lifetime; a replaced worker starts empty.",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> CheckpointVolume:
        chosen = [v for v in (self.persistent_volume_claim, self.host_path, self.empty_dir) if v is not None]
        if len(chosen) != 1:
            raise ValueError(
                "spec.checkpoint.volume needs exactly one of persistentVolumeClaim, hostPath, emptyDir "
                f"(got {len(chosen)})"
            )
        return self


class MemoryTierSpec(Model):
    """The node-local memory tier: every save lands in the worker pod's /dev/shm volume first (seconds), the
    checkpoint volume gets the durable copy in the background, and a worker restarted in the same pod reads its
    own files back from memory."""

    enabled: bool = Field(
        True,
        description="enabled makes every save write to the pod's /dev/shm first (FTJOB_MEMORY_CHECKPOINT_DIR); "
        "a step is reported as lastCheckpoint only once its durable copy is committed.",
    )
    size_limit: str | None = Field(
        None,
        pattern=QUANTITY_PATTERN,
        description="sizeLimit of the worker pods' /dev/shm volume (emptyDir, medium Memory). It counts against "
        "the pod's memory limit; give it 2 x the checkpoint bytes a pod holds at workers.min (model and "
        "optimizer state / workers.min; fp32 AdamW: 12-16 bytes per parameter) plus 1Gi for gloo and "
        "dataloaders. Unset: no limit (the node's memory).",
    )


class CheckpointSpec(Model):
    """Checkpoint storage and cadence (the trainer saves; the operator mounts and asks). The storage is one of
    volume (a folder every worker mounts) and uri (an object store); with neither, an emptyDir volume."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "!(has(self.volume) && has(self.uri))",
                "spec.checkpoint: set volume or uri, not both (neither means an emptyDir volume)",
            ),
            (
                "!has(self.credentialsSecret) || has(self.uri)",
                "spec.checkpoint.credentialsSecret goes with spec.checkpoint.uri",
            ),
        )
    )

    volume: CheckpointVolume | None = Field(
        None,
        description="volume is the storage every worker mounts at mountPath; unset (and no uri) means an emptyDir "
        "(use a persistentVolumeClaim or hostPath so replaced workers can resume).",
    )
    uri: str | None = Field(
        None,
        pattern=r"^[a-z][a-z0-9+.-]*://[^/]+",
        max_length=1024,
        description="uri is an object store URL (s3://bucket/prefix, gs://bucket/prefix, any fsspec URL the image "
        "can open) instead of a volume; the job's checkpoints go to <uri>/<namespace>/<job name>. Commits use a "
        "marker object (no rename). AWS_ENDPOINT_URL in credentialsSecret or podTemplate.env selects an "
        "S3-compatible store (MinIO, Ceph).",
    )
    credentials_secret: str | None = Field(
        None,
        min_length=1,
        max_length=253,
        description="credentialsSecret names a Secret in the job's namespace whose keys become the workers' "
        "environment (envFrom), e.g. AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL. Unset: the "
        "pod's cloud identity (IRSA, EKS Pod Identity, GKE Workload Identity) or podTemplate.env.",
    )
    mount_path: str = Field(
        "/checkpoints",
        min_length=2,
        pattern=r"^/",
        description="mountPath is where the volume is mounted in the worker; the job's checkpoints go to "
        "<mountPath>/<namespace>/<job name> (FTJOB_CHECKPOINT_DIR), so jobs can share one claim.",
    )
    every_steps: int = Field(
        100,
        ge=0,
        le=MAX_STEPS,
        description="everySteps saves a checkpoint every N optimizer steps; 0 saves only on preemption, "
        "request, suspend and at the end.",
    )
    keep_last: int = Field(
        2, ge=1, le=1000, description="keepLast is how many committed checkpoints to keep."
    )
    async_save: bool = Field(
        False, description="asyncSave stages periodic saves to host memory and writes them in the background."
    )
    suspend_timeout_seconds: int = Field(
        60,
        ge=0,
        le=3600,
        description="suspendTimeoutSeconds is how long suspend waits for the requested checkpoint before it "
        "deletes the pods anyway.",
    )
    memory_tier: MemoryTierSpec = Field(
        default_factory=MemoryTierSpec,
        description="memoryTier puts every save in the worker pod's memory first and the durable copy on the "
        "volume in the background (volumes only: ignored with uri).",
        json_schema_extra={"default": {}},
    )

    @model_validator(mode="after")
    def _one_storage(self) -> CheckpointSpec:
        # The same rules as the CEL above, for clients (and servers) that do not evaluate CEL.
        if self.volume is not None and self.uri is not None:
            raise ValueError(
                "spec.checkpoint: set volume or uri, not both (neither means an emptyDir volume)"
            )
        if self.credentials_secret is not None and self.uri is None:
            raise ValueError("spec.checkpoint.credentialsSecret goes with spec.checkpoint.uri")
        return self

    @property
    def storage_volume(self) -> CheckpointVolume | None:
        """The volume workers mount: the one set, an emptyDir when neither volume nor uri is, None with uri."""
        if self.uri is not None:
            return None
        return self.volume or CheckpointVolume(empty_dir=EmptyDirRef())


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


class TrainerSpec(Model):
    """Settings of the built-in trainer (ftjob_trainer.train), passed as FTJOB_* environment."""

    model: str = Field(
        "tiny",
        max_length=4096,
        pattern=MODEL_PATTERN,
        description="model is the built-in preset ("
        + ", ".join(MODEL_PRESETS)
        + ") or hf:PATH, a transformers "
        "causal LM's directory or config.json inside the pod (mount it with podTemplate.volumes; the image needs "
        "ftjob[hf]).",
    )
    steps: int = Field(
        100,
        ge=1,
        le=MAX_STEPS,
        description="steps is the optimizer steps of the whole job (resumes continue to it).",
    )
    global_batch_size: int = Field(
        8, ge=1, le=1 << 24, description="globalBatchSize is samples per optimizer step over all ranks."
    )
    seq_len: int = Field(128, ge=2, le=1 << 24, description="seqLen is tokens per sample.")
    learning_rate: float | None = Field(
        None, gt=0, le=10, description="learningRate is the peak AdamW learning rate."
    )
    seed: int | None = Field(
        None, ge=0, le=MAX_SAFE_INT, description="seed seeds model init and the synthetic data."
    )
    data: str | None = Field(
        None, description="data is 'synthetic' or a path (inside the pod) to a .txt or .bin token file."
    )
    flags: dict[str, str] | None = Field(
        None,
        description='flags sets more trainer flags by name, e.g. {"warmup-steps": "5"} (passed as '
        "FTJOB_WARMUP_STEPS).",
        json_schema_extra={
            "maxProperties": 64,
            **cel_rules(
                (
                    "self.all(k, k.matches('^[a-z][a-z0-9-]*$'))",
                    "spec.trainer.flags keys must look like a flag name without dashes, e.g. warmup-steps",
                ),
                (
                    f"self.all(k, !(k in {_cel_list(RESERVED_TRAINER_FLAGS)}))",
                    "spec.trainer.flags must not set flags derived from spec.checkpoint/preemption: "
                    + ", ".join(sorted(RESERVED_TRAINER_FLAGS)),
                ),
            ),
        },
    )


class SchedulingSpec(Model):
    """Where pods of one role run."""

    node_selector: dict[str, str] | None = Field(None, description="nodeSelector is the pods' nodeSelector.")
    tolerations: list[dict[str, Any]] | None = free_list(
        "tolerations are the pods' tolerations (core/v1 Toleration)."
    )
    affinity: dict[str, Any] | None = free_object("affinity is the pods' affinity (core/v1 Affinity).")
    priority_class_name: str | None = Field(None, description="priorityClassName is the pods' PriorityClass.")


class SchedulingRoles(Model):
    """Scheduling for workers and for the coordinator, separately (e.g. workers on spot, coordinator on-demand)."""

    workers: SchedulingSpec = sub_object(SchedulingSpec, "workers is the scheduling of worker pods.")
    coordinator: SchedulingSpec = sub_object(
        SchedulingSpec, "coordinator is the scheduling of the coordinator pod."
    )


class PodTemplateSpec(Model):
    """The escape hatch: additions to every pod ftjob renders (env and mounts go to workers only)."""

    labels: dict[str, str] | None = Field(
        None,
        description="labels are added to every pod (ftjob.dev/* keys are reserved).",
        json_schema_extra={"maxProperties": 64},
    )
    annotations: dict[str, str] | None = Field(None, description="annotations are added to every pod.")
    env: list[dict[str, Any]] | None = Field(
        None,
        description="env is extra worker environment (core/v1 EnvVar; the names the operator sets are reserved).",
        json_schema_extra=_named_items(
            4096,
            (
                f"!has(self.name) || !(self.name in {_cel_list(RESERVED_ENV)})",
                "spec.podTemplate.env[].name is set by the operator; use another name (reserved: "
                + ", ".join(sorted(RESERVED_ENV))
                + ")",
            ),
            extra={"maxItems": MAX_ENV},
        ),
    )
    volumes: list[dict[str, Any]] | None = Field(
        None,
        description="volumes are extra worker pod volumes (core/v1 Volume; "
        + ", ".join(sorted(RESERVED_VOLUMES))
        + " are ftjob's).",
        json_schema_extra=_named_items(
            63,
            (
                f"!has(self.name) || !(self.name in {_cel_list(RESERVED_VOLUMES)})",
                "spec.podTemplate.volumes[].name is taken by ftjob; rename it (reserved: "
                + ", ".join(sorted(RESERVED_VOLUMES))
                + ")",
            ),
            extra={
                "maxItems": MAX_VOLUMES,
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
            },
        ),
    )
    volume_mounts: list[dict[str, Any]] | None = Field(
        None,
        description=f"volumeMounts are extra worker container mounts (core/v1 VolumeMount; not at {SHM_PATH} "
        "or spec.checkpoint.mountPath).",
        json_schema_extra=_named_items(
            63,
            (
                f"!has(self.mountPath) || self.mountPath != '{SHM_PATH}'",
                f"spec.podTemplate.volumeMounts[].mountPath {SHM_PATH} is ftjob's shared-memory volume "
                f"({SHM_VOLUME}); pick another path",
            ),
            strings=("mountPath",),
            extra={"maxItems": MAX_VOLUMES},
        ),
    )
    security_context: dict[str, Any] | None = free_object(
        "securityContext replaces the containers' default (non-root, no privilege escalation, drop ALL)."
    )
    pod_security_context: dict[str, Any] | None = free_object(
        "podSecurityContext replaces the pods' default (runAsNonRoot, uid/gid/fsGroup 10001 as in the trainer "
        "image, seccomp RuntimeDefault)."
    )
    service_account_name: str | None = Field(
        None, description="serviceAccountName is the pods' service account."
    )
    image_pull_secrets: list[dict[str, Any]] | None = free_list(
        "imagePullSecrets are the pods' pull secrets."
    )


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
    workers: WorkersSpec = sub_object(WorkersSpec, "workers is the elastic worker count.")
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
