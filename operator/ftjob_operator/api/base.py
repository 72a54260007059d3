"""The API's shared base: names, the pydantic base models, and the helpers that shape the generated schema."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

GROUP = "ftjob.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TrainingJob"
PLURAL = "trainingjobs"
SINGULAR = "trainingjob"
SHORT_NAMES = ["tj"]
LIST_KIND = "TrainingJobList"

# The job name becomes the Service `<job>-coordinator`, a DNS-1035 label of at most 63 characters.
MAX_JOB_NAME_LENGTH = 63 - len("-coordinator")
JOB_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"

# The built-in trainer, as torchrun launches it on every worker.
DEFAULT_TRAINER_COMMAND = ["-m", "ftjob_trainer.train"]

# A container image reference (docker/distribution's grammar): [host[:port]/]path[:tag][@digest]. Written for both
# Go's RE2 (the API server) and Python's re (pydantic, the local API server): no lookarounds, no \w.
_HOST_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_PATTERN = (
    rf"^(?:{_HOST_PART}(?:\.{_HOST_PART})*(?::[0-9]+)?/)?{_PATH_PART}(?:/{_PATH_PART})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"  # tag
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"  # digest
)
MAX_IMAGE_LENGTH = 512
# A non-negative resource.Quantity (10Gi, 512Mi, 1.5G, 1e9): Kubernetes' own grammar without the sign.
_DECIMAL = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
QUANTITY_PATTERN = rf"^{_DECIMAL}(?:[KMGTPE]i|[mkMGTPE]|[eE][+-]?{_DECIMAL})?$"
# The largest integer JSON carries exactly (2^53): the API server refuses an integer field's number above it.
MAX_SAFE_INT = 2**53
# Sane maxima for counts and durations (a step count of 1e30 is a typo, not a plan).
MAX_STEPS = 10**12
MAX_SECONDS = 10 * 365 * 86400

PRESERVE = {"x-kubernetes-preserve-unknown-fields": True}
FREE_OBJECT: dict[str, Any] = {"type": "object", **PRESERVE}


def cel_rules(*rules: tuple[str, str]) -> dict[str, Any]:
    """CEL rules for `x-kubernetes-validations`: (rule, message) pairs."""
    return {"x-kubernetes-validations": [{"rule": r, "message": m} for r, m in rules]}


def cel_list(names: frozenset[str] | tuple[str, ...]) -> str:
    """A CEL list literal of names, sorted so the generated CRD is stable."""
    return "[" + ", ".join(f"'{n}'" for n in sorted(names)) + "]"


def sub_object(model: type[BaseModel], description: str) -> Any:
    """A nested object that defaults to `{}` so the API server fills in its own defaults."""
    return Field(default_factory=model, description=description, json_schema_extra={"default": {}})


def free_object(description: str) -> Any:
    """A free-form Kubernetes object ftjob passes through unchanged."""
    return Field(default=None, description=description, json_schema_extra=PRESERVE)


def free_list(description: str) -> Any:
    """A list of free-form Kubernetes objects (each item must still be an object)."""
    return Field(default=None, description=description, json_schema_extra={"items": FREE_OBJECT})


class Model(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields are an error (the CRD prunes them anyway)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class StatusModel(Model):
    """Status parts: a status written by a newer operator (a rollback) may hold fields this one does not know.
    Ignoring them keeps the counters; rejecting the whole status would lose them."""

    model_config = ConfigDict(extra="ignore")
