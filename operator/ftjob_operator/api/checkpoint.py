"""`spec.checkpoint`: where checkpoints live (a volume or an object store), how often they are taken, how many
are kept, and the node-local memory tier."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from .base import MAX_STEPS, QUANTITY_PATTERN, Model, cel_rules


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
