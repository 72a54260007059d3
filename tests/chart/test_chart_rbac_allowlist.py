"""Every rule the chart grants is on the operator's allow-list (operator/ftjob_operator/rbac_allowlist.py), in the
scope the list allows it: rendered with the defaults (Roles in watchNamespaces), with clusterWide=true (the opt-in),
with peering and with the NetworkPolicy turned off. No wildcard anywhere, no read of Secrets in any mode."""

from __future__ import annotations

import pytest
from chart_helpers import render
from ftjob_operator.rbac_allowlist import CLUSTER, NAMESPACED, READ_VERBS, allowed

RENDERINGS = {
    "defaults": {},
    "several namespaces, peering": {
        "watchNamespaces": "{team-a,team-b}",
        "replicaCount": "2",
        "peering.enabled": "true",
    },
    "no network policy": {"networkPolicy.enabled": "false"},
    "cluster-wide": {"clusterWide": "true"},
    "cluster-wide, peering": {"clusterWide": "true", "replicaCount": "2", "peering.enabled": "true"},
}


def granted(docs: list[dict]) -> list[tuple[str, str | None, str, str, str]]:
    """(kind, namespace, apiGroup, resource, verb) of every rule of every Role and ClusterRole, wildcards refused."""
    out = []
    for role in (d for d in docs if d["kind"] in ("Role", "ClusterRole")):
        for rule in role["rules"]:
            parts = [*rule["apiGroups"], *rule["resources"], *rule["verbs"], *rule.get("resourceNames", [])]
            assert "*" not in parts and not any("*" in p for p in parts), (
                f"wildcard in {role['metadata']}: {rule}"
            )
            assert not rule.get("nonResourceURLs"), rule
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        out.append((role["kind"], role["metadata"].get("namespace"), group, resource, verb))
    return out


@pytest.mark.parametrize("rendering", list(RENDERINGS))
def test_every_granted_rule_is_on_the_allow_list_in_its_scope(rendering):
    values = RENDERINGS[rendering]
    cluster_wide = values.get("clusterWide") == "true"
    rules = granted(render(values))
    assert rules, "the chart granted nothing: the check would pass vacuously"
    for kind, namespace, group, resource, verb in rules:
        what = f"{kind} {namespace or ''} {group or 'core'}/{resource} {verb}"
        if kind == "Role":
            assert not cluster_wide, f"{what}: clusterWide uses one ClusterRole"
            assert allowed(NAMESPACED, group, resource, verb), f"{what} is not on the allow-list"
        elif allowed(CLUSTER, group, resource, verb):
            continue
        else:  # namespaced rules in a ClusterRole: every namespace, only when asked for
            assert cluster_wide, f"{what}: namespaced rules are cluster-wide only with clusterWide=true"
            assert allowed(NAMESPACED, group, resource, verb), f"{what} is not on the allow-list"
        if resource == "secrets":
            assert verb not in READ_VERBS, f"{what}: the operator never reads a Secret"


def test_the_default_install_manages_only_the_default_namespace_and_reads_no_secret():
    rules = granted(render())
    namespaced = {(ns, g, r) for kind, ns, g, r, _ in rules if kind == "Role"}
    assert {ns for ns, _, _ in namespaced} == {"default"}
    cluster = {(g, r, v) for kind, _, g, r, v in rules if kind == "ClusterRole"}
    assert cluster == {(g.group, g.resource, v) for g in CLUSTER[:3] for v in g.verbs}, (
        "nodes, CRDs, namespaces"
    )
    assert ("", "secrets") in {(g, r) for _, g, r in namespaced}
    assert not [r for r in rules if r[3] == "secrets" and r[4] in READ_VERBS]
