"""The resource types the server knows: built-ins and, once their CRD is applied, custom resources."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .store import Key

CRD_KEY: Key = ("apiextensions.k8s.io", "customresourcedefinitions")
NS_KEY: Key = ("", "namespaces")
NODE_KEY: Key = ("", "nodes")
POD_KEY: Key = ("", "pods")
SVC_KEY: Key = ("", "services")
SA_KEY: Key = ("", "serviceaccounts")
SECRET_KEY: Key = ("", "secrets")
PDB_KEY: Key = ("policy", "poddisruptionbudgets")
EVENT_KEYS: tuple[Key, ...] = (("", "events"), ("events.k8s.io", "events"))
CLUSTER_IP_FIELD = "spec.clusterIP"
# Fields the store indexes by value: a Service's address (allocation checks it is free), a pod's node (the
# kubelet's field selector).
INDEXED_FIELDS: dict[Key, tuple[str, ...]] = {SVC_KEY: (CLUSTER_IP_FIELD,), POD_KEY: ("spec.nodeName",)}


@dataclass
class ResourceType:
    group: str
    versions: list[str]  # served versions, preferred (storage) first
    plural: str
    kind: str
    namespaced: bool = True
    short_names: list[str] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    # "status" and "scale" of built-ins: they change how the object is stored (custom resources declare them in
    # their CRD). Where the other subresources are served is said by their entry in subresources.SUBRESOURCES.
    subresources: list[str] = field(default_factory=list)
    # Custom resources only:
    crd: dict[str, Any] | None = None

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def key(self) -> Key:
        return (self.group, self.plural)

    @property
    def list_kind(self) -> str:
        return self.kind + "List"

    def api_version(self, version: str | None = None) -> str:
        version = version or self.versions[0]
        return f"{self.group}/{version}" if self.group else version

    def qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    # CRD helpers -------------------------------------------------------------------------
    def crd_version(self, version: str) -> dict[str, Any]:
        assert self.crd is not None
        for v in self.crd["spec"]["versions"]:
            if v["name"] == version:
                return v
        raise KeyError(version)

    def has_status(self, version: str | None = None) -> bool:
        if self.crd is None:
            return "status" in self.subresources
        return "status" in (self.crd_version(version or self.versions[0]).get("subresources") or {})

    def scale_spec(self, version: str | None = None) -> dict[str, Any] | None:
        if self.crd is None:
            return (
                {
                    "specReplicasPath": ".spec.replicas",
                    "statusReplicasPath": ".status.replicas",
                    "labelSelectorPath": ".status.selector",
                }
                if "scale" in self.subresources
                else None
            )
        return (self.crd_version(version or self.versions[0]).get("subresources") or {}).get("scale")


def _rt(
    group: str,
    version: str,
    plural: str,
    kind: str,
    namespaced: bool = True,
    short: str = "",
    subs: str = "",
    categories: str = "",
) -> ResourceType:
    return ResourceType(
        group,
        [version],
        plural,
        kind,
        namespaced,
        short.split() if short else [],
        categories.split() if categories else [],
        subs.split() if subs else [],
    )


BUILTINS: list[ResourceType] = [
    _rt("", "v1", "namespaces", "Namespace", False, "ns", "status"),
    _rt("", "v1", "pods", "Pod", True, "po", "status", "all"),
    _rt("", "v1", "services", "Service", True, "svc", "status", "all"),
    _rt("", "v1", "endpoints", "Endpoints", True, "ep"),
    _rt("", "v1", "events", "Event", True, "ev"),
    _rt("", "v1", "configmaps", "ConfigMap", True, "cm"),
    _rt("", "v1", "secrets", "Secret"),
    _rt("", "v1", "nodes", "Node", False, "no", "status"),
    _rt("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True, "pvc", "status"),
    _rt("", "v1", "persistentvolumes", "PersistentVolume", False, "pv", "status"),
    _rt("", "v1", "serviceaccounts", "ServiceAccount", True, "sa"),
    _rt("", "v1", "resourcequotas", "ResourceQuota", True, "quota", "status"),
    _rt("", "v1", "limitranges", "LimitRange", True, "limits"),
    _rt("apps", "v1", "deployments", "Deployment", True, "deploy", "status scale", "all"),
    _rt("apps", "v1", "replicasets", "ReplicaSet", True, "rs", "status scale", "all"),
    _rt("apps", "v1", "statefulsets", "StatefulSet", True, "sts", "status scale", "all"),
    _rt("apps", "v1", "daemonsets", "DaemonSet", True, "ds", "status", "all"),
    _rt("batch", "v1", "jobs", "Job", True, "", "status", "all"),
    _rt("coordination.k8s.io", "v1", "leases", "Lease"),
    _rt("events.k8s.io", "v1", "events", "Event", True, "ev"),
    _rt("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    _rt("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    _rt("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    _rt("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    _rt("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, "pdb", "status"),
    _rt("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True, "netpol"),
    _rt("networking.k8s.io", "v1", "ingresses", "Ingress", True, "ing", "status"),
    _rt("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False, "pc"),
    _rt("storage.k8s.io", "v1", "storageclasses", "StorageClass", False, "sc"),
    _rt(
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        False,
    ),
    _rt(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        False,
    ),
    _rt("authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview", False),
    _rt("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", False),
    _rt(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        False,
        "crd crds",
        "status",
    ),
]


class Registry:
    """Maps URL parts (group, version, plural) and kinds to resource types; CRDs add and remove entries."""

    def __init__(self) -> None:
        self.types: dict[tuple[str, str], ResourceType] = {}
        for rt in BUILTINS:
            self.types[rt.key] = rt

    def get(self, group: str, version: str, plural: str) -> ResourceType | None:
        rt = self.types.get((group, plural))
        if rt is None or version not in rt.versions:
            return None
        return rt

    def groups(self) -> dict[str, list[str]]:
        """group -> served versions (preferred first), in a stable order."""
        out: dict[str, list[str]] = {}
        for rt in self.types.values():
            versions = out.setdefault(rt.group, [])
            for v in rt.versions:
                if v not in versions:
                    versions.append(v)
        return out

    def in_group_version(self, group: str, version: str) -> list[ResourceType]:
        return [rt for rt in self.types.values() if rt.group == group and version in rt.versions]

    def add_crd(self, crd: dict[str, Any]) -> ResourceType:
        spec = crd["spec"]
        names = spec["names"]
        versions = [v for v in spec["versions"] if v.get("served", True)]
        versions.sort(key=lambda v: not v.get("storage", False))
        rt = ResourceType(
            group=spec["group"],
            versions=[v["name"] for v in versions],
            plural=names["plural"],
            kind=names["kind"],
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            short_names=list(names.get("shortNames") or []),
            categories=list(names.get("categories") or []),
            crd=crd,
        )
        self.types[rt.key] = rt
        return rt

    def remove_crd(self, crd: dict[str, Any]) -> None:
        key = (crd["spec"]["group"], crd["spec"]["names"]["plural"])
        rt = self.types.get(key)
        if rt is not None and rt.crd is not None:
            del self.types[key]
