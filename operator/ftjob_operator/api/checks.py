"""Spec checks the schema cannot express (cross-field, reserved names), and validation errors as fix-it lines.

The planner runs both on every pass: a spec that fails either is InvalidSpec, with every line in the message.
"""

from __future__ import annotations

import re

from pydantic import ValidationError

from .base import JOB_NAME_PATTERN, MAX_JOB_NAME_LENGTH
from .reserved import (
    CHECKPOINT_VOLUME,
    RESERVED_ENV,
    RESERVED_TRAINER_FLAGS,
    RESERVED_VOLUMES,
    SHM_PATH,
    SHM_VOLUME,
)
from .spec import TrainingJobSpec

_FLAG_RE = re.compile(r"^[a-z][a-z0-9-]*$")


def spec_problems(name: str, spec: TrainingJobSpec) -> list[str]:
    """What to fix, one line each; empty when the spec is usable."""
    problems: list[str] = []
    if len(name) > MAX_JOB_NAME_LENGTH or not re.match(JOB_NAME_PATTERN, name):
        problems.append(
            f"metadata.name {name!r} must be a DNS-1035 label of at most {MAX_JOB_NAME_LENGTH} characters "
            "(it names the Service <name>-coordinator)"
        )
    if spec.command is not None and not spec.command:
        problems.append(
            "spec.command is empty: remove it for the built-in trainer or name a script or ['-m', 'module']"
        )
    tpl = spec.pod_template
    for i, env in enumerate(tpl.env or []):
        n = env.get("name")
        if not isinstance(n, str) or not n:
            problems.append(f"spec.podTemplate.env[{i}] needs a name")
        elif n in RESERVED_ENV:
            problems.append(f"spec.podTemplate.env[{i}].name {n} is set by the operator; use another name")
    volume_names = {CHECKPOINT_VOLUME, SHM_VOLUME}
    for i, vol in enumerate(tpl.volumes or []):
        n = vol.get("name")
        if not isinstance(n, str) or not n:
            problems.append(f"spec.podTemplate.volumes[{i}] needs a name")
        elif n in RESERVED_VOLUMES:
            problems.append(f"spec.podTemplate.volumes[{i}].name {n} is taken by ftjob; rename it")
        elif n in volume_names:
            problems.append(f"spec.podTemplate.volumes[{i}].name {n} appears twice")
        else:
            volume_names.add(n)
    for i, mount in enumerate(tpl.volume_mounts or []):
        if mount.get("name") not in volume_names:
            problems.append(
                f"spec.podTemplate.volumeMounts[{i}] mounts volume {mount.get('name')!r}, which no volume defines"
            )
        if mount.get("mountPath") in (spec.checkpoint.mount_path, SHM_PATH):
            problems.append(
                f"spec.podTemplate.volumeMounts[{i}].mountPath {mount.get('mountPath')} is used by ftjob; pick another path"
            )
    for key in tpl.labels or {}:
        if key.startswith("ftjob.dev/"):
            problems.append(f"spec.podTemplate.labels {key}: ftjob.dev/* labels belong to the operator")
    for flag in spec.trainer.flags or {}:
        if not _FLAG_RE.match(flag):
            problems.append(
                f"spec.trainer.flags key {flag!r} must look like a flag name without dashes, e.g. warmup-steps"
            )
        elif flag in RESERVED_TRAINER_FLAGS:
            problems.append(f"spec.trainer.flags {flag} is set from spec.checkpoint/preemption; set it there")
    return problems


def validation_problems(exc: ValidationError) -> list[str]:
    """A pydantic error on the spec as fix-it lines (`spec.<field>: <what is wrong>`)."""
    out = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        out.append(f"spec.{loc}: {msg}" if loc else f"spec: {msg}")
    return out
