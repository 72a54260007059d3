"""What the pods get beyond what ftjob renders: `spec.scheduling` (placement per role) and `spec.podTemplate`
(labels, env, volumes, mounts, security settings), with the reserved names refused by CEL rules."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from .base import Model, cel_list, cel_rules, free_list, free_object, sub_object
from .reserved import RESERVED_ENV, RESERVED_VOLUMES, SHM_PATH, SHM_VOLUME
from .spread import Spread, spread_field

# Cardinality bounds of the pass-through lists: the API server bounds the cost of CEL rules by them.
MAX_ENV = 256
MAX_VOLUMES = 64


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
    spread: Spread = spread_field()


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
                f"!has(self.name) || !(self.name in {cel_list(RESERVED_ENV)})",
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
                f"!has(self.name) || !(self.name in {cel_list(RESERVED_VOLUMES)})",
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
