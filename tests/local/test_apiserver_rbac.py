"""Authentication (ServiceAccount tokens, impersonation) and RBAC enforcement by the embedded API server."""

from __future__ import annotations

import base64
import json

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

NS = "default"


def api_client(url: str, token: str | None = None, impersonate: str | None = None) -> client.ApiClient:
    cfg = client.Configuration()
    cfg.host = url
    if token:
        cfg.api_key = {"authorization": token}
        cfg.api_key_prefix = {"authorization": "Bearer"}
    c = client.ApiClient(cfg)
    if impersonate:
        c.set_default_header("Impersonate-User", impersonate)
    return c


def setup_operator_rbac(admin: client.ApiClient) -> None:
    core, rbac = client.CoreV1Api(admin), client.RbacAuthorizationV1Api(admin)
    core.create_namespaced_service_account(NS, {"metadata": {"name": "op"}})
    rbac.create_cluster_role(
        {
            "metadata": {"name": "op"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["pods"],
                    "verbs": ["get", "list", "watch", "create", "delete"],
                },
                {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
            ],
        }
    )
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": "op"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "op"},
            "subjects": [{"kind": "ServiceAccount", "name": "op", "namespace": NS}],
        }
    )
    rbac.create_namespaced_role(
        NS,
        {
            "metadata": {"name": "cm-reader"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "verbs": ["get"],
                    "resourceNames": ["allowed"],
                }
            ],
        },
    )
    rbac.create_namespaced_role_binding(
        NS,
        {
            "metadata": {"name": "cm-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "op"}],
        },
    )
    for n in ("allowed", "other"):
        core.create_namespaced_config_map(NS, {"metadata": {"name": n}})


def test_service_account_token_is_held_to_its_rbac(server):
    with api_client(server.url) as admin:
        setup_operator_rbac(admin)
        secret = client.CoreV1Api(admin).create_namespaced_secret(
            NS,
            {
                "metadata": {"name": "op-token", "annotations": {"kubernetes.io/service-account.name": "op"}},
                "type": "kubernetes.io/service-account-token",
            },
        )
        token = base64.b64decode(secret.data["token"]).decode()
    with api_client(server.url, token=token) as op:
        core = client.CoreV1Api(op)
        core.create_namespaced_pod(
            NS, {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "m", "image": "i"}]}}
        )
        assert [p.metadata.name for p in core.list_namespaced_pod(NS).items] == ["p"]
        core.patch_namespaced_pod_status("p", NS, {"status": {"phase": "Running"}})
        assert core.read_namespaced_config_map("allowed", NS).metadata.name == "allowed"
        for call in (
            lambda: core.read_namespaced_config_map("other", NS),  # not in resourceNames
            lambda: core.list_namespaced_config_map(NS),  # no list on configmaps
            lambda: core.patch_namespaced_pod("p", NS, {"metadata": {"labels": {"a": "b"}}}),  # no patch
            lambda: core.list_node(),
        ):  # nothing on nodes
            with pytest.raises(ApiException) as e:
                call()
            assert e.value.status == 403
        message = json.loads(e.value.body)["message"]
        assert 'User "system:serviceaccount:default:op" cannot list resource "nodes"' in message
        assert message.endswith("at the cluster scope")

    with api_client(server.url, token=token + "x") as bad:
        with pytest.raises(ApiException) as e:
            client.CoreV1Api(bad).list_namespaced_pod(NS)
        assert e.value.status == 401


def test_token_request_impersonation_and_access_reviews(server):
    with api_client(server.url) as admin:
        setup_operator_rbac(admin)
        tr = client.CoreV1Api(admin).create_namespaced_service_account_token("op", NS, {"spec": {}})
        assert tr.status.token
        review = client.AuthorizationV1Api(admin).create_subject_access_review(
            {
                "spec": {
                    "user": "system:serviceaccount:default:op",
                    "resourceAttributes": {"verb": "delete", "resource": "pods", "namespace": NS},
                }
            }
        )
        assert review.status.allowed is True
    with api_client(server.url, token=tr.status.token) as op:
        own = client.AuthorizationV1Api(op).create_self_subject_access_review(
            {"spec": {"resourceAttributes": {"verb": "delete", "resource": "nodes"}}}
        )
        assert own.status.allowed is False
    with api_client(server.url, impersonate="system:serviceaccount:default:op") as imp:
        core = client.CoreV1Api(imp)
        assert core.list_namespaced_pod(NS).items == []
        with pytest.raises(ApiException) as e:
            core.list_namespaced_secret(NS)
        assert e.value.status == 403
    # A deleted ServiceAccount's tokens stop working.
    with api_client(server.url) as admin:
        client.CoreV1Api(admin).delete_namespaced_service_account("op", NS)
    with api_client(server.url, token=tr.status.token) as op:
        with pytest.raises(ApiException) as e:
            client.CoreV1Api(op).list_namespaced_pod(NS)
        assert e.value.status == 401
