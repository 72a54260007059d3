"""Every permission the operator may hold, and why: the chart's RBAC is checked against this list
(tests/chart/test_chart_rbac_allowlist.py renders the chart with its defaults and with clusterWide=true and fails on
any granted rule not listed here, or on a wildcard), and the operator runs under exactly those rules on the local
cluster (tests/chart/test_install_operator_rbac.py fails on any 403).

NAMESPACED grants go into a Role in each managed namespace (the chart's default: watchNamespaces), or into one
ClusterRole with clusterWide=true, the explicit opt-in to wider permissions. CLUSTER grants are on cluster-scoped
resources, read-only but for kopf's peering object, and always sit in a ClusterRole.

What is never granted, in any mode: reading Secrets. The job's token Secret is created, never read: the operator
derives each token from its own key (tokens.py), so not even a cluster-wide operator can read a Secret, its own
jobs' included. No PersistentVolumeClaims either: the operator names claims in pod specs and never reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

# Verbs that read an object's content; none of them is granted on secrets, anywhere.
READ_VERBS = frozenset({"get", "list", "watch"})


@dataclass(frozen=True)
class Grant:
    group: str  # "" is the core group
    resource: str  # "plural" or "plural/subresource"
    verbs: frozenset[str]
    why: str


NAMESPACED: tuple[Grant, ...] = (
    Grant(
        "ftjob.dev",
        "trainingjobs",
        frozenset({"get", "list", "watch", "patch", "delete"}),
        "kopf lists, watches and patches jobs (finalizer, its annotations); each pass GETs the job fresh; "
        "delete for ttlSecondsAfterFinished",
    ),
    Grant("ftjob.dev", "trainingjobs/status", frozenset({"patch"}), "the status, as a merge patch"),
    Grant(
        "",
        "pods",
        frozenset({"create", "delete", "list", "watch"}),
        "coordinator and worker pods: create, replace, delete; list and watch by job label (informer.py's "
        "cache, read by every pass)",
    ),
    Grant(
        "",
        "services",
        frozenset({"create", "list", "watch"}),
        "the coordinator Service; its clusterIP is read from a watch-fed cache (informer.py)",
    ),
    Grant("", "secrets", frozenset({"create"}), "the job's token Secret: created, never read (tokens.py)"),
    Grant(
        "networking.k8s.io",
        "networkpolicies",
        frozenset({"create"}),
        "the job's NetworkPolicy (network_policy.py): created once, never read",
    ),
    Grant("", "events", frozenset({"create"}), "events that say why pods were replaced; kopf's warnings"),
    Grant(
        "kopf.dev",
        "kopfpeerings",
        frozenset({"list", "watch", "patch", "create"}),
        "kopf peering of a namespaced operator's replicas (peering.enabled)",
    ),
)

CLUSTER: tuple[Grant, ...] = (
    Grant(
        "",
        "nodes",
        frozenset({"list", "watch"}),
        "spot labels, termination taints and node loss (kopf index)",
    ),
    Grant(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        frozenset({"list", "watch"}),
        "kopf's resource discovery",
    ),
    Grant("", "namespaces", frozenset({"list", "watch"}), "kopf learns which of its namespaces exist"),
    Grant(
        "kopf.dev",
        "clusterkopfpeerings",
        frozenset({"list", "watch", "patch", "create"}),
        "kopf peering of a cluster-wide operator's replicas (peering.enabled with clusterWide)",
    ),
)


def allowed(grants: tuple[Grant, ...], group: str, resource: str, verb: str) -> bool:
    return any(g.group == group and g.resource == resource and verb in g.verbs for g in grants)
