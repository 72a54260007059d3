"""The chart's metrics documentation and its Grafana dashboard (issue 13): the dashboard ConfigMap renders only when
enabled, carries the sidecar's label and the dashboard file as is, queries only series the operator serves, and the
README lists every series."""

from __future__ import annotations

import json
import re

import kubernetes_validate
from chart_helpers import CHART, find, helm, one, render, set_args
from ftjob_operator.metrics import SERIES

DASHBOARD = CHART / "dashboards" / "ftjob.json"
ENABLED = {"metrics.dashboard.enabled": "true"}
SUFFIXES = ("_bucket", "_count", "_sum")


def _configmaps(docs: list[dict]) -> list[dict]:
    return [d for d in find(docs, "ConfigMap") if "grafana_dashboard" in d["metadata"].get("labels", {})]


def test_the_dashboard_configmap_renders_only_when_enabled():
    assert not _configmaps(render())
    docs = render(ENABLED)
    (cm,) = _configmaps(docs)
    assert (
        cm["metadata"]["name"] == "t-ftjob-dashboard" and cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    )
    assert json.loads(cm["data"]["ftjob.json"]) == json.loads(DASHBOARD.read_text())
    kubernetes_validate.validate(cm, "1.32.0", strict=True)
    relabelled = one(
        render(
            {
                **ENABLED,
                "metrics.dashboard.labels.team": "ml",
                "metrics.dashboard.annotations.folder": "ftjob",
            }
        ),
        "ConfigMap",
        name="t-ftjob-dashboard",
    )
    assert relabelled["metadata"]["labels"]["team"] == "ml" and relabelled["metadata"]["annotations"] == {
        "folder": "ftjob"
    }
    for values in ({}, ENABLED):
        proc = helm("lint", "--strict", str(CHART), *set_args(values), check=False)
        assert proc.returncode == 0 and "0 chart(s) failed" in proc.stdout, proc.stdout + proc.stderr


def test_the_dashboard_queries_only_series_the_operator_serves():
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [
        v["query"]["query"] for v in dashboard["templating"]["list"] if isinstance(v.get("query"), dict)
    ]
    used = {name for e in exprs for name in re.findall(r"\bftjob_[a-z_]+", e)}
    served = set(SERIES) | {s + suffix for s in SERIES for suffix in SUFFIXES}
    assert used and used <= served, used - served
    # Each per-job series of the issue has a panel.
    for name in (
        "ftjob_job_progress_ratio",
        "ftjob_job_eta_seconds",
        "ftjob_job_goodput_ratio",
        "ftjob_job_tokens_per_second",
        "ftjob_job_checkpoint_age_seconds",
        "ftjob_job_lost_seconds_total",
        "ftjob_recovery_seconds_bucket",
    ):
        assert name in used, name
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def test_the_readme_and_values_document_every_series():
    readme = (CHART / "README.md").read_text()
    table = set(re.findall(r"^\| `(ftjob_[a-z_]+)` \|", readme, re.M))
    assert table == set(SERIES)
    values = (CHART / "values.yaml").read_text()
    missing = [s for s in SERIES if s not in values]
    assert not missing, f"values.yaml's metrics.service comment does not name {missing}"
