"""The helm chart: lint, render, official-schema validation, least-privilege RBAC, values schema, CRD copy."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import socket
from pathlib import Path

import aiohttp
import jsonschema
import kubernetes_validate
import pytest
import yaml
from chart_helpers import CHART, HA_NAMESPACED, ROOT, find, helm, one, render, set_args
from ftjob_operator import cli, network_policy
from ftjob_operator import metrics as metrics_mod
from ftjob_operator import render as render_mod
from ftjob_operator.rbac_allowlist import NAMESPACED

K8S_VERSION = "1.32.0"  # the kubectl/helm generation the project ships (tools/fetch_k8s_tools.py)
RELEASE_NS = "ftjob-system"
FULLNAME = "t-ftjob"  # release "t" + chart "ftjob"
SCENARIOS = {
    "defaults": {},
    "ha-namespaced": HA_NAMESPACED,
    "ha-cluster-wide": {"replicaCount": "3", "peering.enabled": "true", "clusterWide": "true"},
}
# Kinds outside the official schemas, and how each is checked instead.
NON_CORE_KINDS = {"ServiceMonitor"}

# What the operator does with each resource, and nothing more: its allow-list (operator/ftjob_operator/
# rbac_allowlist.py, checked rule by rule in test_chart_rbac_allowlist.py); the operator runs under exactly these in
# test_install_operator_rbac.py, which fails on any 403.
NAMESPACED_RULES = {(g.group, g.resource): set(g.verbs) for g in NAMESPACED if g.group != "kopf.dev"}
CLUSTER_RULES = {
    ("", "nodes"): {"list", "watch"},
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
}
# kopf lists and watches namespaces only when it watches some of them (`ftjob operator --namespace`).
NAMESPACE_OBSERVER_RULES = {("", "namespaces"): {"list", "watch"}}
PEERING_VERBS = {"list", "watch", "patch", "create"}


def rules_of(role: dict) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) -> verbs, failing on wildcards or rules that name several groups."""
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"], (
            f"wildcard in {role['metadata']['name']}: {rule}"
        )
        assert len(rule["apiGroups"]) == 1, f"one apiGroup per rule keeps them reviewable: {rule}"
        assert not rule.get("resourceNames"), rule
        for resource in rule["resources"]:
            key = (rule["apiGroups"][0], resource)
            assert key not in out, f"{key} granted twice in {role['metadata']['name']}"
            out[key] = set(rule["verbs"])
    return out


def test_helm_lint_strict_for_each_scenario():
    for name, values in SCENARIOS.items():
        proc = helm("lint", "--strict", str(CHART), *set_args(values), check=False)
        assert proc.returncode == 0, f"helm lint ({name}) failed:\n{proc.stdout}\n{proc.stderr}"
        assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_rendered_manifest_passes_the_official_schema(scenario):
    docs = render(SCENARIOS[scenario], namespace=RELEASE_NS, crds=True)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "ServiceAccount", "ClusterRole", "CustomResourceDefinition"} <= kinds
    errors, checked = [], 0
    for doc in docs:
        if doc["kind"] in NON_CORE_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as exc:
            where = "/".join(str(p) for p in exc.absolute_path)
            errors.append(f"{doc['kind']}/{doc['metadata']['name']} at {where}: {exc.message}")
        checked += 1
    assert not errors, f"{scenario}: manifests the API server would reject:\n" + "\n".join(errors)
    assert checked == len([d for d in docs if d["kind"] not in NON_CORE_KINDS])


def test_non_core_kinds_really_have_no_official_schema():
    """Guards NON_CORE_KINDS: a kind listed there must be one the official schemas cannot check."""
    monitor = one(render(HA_NAMESPACED), "ServiceMonitor")
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(monitor, K8S_VERSION, strict=True)


def test_rbac_by_default_is_a_role_in_the_default_namespace_with_exactly_the_operators_verbs():
    docs = render(namespace=RELEASE_NS)
    assert not find(docs, "ClusterRole", name=FULLNAME), (
        "the default must not grant pods or secrets cluster-wide"
    )
    role = one(docs, "Role", namespace="default")
    assert rules_of(role) == NAMESPACED_RULES
    binding = one(docs, "RoleBinding", namespace="default")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": FULLNAME}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": RELEASE_NS}]
    # Cluster-scoped resources cannot be granted by a Role: read-only nodes, CRDs and namespaces.
    assert rules_of(one(docs, "ClusterRole", name=f"{FULLNAME}-cluster")) == {
        **CLUSTER_RULES,
        **NAMESPACE_OBSERVER_RULES,
    }
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"] == FULLNAME


def test_watched_namespaces_each_get_a_role_and_peering_its_kopfpeerings():
    docs = render(HA_NAMESPACED, namespace=RELEASE_NS)
    for ns in ("team-a", "team-b"):
        role = one(docs, "Role", namespace=ns)
        assert rules_of(role) == {**NAMESPACED_RULES, ("kopf.dev", "kopfpeerings"): PEERING_VERBS}
        binding = one(docs, "RoleBinding", namespace=ns)
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert not find(docs, "Role", namespace="default"), "watchNamespaces replaces the default"
    no_policy = one(render({"networkPolicy.enabled": "false"}), "Role", namespace="default")
    assert ("networking.k8s.io", "networkpolicies") not in rules_of(no_policy)


def test_cluster_wide_is_an_opt_in_with_one_cluster_role_and_still_no_secret_reads():
    docs = render({"clusterWide": "true"})
    assert not find(docs, "Role") and not find(docs, "RoleBinding")
    assert rules_of(one(docs, "ClusterRole", name=FULLNAME)) == NAMESPACED_RULES
    assert rules_of(one(docs, "ClusterRole", name=f"{FULLNAME}-cluster")) == CLUSTER_RULES
    assert NAMESPACED_RULES[("", "secrets")] == {"create"}
    for name in (FULLNAME, f"{FULLNAME}-cluster"):
        binding = one(docs, "ClusterRoleBinding", name=name)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": name,
        }
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not any(a.startswith("--namespace") for a in args), "every namespace"


def test_cluster_wide_peering_grants_cluster_peerings_only():
    docs = render(SCENARIOS["ha-cluster-wide"])
    cluster = rules_of(one(docs, "ClusterRole", name=f"{FULLNAME}-cluster"))
    assert cluster == {**CLUSTER_RULES, ("kopf.dev", "clusterkopfpeerings"): PEERING_VERBS}
    crd = one(docs, "CustomResourceDefinition")
    assert crd["metadata"]["name"] == "clusterkopfpeerings.kopf.dev" and crd["spec"]["scope"] == "Cluster"
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    namespaced = one(render(HA_NAMESPACED), "CustomResourceDefinition")
    assert (
        namespaced["metadata"]["name"] == "kopfpeerings.kopf.dev"
        and namespaced["spec"]["scope"] == "Namespaced"
    )
    assert not find(
        render({**SCENARIOS["ha-cluster-wide"], "peering.createCRDs": "false"}), "CustomResourceDefinition"
    )


def test_rbac_group_and_resources_match_the_generated_crd():
    crd_files = sorted((CHART / "crds").glob("*.yaml"))
    assert crd_files, "charts/ftjob/crds/ is empty: run `ftjob crd --write` and commit what it writes"
    crds = [d for f in crd_files for d in yaml.safe_load_all(f.read_text()) if d]
    (tj,) = [c for c in crds if c["spec"]["names"]["kind"] == "TrainingJob"]
    assert (tj["spec"]["group"], "trainingjobs") in NAMESPACED_RULES
    assert tj["spec"]["names"]["plural"] == "trainingjobs" and tj["spec"]["scope"] == "Namespaced"
    assert all("status" in v.get("subresources", {}) for v in tj["spec"]["versions"] if v["served"]), (
        "the chart grants trainingjobs/status; the CRD must have the status subresource"
    )


def test_chart_crds_equal_generated_crds():
    generated = ROOT / "crds"
    assert any(generated.glob("*.yaml")), (
        "crds/ holds no CRD: run `ftjob crd --write` and commit what it writes"
    )
    ours = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    theirs = {p.name: p.read_bytes() for p in generated.glob("*.yaml")}
    assert sorted(ours) == sorted(theirs), (
        "charts/ftjob/crds/ and crds/ hold different files: run `ftjob crd --write`"
    )
    stale = [name for name in theirs if ours[name] != theirs[name]]
    assert not stale, f"charts/ftjob/crds/ differs from crds/ in {stale}: run `ftjob crd --write`"


def test_operator_flags_are_the_ones_ftjob_operator_accepts():
    docs = render(HA_NAMESPACED)
    container = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args == [
        "--log-level=info",
        "--metrics-port=8080",
        "--namespace=team-a",
        "--namespace=team-b",
        "--network-policy",
        f"--peering={FULLNAME}",
    ]
    # The image's ENTRYPOINT is `ftjob operator`; the real parser must take the chart's flags as they are.
    parsed = cli._parser().parse_args(["operator", *args])
    assert (
        parsed.namespaces,
        parsed.log_level,
        parsed.metrics_port,
        parsed.peering,
        parsed.network_policy,
    ) == (
        ["team-a", "team-b"],
        "INFO",
        8080,
        FULLNAME,
        True,
    )
    env = {e["name"]: e for e in container["env"]}
    assert env["FTJOB_DEFAULT_TRAINER_IMAGE"]["value"] == "ghcr.io/ftjob/trainer:0.1.0"
    assert env["POD_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name", "kopf's peering identity"
    assert set(cli.OPERATOR_ENV) >= set(env), "every variable the chart sets is one the operator reads"
    default_args = one(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert default_args[2:] == ["--namespace=default", "--network-policy"], "default: the default namespace"
    off = one(render({"networkPolicy.enabled": "false"}), "Deployment")["spec"]["template"]["spec"]
    assert "--no-network-policy" in off["containers"][0]["args"]


def test_the_token_key_reaches_the_operator_through_the_kubelet_and_is_kept():
    docs = render()
    secret = one(docs, "Secret", name=f"{FULLNAME}-token-key")
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert len(base64.b64decode(secret["data"]["key"])) == 48
    env = {e["name"]: e for e in one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    ref = env["FTJOB_TOKEN_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": f"{FULLNAME}-token-key", "key": "key"}
    own = render({"tokenKey.existingSecret": "mine"})
    assert not find(own, "Secret", name=f"{FULLNAME}-token-key")
    own_env = one(own, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert (
        next(e for e in own_env if e["name"] == "FTJOB_TOKEN_KEY")["valueFrom"]["secretKeyRef"]["name"]
        == "mine"
    )


def test_extra_termination_taints_reach_the_operator_as_one_comma_separated_variable():
    def operator_env(values):
        container = one(render(values), "Deployment")["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e.get("value") for e in container["env"]}

    assert "FTJOB_EXTRA_TERMINATION_TAINTS" not in operator_env({})
    env = operator_env({"extraTerminationTaints": "{example.com/going-away,other.io/drain}"})
    assert env["FTJOB_EXTRA_TERMINATION_TAINTS"] == "example.com/going-away,other.io/drain"


def test_rollout_never_overlaps_two_unpeered_operators():
    assert one(render(), "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    ha = one(render(HA_NAMESPACED), "Deployment")["spec"]
    assert ha["replicas"] == 2 and ha["strategy"]["type"] == "RollingUpdate"


def test_each_jobs_network_policy_admits_the_operator_pods_the_chart_describes():
    """The chart makes no NetworkPolicy itself (one cannot name a job); it tells the operator its pods' labels and
    namespace, which each job's policy (operator/ftjob_operator/network_policy.py) admits to the control API."""
    docs = render(namespace=RELEASE_NS)
    assert not find(docs, "NetworkPolicy")
    pod = one(docs, "Deployment")["spec"]["template"]
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    environ = {
        "FTJOB_OPERATOR_POD_LABELS": env["FTJOB_OPERATOR_POD_LABELS"]["value"],
        "POD_NAMESPACE": RELEASE_NS,  # the fieldRef below, as the kubelet resolves it
    }
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    operator = network_policy.operator_pods_from_env(environ)
    assert operator.labels.items() <= pod["metadata"]["labels"].items(), (
        "the policy must select the operator pods"
    )
    ref = render_mod.JobRef("job", "default", "uid")
    peer = network_policy.render_network_policy(ref, operator)["spec"]["ingress"][1]["from"][0]
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": RELEASE_NS}}


def test_metrics_service_pdb_and_servicemonitor_select_the_operator_pods():
    docs = render(HA_NAMESPACED)
    pod = one(docs, "Deployment")["spec"]["template"]
    labels = pod["metadata"]["labels"]
    container = pod["spec"]["containers"][0]
    service = one(docs, "Service")
    assert service["spec"]["selector"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == container["ports"][0]["name"] == "metrics"
    assert container["livenessProbe"]["httpGet"]["port"] == "metrics"
    pdb = one(docs, "PodDisruptionBudget")
    assert (
        pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
        and pdb["spec"]["maxUnavailable"] == 1
    )
    monitor = one(docs, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == [port["name"]]
    for doc in docs:  # the standard labels on everything the chart creates
        meta_labels = doc["metadata"].get("labels", {})
        for key in (
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/managed-by",
            "app.kubernetes.io/version",
            "helm.sh/chart",
        ):
            assert key in meta_labels, f"{doc['kind']}/{doc['metadata']['name']} lacks {key}"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ("replicaCount: two\n", "replicaCount: Invalid type. Expected: integer, given: string"),
        (
            "logLevel: verbose\n",
            'logLevel: logLevel must be one of the following: "debug", "info", "warning", "error"',
        ),
        ("watchNamespaces: team-a\n", "watchNamespaces: Invalid type. Expected: array, given: string"),
        ("clusterWide: 'yes'\n", "clusterWide: Invalid type. Expected: boolean, given: string"),
        ("metrics:\n  port: 80\n", "metrics.port: Must be greater than or equal to 1024"),
        (
            "image:\n  pullPolicy: Sometimes\n",
            "image.pullPolicy: image.pullPolicy must be one of the following",
        ),
        ("replicas: 2\n", "Additional property replicas is not allowed"),
    ],
)
def test_values_of_the_wrong_type_are_refused_with_the_schemas_message(tmp_path, values, message):
    bad = tmp_path / "values.yaml"
    bad.write_text(values)
    proc = helm("template", "t", str(CHART), "-f", str(bad), check=False)
    assert proc.returncode != 0, f"helm accepted {values!r}"
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicaCount": "2"}, "replicaCount > 1 needs peering.enabled=true"),
        ({"watchNamespaces": "null"}, "watchNamespaces is empty: list the namespaces the operator manages"),
        (
            {"metrics.serviceMonitor.enabled": "true", "metrics.service.enabled": "false"},
            "metrics.serviceMonitor.enabled=true needs metrics.service.enabled=true",
        ),
        ({"serviceAccount.create": "false"}, "serviceAccount.name: name an existing ServiceAccount"),
    ],
)
def test_inconsistent_values_fail_with_a_message_that_says_what_to_set(values, message):
    proc = helm("template", "t", str(CHART), *set_args(values), check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_default_values_pass_the_schema_and_every_value_is_in_it():
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.validate(values, schema)
    assert set(values) <= set(schema["properties"]), set(values) - set(schema["properties"])


def documented_leaves(text: str) -> tuple[list[str], list[str]]:
    """(documented, undocumented) leaf keys of values.yaml: a leaf counts as documented when it or one of its
    parents has a `# --` comment right above it (helm-docs' convention)."""
    documented, missing = [], []
    stack: list[tuple[int, str, bool]] = []  # (indent, key, documented)
    pending_doc = False
    lines = text.splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("# --"):
            pending_doc = True
            continue
        if not stripped or stripped.startswith("#") or stripped.startswith("- "):
            continue
        match = re.match(r"^(\s*)([A-Za-z0-9_.-]+):(.*)$", line)
        if not match:
            continue
        indent, key, rest = len(match.group(1)), match.group(2), match.group(3).strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        is_doc = pending_doc or any(d for _, _, d in stack)
        pending_doc = False
        path = ".".join([k for _, k, _ in stack] + [key])
        nxt = next((ln for ln in lines[i + 1 :] if ln.strip() and not ln.strip().startswith("#")), "")
        has_children = (
            not rest and (len(nxt) - len(nxt.lstrip())) > indent and not nxt.strip().startswith("- ")
        )
        if has_children:
            stack.append((indent, key, is_doc))
        else:
            (documented if is_doc else missing).append(path)
    return documented, missing


def test_every_value_has_a_helm_docs_comment():
    documented, missing = documented_leaves((CHART / "values.yaml").read_text())
    assert not missing, f"values without a `# --` comment: {missing}"
    assert {
        "replicaCount",
        "image.tag",
        "peering.enabled",
        "networkPolicy.enabled",
        "clusterWide",
        "tokenKey.existingSecret",
        "resources.limits.cpu",
    } <= set(documented)
    # The checker itself: an undocumented leaf is reported.
    assert documented_leaves("# -- a\na: 1\nb:\n  c: 2\n") == (["a"], ["b.c"])


def test_chart_metadata():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "ftjob"
    pyproject = (ROOT / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1)
    assert chart["appVersion"] == version, "appVersion is the ftjob version the chart deploys by default"
    assert Path(CHART / "templates" / "NOTES.txt").read_text().strip()


def test_probe_path_and_metrics_port_are_served_by_the_operators_metrics_endpoint():
    """The chart probes `probes.path` on the metrics port: the operator's real server must answer both routes."""
    pod = one(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    probe_path = pod["livenessProbe"]["httpGet"]["path"]
    assert pod["readinessProbe"]["httpGet"]["path"] == probe_path
    with socket.socket() as s:  # a free port; the chart's 8080 may be taken on a shared machine
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def scrape() -> dict[str, int]:
        server = metrics_mod.Metrics()
        await server.serve(port, host="127.0.0.1")
        try:
            async with aiohttp.ClientSession() as session:
                codes = {}
                for path in (probe_path, "/metrics"):
                    async with session.get(f"http://127.0.0.1:{port}{path}") as resp:
                        codes[path] = resp.status
                return codes
        finally:
            await server.close()

    assert asyncio.run(scrape()) == {probe_path: 200, "/metrics": 200}
    # The ServiceMonitor names no path, so Prometheus scrapes its default, /metrics, checked just above.
    assert "path" not in one(render(HA_NAMESPACED), "ServiceMonitor")["spec"]["endpoints"][0]
