"""Admission of the core/v1 types that need more than their schema: defaults and checks as Kubernetes applies
them (pods, services, namespaces, secrets). Each function takes what it may read (`AdmissionEnv`), the type, the
new object (changed in place) and the old one (None on create); admission.ADMISSION maps types to them."""

from __future__ import annotations

import base64
import copy
import ipaddress
import random
from dataclasses import dataclass
from typing import Any

from .auth import Tokens
from .errors import ApiError, FieldError, bad_request, invalid
from .resources import CLUSTER_IP_FIELD, SA_KEY, SVC_KEY, ResourceType
from .store import Store
from .validation import DNS1123_LABEL

CLUSTER_IP_NET = ipaddress.ip_network("127.96.0.0/16")


@dataclass
class AdmissionEnv:
    """What admission may read besides the object: stored objects (services' IPs, ServiceAccounts) and the
    token issuer (a service-account-token Secret gets its token filled in)."""

    store: Store
    tokens: Tokens


def admit_pod(env: AdmissionEnv, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
    spec = obj.setdefault("spec", {})
    errors = []
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        errors.append(FieldError("spec.containers", "Required value", "FieldValueRequired"))
    for kind in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(kind) or []):
            if not isinstance(c, dict) or not c.get("name"):
                errors.append(FieldError(f"spec.{kind}[{i}].name", "Required value", "FieldValueRequired"))
                continue
            if len(c["name"]) > 63 or not DNS1123_LABEL.match(c["name"]):
                errors.append(
                    FieldError(
                        f"spec.{kind}[{i}].name",
                        f'Invalid value: "{c["name"]}": a lowercase RFC 1123 label of at most 63 characters',
                    )
                )
            if not c.get("image"):
                errors.append(FieldError(f"spec.{kind}[{i}].image", "Required value", "FieldValueRequired"))
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("terminationMessagePolicy", "File")
            c.setdefault(
                "imagePullPolicy",
                "Always"
                if str(c.get("image", "")).endswith(":latest") or ":" not in str(c.get("image", ""))
                else "IfNotPresent",
            )
            for p in c.get("ports") or []:
                p.setdefault("protocol", "TCP")
    if (
        old is not None
        and (old.get("spec") or {}).get("nodeName")
        and spec.get("nodeName") != old["spec"]["nodeName"]
    ):
        errors.append(
            FieldError(
                "spec.nodeName",
                "Forbidden: pod updates may not change nodeName once set",
                "FieldValueForbidden",
            )
        )
    elif old is not None and _pod_spec_fixed_part(spec) != _pod_spec_fixed_part(old.get("spec") or {}):
        # As in Kubernetes: what a real cluster refuses must fail here too, not only in production.
        errors.append(
            FieldError(
                "spec",
                "Forbidden: pod updates may not change fields other than "
                "`spec.containers[*].image`, `spec.initContainers[*].image`, "
                "`spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing "
                "tolerations), `spec.terminationGracePeriodSeconds`; delete and recreate the "
                "pod instead",
                "FieldValueForbidden",
            )
        )
    if errors:
        raise invalid(rt.kind, rt.group, obj["metadata"]["name"], errors)
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    if old is None:
        obj["status"] = {"phase": "Pending", "qosClass": _qos_class(spec)}


def admit_service(
    env: AdmissionEnv, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None
) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    errors = []
    for i, p in enumerate(spec.get("ports") or []):
        port = p.get("port")
        if not isinstance(port, int) or not 1 <= port <= 65535:
            errors.append(
                FieldError(
                    f"spec.ports[{i}].port",
                    f"Invalid value: {port}: must be between 1 and 65535, inclusive",
                )
            )
        p.setdefault("protocol", "TCP")
        p.setdefault("targetPort", port)
    old_ip = (old or {}).get("spec", {}).get("clusterIP")
    if old_ip:
        if spec.get("clusterIP") and spec["clusterIP"] != old_ip:
            errors.append(
                FieldError("spec.clusterIP", f'Invalid value: "{spec["clusterIP"]}": field is immutable')
            )
        spec["clusterIP"] = old_ip
    elif spec.get("clusterIP") and spec["clusterIP"] != "None":
        if env.store.by_field(SVC_KEY, CLUSTER_IP_FIELD, spec["clusterIP"]):
            errors.append(
                FieldError(
                    "spec.clusterIP",
                    f'Invalid value: "{spec["clusterIP"]}": provided IP is already allocated',
                )
            )
    elif not spec.get("clusterIP"):
        spec["clusterIP"] = _allocate_cluster_ip(env.store)
    if errors:
        raise invalid(rt.kind, rt.group, obj["metadata"]["name"], errors)
    spec["clusterIPs"] = [spec["clusterIP"]]
    spec.setdefault("ipFamilies", ["IPv4"])
    spec.setdefault("ipFamilyPolicy", "SingleStack")
    spec.setdefault("internalTrafficPolicy", "Cluster")
    obj.setdefault("status", {"loadBalancer": {}})


def _allocate_cluster_ip(store: Store) -> str:
    """A random free address, as Kubernetes allocates them: two local clusters running on one machine at the
    same time (parallel test runs) then rarely hand out the same address to services on the same port."""
    first = int(CLUSTER_IP_NET.network_address) + 1
    size = CLUSTER_IP_NET.num_addresses - 2
    start = random.randrange(size)
    for i in range(size):
        ip = str(ipaddress.ip_address(first + (start + i) % size))
        if not store.by_field(SVC_KEY, CLUSTER_IP_FIELD, ip):
            return ip
    raise ApiError(500, "InternalError", "the service IP range 127.96.0.0/16 is full")


def admit_namespace(
    env: AdmissionEnv, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None
) -> None:
    obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
    obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
    if old is None:
        obj["status"] = {"phase": "Active"}


def admit_secret(
    env: AdmissionEnv, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None
) -> None:
    obj.setdefault("type", "Opaque")
    annotations = obj["metadata"].get("annotations") or {}
    sa_name = annotations.get("kubernetes.io/service-account.name")
    if (
        obj["type"] == "kubernetes.io/service-account-token"
        and sa_name
        and not (obj.get("data") or {}).get("token")
    ):
        # The token controller's job in Kubernetes: fill in a token for the named ServiceAccount.
        ns = obj["metadata"]["namespace"]
        sa = env.store.get(SA_KEY, ns, sa_name)
        if sa is None:
            raise invalid(
                "Secret",
                "",
                obj["metadata"]["name"],
                [
                    FieldError(
                        "metadata.annotations[kubernetes.io/service-account.name]",
                        f'Invalid value: "{sa_name}": no ServiceAccount of that name in namespace {ns}; create it first',
                    )
                ],
            )
        annotations["kubernetes.io/service-account.uid"] = sa["metadata"]["uid"]
        obj["metadata"]["annotations"] = annotations
        token = env.tokens.issue(ns, sa_name, sa["metadata"]["uid"])
        obj.setdefault("data", {}).update(
            {
                "token": base64.b64encode(token.encode()).decode(),
                "namespace": base64.b64encode(ns.encode()).decode(),
            }
        )
    data = obj.get("data") or {}
    for key, value in data.items():
        try:
            base64.b64decode(value, validate=True)
        except (ValueError, TypeError) as e:
            raise bad_request(
                f'Secret in version "v1" cannot be handled as a Secret: data[{key}] is not '
                "valid base64; put plain text under stringData instead"
            ) from e
    string_data = obj.pop("stringData", None) or {}
    for key, value in string_data.items():
        data[key] = base64.b64encode(str(value).encode()).decode()
    if data:
        obj["data"] = data


def _pod_spec_fixed_part(spec: dict[str, Any]) -> dict[str, Any]:
    """The part of a pod spec that may not change after creation (nodeName is set once, by binding)."""
    fixed = copy.deepcopy(spec)
    for kind in ("containers", "initContainers"):
        for c in fixed.get(kind) or []:
            if isinstance(c, dict):
                c.pop("image", None)
    for key in (
        "activeDeadlineSeconds",
        "tolerations",
        "terminationGracePeriodSeconds",
        "schedulingGates",
        "nodeName",
    ):
        fixed.pop(key, None)
    return fixed


def _qos_class(spec: dict[str, Any]) -> str:
    reqs = [
        ((c.get("resources") or {}).get("requests") or {}, (c.get("resources") or {}).get("limits") or {})
        for c in spec.get("containers") or []
    ]
    if not any(r or lim for r, lim in reqs):
        return "BestEffort"
    if all(lim.get("cpu") and lim.get("memory") and (not r or r == lim) for r, lim in reqs):
        return "Guaranteed"
    return "Burstable"
