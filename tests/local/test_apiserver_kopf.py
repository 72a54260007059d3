"""kopf (the operator framework ftjob uses) against the embedded API server: discovery of a CRD, watching, status
patches through the status subresource, events, and finalizers on deletion."""

from __future__ import annotations

import textwrap

import kopf
import pytest
from apiserver_client_testlib import WIDGET_CRD
from ftjob_local.apiserver import start_in_thread
from kopf.testing import KopfRunner
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.wait import wait_until

pytestmark = pytest.mark.slow
ARGS = ("test.ftjob.dev", "v1", "default", "widgets")

OPERATOR = textwrap.dedent("""\
    import os
    import kopf

    @kopf.on.login()
    def login(**_):
        return kopf.ConnectionInfo(server=os.environ["FTJOB_TEST_APISERVER"], insecure=True)

    @kopf.on.startup()
    def tune(settings: kopf.OperatorSettings, **_):
        settings.watching.server_timeout = 30

    @kopf.on.create("test.ftjob.dev", "v1", "widgets")
    def created(body, patch, **_):
        kopf.info(body, reason="Created", message="widget created")
        patch.status["phase"] = "Created"

    @kopf.on.update("test.ftjob.dev", "v1", "widgets", field="spec.mode")
    def mode_changed(new, patch, **_):
        patch.status["phase"] = "Mode-" + new

    @kopf.on.delete("test.ftjob.dev", "v1", "widgets")
    def deleted(name, **_):
        pass
    """)


@pytest.fixture
def own_registry():
    """kopf's default registry, fresh for this test: handlers that other tests imported into it (ftjob's operator,
    whose startup needs its own runtime) must not run beside the widgets' operator; the old one comes back after."""
    previous = kopf.get_default_registry()
    registry = kopf.OperatorRegistry()
    kopf.set_default_registry(registry)
    yield registry
    kopf.set_default_registry(previous)


def test_kopf_operator_reconciles_widgets(tmp_path, monkeypatch, own_registry):
    handle = start_in_thread(str(tmp_path / "state"))
    operator = tmp_path / "operator.py"
    operator.write_text(OPERATOR)
    monkeypatch.setenv("FTJOB_TEST_APISERVER", handle.url)
    cfg = client.Configuration()
    cfg.host = handle.url
    api = client.ApiClient(cfg)
    try:
        client.ApiextensionsV1Api(api).create_custom_resource_definition(WIDGET_CRD)
        co = client.CustomObjectsApi(api)
        with KopfRunner(
            ["run", "--standalone", "--all-namespaces", str(operator)], timeout=60, registry=own_registry
        ) as runner:
            co.create_namespaced_custom_object(
                *ARGS,
                {
                    "apiVersion": "test.ftjob.dev/v1",
                    "kind": "Widget",
                    "metadata": {"name": "w"},
                    "spec": {"image": "i"},
                },
            )

            def phase():
                return (co.get_namespaced_custom_object(*ARGS, "w").get("status") or {}).get("phase")

            wait_until(lambda: phase() == "Created", 30, "kopf's create handler", interval=0.05)
            obj = co.get_namespaced_custom_object(*ARGS, "w")
            assert obj["metadata"]["finalizers"] == ["kopf.zalando.org/KopfFinalizerMarker"]
            core = client.CoreV1Api(api)
            wait_until(
                lambda: any(
                    e.involved_object.name == "w" and "widget created" in e.message
                    for e in core.list_namespaced_event("default").items
                ),
                30,
                "kopf's event",
                interval=0.05,
            )

            co.patch_namespaced_custom_object(*ARGS, "w", {"spec": {"mode": "slow"}})
            wait_until(lambda: phase() == "Mode-slow", 30, "kopf's update handler", interval=0.05)

            co.delete_namespaced_custom_object(*ARGS, "w")

            def gone():
                try:
                    co.get_namespaced_custom_object(*ARGS, "w")
                    return False
                except ApiException as e:
                    return e.status == 404

            wait_until(gone, 30, "kopf to remove its finalizer", interval=0.05)
        assert runner.exit_code == 0, runner.output
        assert runner.exception is None
        assert "Handler 'created' succeeded" in runner.output
        assert "Handler 'deleted' succeeded" in runner.output
    finally:
        api.close()
        handle.stop()
