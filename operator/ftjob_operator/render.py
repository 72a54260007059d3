"""Pure functions that build the manifests of a TrainingJob's children, as docs/INTERFACES.md lists them.

The same manifests serve a real cluster and the local one. Nothing here does I/O or reads the clock.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ftjob_trainer import contract

from . import api, placement

# The volume and env names every pod gets live in api.reserved, where the spec checks refuse them.
from .api.reserved import (
    CHECKPOINT_VOLUME,
    ENV_COORDINATOR_ADDR,
    ENV_DISABLE_SHARED_STORE,
    ENV_MEMORY_CHECKPOINT_DIR,
    SHM_PATH,
    SHM_VOLUME,
)

# --- labels (docs/INTERFACES.md) -------------------------------------------------------------------------------
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_JOB_NAME = "ftjob.dev/job-name"
LABEL_ROLE = "ftjob.dev/role"
LABEL_RESTART_GENERATION = "ftjob.dev/restart-generation"
LABEL_POD_INDEX = "ftjob.dev/pod-index"  # the never-reused number in the pod's name
MANAGED_BY = "ftjob-operator"
ROLE_WORKER = "worker"
ROLE_COORDINATOR = "coordinator"
ANNOTATION_CHECKPOINT_REQUEST = "ftjob.dev/checkpoint-request"

TOKEN_KEY = "token"
WORKER_CONTAINER = "trainer"
COORDINATOR_CONTAINER = "coordinator"
# torchrun restarts its workers after every membership change and preemption save; a failure inside the pod
# ends the agent only once these are spent, so the number is large (the operator's failure budget governs).
TORCHRUN_MAX_RESTARTS = 1_000_000
# torchrun's flags and program, run by ftjob's launcher: torchrun with warm workers (forked from a process that
# imported torch and the trainer already) and an agent that leaves its rendezvous when it is stopped (issue 10;
# ftjob_trainer/launch.py says how, bench/RESULTS.md what it saves).
LAUNCHER = ["python", "-m", "ftjob_trainer.launch"]
MEMORY_CHECKPOINT_DIR = f"{SHM_PATH}/ftjob-checkpoints"  # on the ftjob-dshm volume: one per pod

# The trainer image's user (trainer_image/Dockerfile: USER 10001:10001); fsGroup makes claims writable by it.
TRAINER_UID = 10001
DEFAULT_POD_SECURITY_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": TRAINER_UID,
    "runAsGroup": TRAINER_UID,
    "fsGroup": TRAINER_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}
DEFAULT_CONTAINER_SECURITY_CONTEXT: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "capabilities": {"drop": ["ALL"]},
}


@dataclass(frozen=True)
class JobRef:
    """What children need to know about their TrainingJob."""

    name: str
    namespace: str
    uid: str

    @classmethod
    def from_object(cls, job: dict[str, Any]) -> JobRef:
        meta = job.get("metadata") or {}
        return cls(name=meta["name"], namespace=meta.get("namespace") or "default", uid=meta.get("uid") or "")

    def owner_reference(self) -> dict[str, Any]:
        return {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


# --- derived timing --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Timing:
    """terminationGracePeriodSeconds > torchrun --shutdown-timeout > the trainer's save deadline."""

    grace_period_seconds: int
    shutdown_timeout_seconds: int
    save_deadline_seconds: int


def timing(spec: api.TrainingJobSpec) -> Timing:
    grace = spec.preemption.grace_period_seconds
    # torchrun needs time after its SIGKILL to exit before the kubelet's own SIGKILL; the trainer needs time after
    # the commit to write its termination message and leave the collective.
    shutdown = grace - max(3, grace // 10)
    deadline = shutdown - max(2, grace // 20)
    return Timing(grace, shutdown, deadline)


# --- names and labels ------------------------------------------------------------------------------------------
def secret_name(job: str) -> str:
    return f"{job}-token"


def service_name(job: str) -> str:
    return f"{job}-coordinator"


def worker_name(job: str, index: int) -> str:
    return f"{job}-worker-{index}"


def coordinator_name(job: str, index: int) -> str:
    return f"{job}-coordinator-{index}"


def base_labels(job: str, role: str | None = None) -> dict[str, str]:
    labels = {
        LABEL_NAME: "ftjob",
        LABEL_INSTANCE: job,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_JOB_NAME: job,
    }
    if role:
        labels[LABEL_COMPONENT] = role
        labels[LABEL_ROLE] = role
    return labels


def pod_labels(job: str, role: str, generation: int, index: int) -> dict[str, str]:
    return {**base_labels(job, role), LABEL_RESTART_GENERATION: str(generation), LABEL_POD_INDEX: str(index)}


def worker_selector(job: str) -> str:
    """The scale subresource's label selector (status.selector)."""
    return f"{LABEL_JOB_NAME}={job},{LABEL_ROLE}={ROLE_WORKER}"


def _meta(
    ref: JobRef, name: str, labels: dict[str, str], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ref.namespace,
        "labels": labels,
        "ownerReferences": [ref.owner_reference()],
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


# --- objects ---------------------------------------------------------------------------------------------------
def render_secret(ref: JobRef, token: str) -> dict[str, Any]:
    """The control-API token; `token` comes from the caller (randomness is not the renderer's)."""
    if not token:
        raise ValueError("render_secret needs a non-empty token (generate one with secrets.token_urlsafe)")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(ref, secret_name(ref.name), base_labels(ref.name)),
        "type": "Opaque",
        "stringData": {TOKEN_KEY: token},
    }


def render_service(ref: JobRef) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(ref, service_name(ref.name), base_labels(ref.name, ROLE_COORDINATOR)),
        "spec": {
            "type": "ClusterIP",
            "selector": {LABEL_JOB_NAME: ref.name, LABEL_ROLE: ROLE_COORDINATOR},
            "ports": [
                {
                    "name": "rdzv",
                    "port": contract.RDZV_PORT,
                    "targetPort": contract.RDZV_PORT,
                    "protocol": "TCP",
                },
                {
                    "name": "control",
                    "port": contract.CONTROL_PORT,
                    "targetPort": contract.CONTROL_PORT,
                    "protocol": "TCP",
                },
            ],
            # Workers reach the store before the coordinator reports ready only through retries; not publishing
            # unready endpoints keeps the proxy from routing to a pod that is not listening yet.
            "publishNotReadyAddresses": False,
        },
    }


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _token_env(ref: JobRef) -> dict[str, Any]:
    return {
        "name": contract.ENV_TOKEN,
        "valueFrom": {"secretKeyRef": {"name": secret_name(ref.name), "key": TOKEN_KEY}},
    }


def _scheduling(pod_spec: dict[str, Any], scheduling: api.SchedulingSpec, affinity: dict | None) -> None:
    """The role's spec.scheduling; `affinity` is its affinity with ftjob's terms added (placement.py)."""
    if scheduling.node_selector:
        pod_spec["nodeSelector"] = dict(scheduling.node_selector)
    if scheduling.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in scheduling.tolerations]
    if affinity:
        pod_spec["affinity"] = affinity
    if scheduling.priority_class_name:
        pod_spec["priorityClassName"] = scheduling.priority_class_name


def _pod_common(spec: api.TrainingJobSpec) -> dict[str, Any]:
    template = spec.pod_template
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,  # Service env of the whole namespace is noise for a trainer
        # An explicit {} in the template means "no pod security context", not "the default".
        "securityContext": dict(
            DEFAULT_POD_SECURITY_CONTEXT
            if template.pod_security_context is None
            else template.pod_security_context
        ),
    }
    if template.service_account_name:
        pod_spec["serviceAccountName"] = template.service_account_name
    if template.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [dict(s) for s in template.image_pull_secrets]
    return pod_spec


def _image(spec: api.TrainingJobSpec) -> str:
    if not spec.image:
        # The planner resolves an unset image to the operator's default before rendering.
        raise ValueError(
            "spec.image is unset: resolve it to the operator's default trainer image before rendering"
        )
    return spec.image


def _container_security(spec: api.TrainingJobSpec) -> dict[str, Any]:
    sc = spec.pod_template.security_context
    return dict(DEFAULT_CONTAINER_SECURITY_CONTEXT if sc is None else sc)


def _pod_labels_with_template(spec: api.TrainingJobSpec, labels: dict[str, str]) -> dict[str, str]:
    # The operator's labels win: the pod template cannot move a pod out of its job's selectors.
    return {**(spec.pod_template.labels or {}), **labels}


def render_coordinator_pod(
    ref: JobRef,
    spec: api.TrainingJobSpec,
    *,
    index: int,
    generation: int,
    avoid_nodes: Sequence[str] = (),
    world_epoch: int = 0,
) -> dict[str, Any]:
    """`avoid_nodes`: nodes going away (placement.py), never chosen for this pod. `world_epoch`: the newest trainer
    world a predecessor reported (status.operator.worldEpoch); a replacement coordinator refuses older worlds."""
    pod_spec = _pod_common(spec)
    role = spec.scheduling.coordinator
    _scheduling(pod_spec, role, placement.pod_affinity(role.affinity, avoid_nodes=avoid_nodes))
    container: dict[str, Any] = {
        "name": COORDINATOR_CONTAINER,
        "image": _image(spec),
        "imagePullPolicy": spec.image_pull_policy,
        # args only, no command: the image's entrypoint (tini) stays PID 1 and forwards SIGTERM.
        "args": [
            "python",
            "-m",
            "ftjob_trainer.coordinator",
            "--host=$(POD_IP)",
            f"--store-port={contract.RDZV_PORT}",
            f"--control-port={contract.CONTROL_PORT}",
            *([f"--min-world-epoch={world_epoch}"] if world_epoch else []),
        ],
        "env": [_field_env("POD_IP", "status.podIP"), _token_env(ref)],
        "ports": [
            {"name": "rdzv", "containerPort": contract.RDZV_PORT, "protocol": "TCP"},
            {"name": "control", "containerPort": contract.CONTROL_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": {
            "httpGet": {"path": contract.ROUTE_HEALTH, "port": contract.CONTROL_PORT},
            "periodSeconds": 2,
            "failureThreshold": 3,
        },
        "securityContext": _container_security(spec),
    }
    if spec.coordinator_resources:
        container["resources"] = dict(spec.coordinator_resources)
    pod_spec["containers"] = [container]
    pod_spec["terminationGracePeriodSeconds"] = 10
    labels = _pod_labels_with_template(spec, pod_labels(ref.name, ROLE_COORDINATOR, generation, index))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _meta(ref, coordinator_name(ref.name, index), labels, spec.pod_template.annotations),
        "spec": pod_spec,
    }


def rdzv_id(ref: JobRef, generation: int) -> str:
    """One rendezvous per restart generation: a new generation never waits for (or joins) the old one's agents,
    which may still be saving or reach an old coordinator through the Service; replacements keep the id."""
    return f"{ref.uid}-g{generation}"


def torchrun_args(ref: JobRef, spec: api.TrainingJobSpec, generation: int) -> list[str]:
    """torchrun's flags and the program it launches (the worker container's args: LAUNCHER, then these)."""
    rdzv = spec.rendezvous
    conf = ",".join(
        [
            "is_host=0",  # the store lives in the coordinator pod, never on a worker
            f"last_call_timeout={rdzv.last_call_timeout_seconds}",
            f"join_timeout={rdzv.join_timeout_seconds}",
            f"keep_alive_interval={rdzv.keep_alive_interval_seconds}",
            f"keep_alive_max_attempt={rdzv.keep_alive_max_attempts}",
        ]
    )
    program = list(spec.command) if spec.command else list(api.DEFAULT_TRAINER_COMMAND)
    return [
        f"--nnodes={spec.workers.min}:{spec.workers.max}",
        f"--nproc-per-node={spec.processes_per_worker}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=$({ENV_COORDINATOR_ADDR}):{contract.RDZV_PORT}",
        f"--rdzv-id={rdzv_id(ref, generation)}",
        f"--rdzv-conf={conf}",
        f"--max-restarts={TORCHRUN_MAX_RESTARTS}",
        f"--shutdown-timeout={timing(spec).shutdown_timeout_seconds}",
        "--local-addr=$(POD_IP)",
        *program,
        *(spec.args or []),
    ]


def flag_env(flag: str) -> str:
    """`warmup-steps` or `--warmup-steps` -> FTJOB_WARMUP_STEPS (the trainer reads every flag from FTJOB_*)."""
    return contract.ENV_FLAG_PREFIX + flag.lstrip("-").replace("-", "_").upper()


def trainer_env(spec: api.TrainingJobSpec) -> list[dict[str, Any]]:
    t = spec.trainer
    values: dict[str, Any] = {
        "model": t.model,
        "steps": t.steps,
        "global-batch-size": t.global_batch_size,
        "seq-len": t.seq_len,
        "lr": t.learning_rate,
        "seed": t.seed,
        "data": t.data,
        "async-checkpoint": "true" if spec.checkpoint.async_save else None,
    }
    values.update(t.flags or {})
    return [{"name": flag_env(k), "value": str(v)} for k, v in values.items() if v is not None]


def checkpoint_volume(spec: api.TrainingJobSpec) -> dict[str, Any] | None:
    """The checkpoint volume of the worker pods; None when checkpoints go to an object store (spec.checkpoint.uri)."""
    v = spec.checkpoint.storage_volume
    if v is None:
        return None
    if v.persistent_volume_claim is not None:
        return {
            "name": CHECKPOINT_VOLUME,
            "persistentVolumeClaim": {"claimName": v.persistent_volume_claim.claim_name},
        }
    if v.host_path is not None:
        return {"name": CHECKPOINT_VOLUME, "hostPath": {"path": v.host_path.path, "type": v.host_path.type}}
    empty = v.empty_dir or api.EmptyDirRef()
    return {"name": CHECKPOINT_VOLUME, "emptyDir": empty.to_json()}


def shm_volume(spec: api.TrainingJobSpec) -> dict[str, Any]:
    empty: dict[str, Any] = {"medium": "Memory"}
    if spec.checkpoint.memory_tier.size_limit:
        empty["sizeLimit"] = spec.checkpoint.memory_tier.size_limit
    return {"name": SHM_VOLUME, "emptyDir": empty}


def memory_tier_env(spec: api.TrainingJobSpec) -> list[dict[str, Any]]:
    if not spec.checkpoint.memory_tier.enabled or spec.checkpoint.uri is not None:  # the tier fronts a volume
        return []
    return [{"name": ENV_MEMORY_CHECKPOINT_DIR, "value": MEMORY_CHECKPOINT_DIR}]


def checkpoint_dir(ref: JobRef, spec: api.TrainingJobSpec) -> str:
    """Where this job's checkpoints go: jobs that share a claim, a hostPath or a bucket never see each other's."""
    base = spec.checkpoint.uri or spec.checkpoint.mount_path
    return f"{base.rstrip('/')}/{ref.namespace}/{ref.name}"


def render_worker_pod(
    ref: JobRef,
    spec: api.TrainingJobSpec,
    *,
    index: int,
    generation: int,
    coordinator_ip: str,
    avoid_nodes: Sequence[str] = (),
) -> dict[str, Any]:
    """`avoid_nodes`: nodes going away (placement.py); spec.scheduling.spread keeps the generation's workers apart."""
    if not coordinator_ip:
        raise ValueError("render_worker_pod needs the coordinator Service's clusterIP (wait until it is set)")
    t = timing(spec)
    env: list[dict[str, Any]] = [
        _field_env("POD_IP", "status.podIP"),
        _field_env("POD_NAME", "metadata.name"),
        _field_env("NODE_NAME", "spec.nodeName"),
        {"name": ENV_COORDINATOR_ADDR, "value": coordinator_ip},
        {"name": contract.ENV_COORDINATOR_URL, "value": f"http://{coordinator_ip}:{contract.CONTROL_PORT}"},
        _token_env(ref),
        {"name": contract.ENV_JOB_NAME, "value": ref.name},
        {"name": contract.ENV_NAMESPACE, "value": ref.namespace},
        {"name": "FTJOB_CHECKPOINT_DIR", "value": checkpoint_dir(ref, spec)},
        {"name": "FTJOB_CHECKPOINT_EVERY", "value": str(spec.checkpoint.every_steps)},
        {"name": "FTJOB_KEEP_LAST", "value": str(spec.checkpoint.keep_last)},
        {"name": contract.ENV_SAVE_DEADLINE, "value": str(t.save_deadline_seconds)},
        {"name": ENV_DISABLE_SHARED_STORE, "value": "1"},
        *memory_tier_env(spec),
        *trainer_env(spec),
        *[dict(e) for e in spec.pod_template.env or []],
    ]
    ckpt_volume = checkpoint_volume(spec)
    mounts = [
        *([{"name": CHECKPOINT_VOLUME, "mountPath": spec.checkpoint.mount_path}] if ckpt_volume else []),
        # gloo, dataloaders and the checkpoints' memory tier use shared memory
        {"name": SHM_VOLUME, "mountPath": SHM_PATH},
        *[dict(m) for m in spec.pod_template.volume_mounts or []],
    ]
    container: dict[str, Any] = {
        "name": WORKER_CONTAINER,
        "image": _image(spec),
        "imagePullPolicy": spec.image_pull_policy,
        # args only, no command: the image's entrypoint (tini) stays PID 1 and forwards SIGTERM to the launcher.
        "args": [*LAUNCHER, *torchrun_args(ref, spec, generation)],
        "env": env,
        "volumeMounts": mounts,
        "terminationMessagePath": contract.DEFAULT_TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": _container_security(spec),
    }
    if spec.checkpoint.credentials_secret:
        # the object store's credentials (and endpoint), under the names the cloud SDKs read
        container["envFrom"] = [{"secretRef": {"name": spec.checkpoint.credentials_secret}}]
    if spec.resources:
        container["resources"] = dict(spec.resources)
    pod_spec = _pod_common(spec)
    role = spec.scheduling.workers
    peers = {LABEL_JOB_NAME: ref.name, LABEL_ROLE: ROLE_WORKER, LABEL_RESTART_GENERATION: str(generation)}
    affinity = placement.pod_affinity(
        role.affinity, spread=spec.scheduling.spread, selector=peers, avoid_nodes=avoid_nodes
    )
    _scheduling(pod_spec, role, affinity)
    pod_spec["terminationGracePeriodSeconds"] = t.grace_period_seconds
    pod_spec["containers"] = [container]
    pod_spec["volumes"] = [
        *([ckpt_volume] if ckpt_volume else []),
        shm_volume(spec),
        *[dict(v) for v in spec.pod_template.volumes or []],
    ]
    labels = _pod_labels_with_template(spec, pod_labels(ref.name, ROLE_WORKER, generation, index))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _meta(ref, worker_name(ref.name, index), labels, spec.pod_template.annotations),
        "spec": pod_spec,
    }


def template_hash(ref: JobRef, spec: api.TrainingJobSpec) -> str:
    """A digest of what running pods were rendered from (a change means recreating them): only what lands in the
    pods (not replicas, suspend, TTL or the failure policy), with the per-pod parts (name, index, generation,
    the coordinator's address) held fixed."""
    worker = render_worker_pod(ref, spec, index=0, generation=0, coordinator_ip="0.0.0.0")
    coordinator = render_coordinator_pod(ref, spec, index=0, generation=0)
    parts = [worker["spec"], worker["metadata"], coordinator["spec"]]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
