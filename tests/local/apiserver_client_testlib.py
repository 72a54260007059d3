"""Helpers of the tests of the embedded API server through the official `kubernetes` Python client (the fixtures
live in conftest.py): a client for a server's URL, a pod body, and a custom resource definition with a schema,
validation rules, defaults, and the status and scale subresources."""

from __future__ import annotations

from kubernetes import client

NS = "default"


WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.test.ftjob.dev"},
    "spec": {
        "group": "test.ftjob.dev",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {
                    "status": {},
                    "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"},
                },
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["image"],
                                "x-kubernetes-validations": [
                                    {
                                        "rule": "self.minReplicas <= self.replicas",
                                        "message": "minReplicas must not exceed replicas",
                                    }
                                ],
                                "properties": {
                                    "image": {"type": "string", "minLength": 1},
                                    "replicas": {
                                        "type": "integer",
                                        "minimum": 0,
                                        "maximum": 10,
                                        "default": 1,
                                    },
                                    "minReplicas": {"type": "integer", "minimum": 0, "default": 0},
                                    "mode": {"type": "string", "enum": ["fast", "slow"], "default": "fast"},
                                },
                            },
                            "status": {
                                "type": "object",
                                "properties": {"replicas": {"type": "integer"}, "phase": {"type": "string"}},
                            },
                        },
                    }
                },
            }
        ],
    },
}


def api_client(url: str) -> client.ApiClient:
    cfg = client.Configuration()
    cfg.host = url
    return client.ApiClient(cfg)


def pod_body(name: str, labels: dict | None = None, **spec) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "image": "python:3.12", "command": ["true"]}], **spec},
    }
