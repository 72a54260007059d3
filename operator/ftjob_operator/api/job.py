"""The whole object, the paths the CRD's subresources point at, and the parsers the planner uses."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from .base import API_VERSION, JOB_NAME_PATTERN, KIND, MAX_JOB_NAME_LENGTH, Model, cel_rules
from .spec import TrainingJobSpec
from .status import TrainingJobStatus


class TrainingJob(Model):
    """A preemption-safe elastic PyTorch training job."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        json_schema_extra=cel_rules(
            (
                f"size(self.metadata.name) <= {MAX_JOB_NAME_LENGTH}",
                f"metadata.name must be at most {MAX_JOB_NAME_LENGTH} characters (it names the Service <name>-coordinator)",
            ),
            (
                f"self.metadata.name.matches('{JOB_NAME_PATTERN}')",
                "metadata.name must be a DNS-1035 label: lowercase letters, digits and '-', starting with a letter",
            ),
        ),
    )

    api_version: Literal["ftjob.dev/v1alpha1"] = Field(
        API_VERSION, description="apiVersion is ftjob.dev/v1alpha1."
    )
    kind: Literal["TrainingJob"] = Field(KIND, description="kind is TrainingJob.")
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="metadata is the standard object metadata."
    )
    spec: TrainingJobSpec = Field(..., description="spec is the desired state.")
    status: TrainingJobStatus | None = Field(None, description="status is the observed state.")


# Status fields the scale subresource and printer columns point at (crd.py and the surface test use them).
SPEC_REPLICAS_PATH = ".spec.workers.replicas"
STATUS_REPLICAS_PATH = ".status.workers.active"
LABEL_SELECTOR_PATH = ".status.selector"


def parse_spec(spec: dict[str, Any]) -> TrainingJobSpec:
    """Validate a spec as the API server would after defaulting (pydantic fills the same defaults)."""
    return TrainingJobSpec.model_validate(spec)


def parse_status(status: dict[str, Any] | None) -> TrainingJobStatus:
    return TrainingJobStatus.model_validate(status or {})
