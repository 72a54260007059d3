"""The job's NetworkPolicy: who may reach its coordinator (the rendezvous store on 29400, the control API on 29401).

Only the job's own pods (label ftjob.dev/job-name=<job>, same namespace) reach both ports, and the operator's pods
the control API (when the operator knows its pod labels and namespace: FTJOB_OPERATOR_POD_LABELS, a JSON object the
chart sets, and POD_NAMESPACE). Other pods in the cluster, other jobs' pods in the same namespace included, are
refused by a CNI that enforces NetworkPolicy. The token still guards the control API where no CNI enforces it; the
rendezvous store (torch's TCPStore) has no authentication of its own, so there the policy is its only guard.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ftjob_trainer import contract

from . import render

OPERATOR_POD_LABELS_ENV = "FTJOB_OPERATOR_POD_LABELS"
OPERATOR_NAMESPACE_ENV = "POD_NAMESPACE"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set on every namespace by the API server


@dataclass(frozen=True)
class OperatorPods:
    """Where the operator's own pods are, so the policy can admit them to the control API."""

    namespace: str
    labels: dict[str, str]


def operator_pods_from_env(environ: Mapping[str, str] = os.environ) -> OperatorPods | None:
    """The operator's pods as the chart describes them, or None (an operator outside the cluster)."""
    raw, namespace = environ.get(OPERATOR_POD_LABELS_ENV, ""), environ.get(OPERATOR_NAMESPACE_ENV, "")
    if not raw or not namespace:
        return None
    labels = json.loads(raw)
    if not isinstance(labels, dict) or not labels or not all(isinstance(v, str) for v in labels.values()):
        raise ValueError(f"{OPERATOR_POD_LABELS_ENV} must be a JSON object of label strings, got {raw!r}")
    return OperatorPods(namespace, labels)


def policy_name(job: str) -> str:
    return f"{job}-coordinator"


def _ports(*ports: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": p} for p in ports]


def render_network_policy(ref: render.JobRef, operator: OperatorPods | None) -> dict[str, Any]:
    ingress: list[dict[str, Any]] = [
        {  # the job's workers: torchrun's rendezvous and the trainer's progress and checkpoint calls
            "from": [{"podSelector": {"matchLabels": {render.LABEL_JOB_NAME: ref.name}}}],
            "ports": _ports(contract.RDZV_PORT, contract.CONTROL_PORT),
        }
    ]
    if operator is not None:
        ingress.append(
            {  # the operator polls progress and asks for checkpoints
                "from": [
                    {
                        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: operator.namespace}},
                        "podSelector": {"matchLabels": dict(operator.labels)},
                    }
                ],
                "ports": _ports(contract.CONTROL_PORT),
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": policy_name(ref.name),
            "namespace": ref.namespace,
            "labels": render.base_labels(ref.name),
            "ownerReferences": [ref.owner_reference()],
        },
        "spec": {
            "podSelector": {
                "matchLabels": {render.LABEL_JOB_NAME: ref.name, render.LABEL_ROLE: render.ROLE_COORDINATOR}
            },
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }
