"""The rendered children match docs/INTERFACES.md and validate against the Kubernetes 1.32 schemas."""

from __future__ import annotations

import kubernetes_validate
import pytest
from ftjob_operator import api, render
from ftjob_trainer import contract
from tj_builders import UID, job

REF = render.JobRef(name="tj", namespace="ns", uid=UID)


def spec(**overrides) -> api.TrainingJobSpec:
    return api.parse_spec(job(**overrides)["spec"])


def worker(**overrides) -> dict:
    return render.render_worker_pod(REF, spec(**overrides), index=3, generation=2, coordinator_ip="10.96.0.7")


def env_of(pod: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


def test_job_ref_and_owner_reference():
    ref = render.JobRef.from_object(job())
    assert ref == REF
    assert ref.owner_reference() == {
        "apiVersion": "ftjob.dev/v1alpha1",
        "kind": "TrainingJob",
        "name": "tj",
        "uid": UID,
        "controller": True,
        "blockOwnerDeletion": True,
    }


@pytest.mark.parametrize(
    "manifest",
    [
        render.render_secret(REF, "t0ken"),
        render.render_service(REF),
        render.render_coordinator_pod(REF, spec(), index=0, generation=0),
        render.render_worker_pod(REF, spec(), index=1, generation=0, coordinator_ip="10.96.0.7"),
        render.render_worker_pod(
            REF,
            spec(
                checkpoint={"volume": {"persistentVolumeClaim": {"claimName": "ck"}}},
                resources={"limits": {"cpu": "2", "memory": "4Gi"}},
                scheduling={
                    "workers": {
                        "nodeSelector": {"ftjob.dev/spot": "true"},
                        "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
                        "priorityClassName": "low",
                    }
                },
                podTemplate={
                    "env": [{"name": "HF_HOME", "value": "/cache"}],
                    "volumes": [{"name": "cache", "emptyDir": {}}],
                    "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
                },
            ),
            index=1,
            generation=0,
            coordinator_ip="10.96.0.7",
        ),
    ],
    ids=["secret", "service", "coordinator", "worker", "worker-with-everything"],
)
def test_manifests_validate_strictly_against_kubernetes_1_32(manifest):
    kubernetes_validate.validate(manifest, "1.32", strict=True)
    meta = manifest["metadata"]
    assert meta["namespace"] == "ns" and meta["ownerReferences"][0]["uid"] == UID
    assert (
        meta["labels"]["ftjob.dev/job-name"] == "tj"
        and meta["labels"]["app.kubernetes.io/managed-by"] == "ftjob-operator"
    )


def test_secret_and_service_names_ports_selector():
    assert render.render_secret(REF, "t0ken")["stringData"] == {"token": "t0ken"}
    with pytest.raises(ValueError, match="non-empty token"):
        render.render_secret(REF, "")
    svc = render.render_service(REF)
    assert svc["metadata"]["name"] == "tj-coordinator"
    assert svc["spec"]["selector"] == {"ftjob.dev/job-name": "tj", "ftjob.dev/role": "coordinator"}
    assert [(p["name"], p["port"]) for p in svc["spec"]["ports"]] == [("rdzv", 29400), ("control", 29401)]


def test_coordinator_pod():
    pod = render.render_coordinator_pod(REF, spec(), index=4, generation=1)
    c = pod["spec"]["containers"][0]
    assert pod["metadata"]["name"] == "tj-coordinator-4"
    assert "command" not in c  # the image's entrypoint (tini) stays PID 1
    assert c["args"] == [
        "python",
        "-m",
        "ftjob_trainer.coordinator",
        "--host=$(POD_IP)",
        "--store-port=29400",
        "--control-port=29401",
    ]
    assert env_of(pod)["FTJOB_TOKEN"] == {"secretKeyRef": {"name": "tj-token", "key": "token"}}
    assert env_of(pod)["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": 29401}
    # a replacement coordinator starts from the newest world epoch its predecessor reported (the fence)
    again = render.render_coordinator_pod(REF, spec(), index=5, generation=1, world_epoch=1796334000123)
    assert again["spec"]["containers"][0]["args"] == [*c["args"], "--min-world-epoch=1796334000123"]
    assert pod["metadata"]["labels"] == {
        "app.kubernetes.io/name": "ftjob",
        "app.kubernetes.io/instance": "tj",
        "app.kubernetes.io/component": "coordinator",
        "app.kubernetes.io/managed-by": "ftjob-operator",
        "ftjob.dev/job-name": "tj",
        "ftjob.dev/role": "coordinator",
        "ftjob.dev/restart-generation": "1",
        "ftjob.dev/pod-index": "4",
    }


def test_worker_pod_torchrun_args_env_and_volumes():
    pod = worker(workers={"min": 2, "max": 4}, processesPerWorker=3, args=["--log-every=5"])
    c = pod["spec"]["containers"][0]
    assert pod["metadata"]["name"] == "tj-worker-3" and pod["spec"]["restartPolicy"] == "Never"
    assert (
        "command" not in c
    )  # the image's entrypoint (tini) stays PID 1 and forwards SIGTERM to the launcher
    assert c["args"] == [
        "python",
        "-m",
        "ftjob_trainer.launch",  # torchrun's flags and program, torchrun's agent (ftjob_trainer/launch.py)
        "--nnodes=2:4",
        "--nproc-per-node=3",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=$(FTJOB_COORDINATOR_ADDR):29400",
        f"--rdzv-id={UID}-g2",
        "--rdzv-conf=is_host=0,last_call_timeout=5,join_timeout=600,keep_alive_interval=1,keep_alive_max_attempt=2",
        f"--max-restarts={render.TORCHRUN_MAX_RESTARTS}",
        "--shutdown-timeout=27",
        "--local-addr=$(POD_IP)",
        "-m",
        "ftjob_trainer.train",
        "--log-every=5",
    ]
    env = env_of(pod)
    assert {k: env[k] for k in ("POD_IP", "POD_NAME", "NODE_NAME")} == {
        "POD_IP": {"fieldRef": {"fieldPath": "status.podIP"}},
        "POD_NAME": {"fieldRef": {"fieldPath": "metadata.name"}},
        "NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}},
    }
    assert env["FTJOB_COORDINATOR_ADDR"] == "10.96.0.7"
    assert env[contract.ENV_COORDINATOR_URL] == "http://10.96.0.7:29401"
    assert env[contract.ENV_JOB_NAME] == "tj" and env[contract.ENV_NAMESPACE] == "ns"
    assert (env["FTJOB_CHECKPOINT_DIR"], env["FTJOB_CHECKPOINT_EVERY"], env["FTJOB_KEEP_LAST"]) == (
        "/checkpoints/ns/tj",
        "10",
        "2",
    )
    assert env[contract.ENV_SAVE_DEADLINE] == "25"
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert (env["FTJOB_MODEL"], env["FTJOB_STEPS"], env["FTJOB_GLOBAL_BATCH_SIZE"], env["FTJOB_SEQ_LEN"]) == (
        "tiny",
        "100",
        "8",
        "128",
    )
    assert pod["spec"]["volumes"][0] == {
        "name": "ftjob-checkpoints",
        "hostPath": {"path": "/tmp/ck", "type": "DirectoryOrCreate"},
    }
    assert {"name": "ftjob-checkpoints", "mountPath": "/checkpoints"} in c["volumeMounts"]
    assert pod["metadata"]["labels"]["ftjob.dev/restart-generation"] == "2"
    assert pod["metadata"]["labels"]["ftjob.dev/role"] == "worker"


@pytest.mark.parametrize("grace,shutdown,deadline", [(10, 7, 5), (20, 17, 15), (30, 27, 25), (120, 108, 102)])
def test_timeouts_derive_from_the_grace_period(grace, shutdown, deadline):
    s = spec(preemption={"gracePeriodSeconds": grace})
    t = render.timing(s)
    assert (t.shutdown_timeout_seconds, t.save_deadline_seconds) == (shutdown, deadline)
    pod = render.render_worker_pod(REF, s, index=1, generation=0, coordinator_ip="10.0.0.1")
    assert pod["spec"]["terminationGracePeriodSeconds"] == grace
    assert f"--shutdown-timeout={shutdown}" in pod["spec"]["containers"][0]["args"]
    assert 0 < deadline < shutdown < grace


def test_secure_defaults_and_the_pod_template_escape_hatch():
    plain = worker()
    assert plain["spec"]["securityContext"]["runAsNonRoot"] is True
    sc = plain["spec"]["containers"][0]["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    custom = worker(
        podTemplate={
            "labels": {"team": "ml", "app.kubernetes.io/name": "mine"},
            "annotations": {"a": "b"},
            "securityContext": {"runAsUser": 0},
            "env": [{"name": "EXTRA", "value": "1"}],
        },
        command=["/app/train.py"],
        trainer={"flags": {"warmup-steps": "5"}},
    )
    assert custom["metadata"]["labels"]["team"] == "ml"
    assert custom["metadata"]["labels"]["app.kubernetes.io/name"] == "ftjob"  # the operator's labels win
    assert custom["metadata"]["annotations"] == {"a": "b"}
    assert custom["spec"]["containers"][0]["securityContext"] == {"runAsUser": 0}
    assert env_of(custom)["EXTRA"] == "1" and env_of(custom)["FTJOB_WARMUP_STEPS"] == "5"
    assert custom["spec"]["containers"][0]["args"][-1] == "/app/train.py"


def test_scheduling_is_per_role():
    s = spec(
        scheduling={
            "workers": {"nodeSelector": {"ftjob.dev/spot": "true"}},
            "coordinator": {"nodeSelector": {"ftjob.dev/spot": "false"}, "priorityClassName": "high"},
        }
    )
    w = render.render_worker_pod(REF, s, index=1, generation=0, coordinator_ip="10.0.0.1")
    c = render.render_coordinator_pod(REF, s, index=0, generation=0)
    assert w["spec"]["nodeSelector"] == {"ftjob.dev/spot": "true"} and "priorityClassName" not in w["spec"]
    assert (
        c["spec"]["nodeSelector"] == {"ftjob.dev/spot": "false"} and c["spec"]["priorityClassName"] == "high"
    )


def test_worker_needs_the_coordinator_ip():
    with pytest.raises(ValueError, match="clusterIP"):
        render.render_worker_pod(REF, spec(), index=1, generation=0, coordinator_ip="")


def test_flag_env_names_follow_the_trainer_contract():
    assert render.flag_env("--warmup-steps") == "FTJOB_WARMUP_STEPS"
    assert render.flag_env("seq-len") == contract.ENV_FLAG_PREFIX + "SEQ_LEN"


def test_default_user_is_the_trainer_images_user():
    # trainer_image/Dockerfile runs as a numeric USER; the pod default must be that same uid:gid.
    from pathlib import Path

    dockerfile = Path(__file__).resolve().parents[2] / "trainer_image" / "Dockerfile"
    users = [line.split()[1] for line in dockerfile.read_text().splitlines() if line.startswith("USER ")]
    assert users, f"no USER line in {dockerfile}"
    uid, gid = (int(x) for x in users[-1].split(":"))
    for pod in (worker(), render.render_coordinator_pod(REF, spec(), index=0, generation=0)):
        sc = pod["spec"]["securityContext"]
        assert (sc["runAsUser"], sc["runAsGroup"], sc["fsGroup"]) == (uid, gid, gid)
        assert sc["runAsNonRoot"] is True


@pytest.mark.parametrize("mount_path", ["/checkpoints", "/checkpoints/"])
def test_jobs_sharing_a_claim_get_their_own_checkpoint_directory(mount_path):
    shared = {"volume": {"persistentVolumeClaim": {"claimName": "team-ck"}}, "mountPath": mount_path}
    dirs = set()
    for name, namespace in (("a", "ns"), ("b", "ns"), ("a", "other")):
        ref = render.JobRef(name=name, namespace=namespace, uid=UID)
        pod = render.render_worker_pod(
            ref, spec(checkpoint=shared), index=1, generation=0, coordinator_ip="10.0.0.1"
        )
        env = env_of(pod)
        assert env["FTJOB_CHECKPOINT_DIR"] == f"/checkpoints/{namespace}/{name}"
        assert pod["spec"]["volumes"][0]["persistentVolumeClaim"] == {"claimName": "team-ck"}
        mount = next(
            m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == "ftjob-checkpoints"
        )
        assert mount["mountPath"] == mount_path  # the whole claim is mounted; the env picks the job's folder
        dirs.add(env["FTJOB_CHECKPOINT_DIR"])
    assert len(dirs) == 3


def test_rendezvous_id_changes_with_the_restart_generation_only():
    def rdzv(index: int, generation: int) -> str:
        pod = render.render_worker_pod(
            REF, spec(), index=index, generation=generation, coordinator_ip="10.0.0.1"
        )
        return next(a for a in pod["spec"]["containers"][0]["args"] if a.startswith("--rdzv-id="))

    assert rdzv(1, 0) == rdzv(7, 0) == f"--rdzv-id={UID}-g0"  # a replacement joins its peers
    assert rdzv(8, 1) == f"--rdzv-id={UID}-g1" != rdzv(1, 0)  # a new generation never meets the old one
    # The per-generation id is not part of the template: a restart does not look like an edited spec.
    assert render.template_hash(REF, spec()) == render.template_hash(REF, spec())


def test_rendering_needs_a_resolved_image():
    unset = api.parse_spec({k: v for k, v in job()["spec"].items() if k != "image"})
    assert unset.image is None
    with pytest.raises(ValueError, match="operator's default trainer image"):
        render.render_worker_pod(REF, unset, index=1, generation=0, coordinator_ip="10.0.0.1")
    with pytest.raises(ValueError, match="operator's default trainer image"):
        render.render_coordinator_pod(REF, unset, index=0, generation=0)


def test_memory_tier_on_the_shm_volume_by_default_sized_when_asked_and_off_when_disabled():
    pod = worker()
    assert env_of(pod)[render.ENV_MEMORY_CHECKPOINT_DIR] == "/dev/shm/ftjob-checkpoints"
    assert {"name": "ftjob-dshm", "emptyDir": {"medium": "Memory"}} in pod["spec"]["volumes"]
    assert {"name": "ftjob-dshm", "mountPath": "/dev/shm"} in pod["spec"]["containers"][0]["volumeMounts"]

    sized = worker(checkpoint={"memoryTier": {"sizeLimit": "24Gi"}})
    assert {"name": "ftjob-dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "24Gi"}} in sized["spec"][
        "volumes"
    ]
    kubernetes_validate.validate(sized, "1.32", strict=True)

    off = worker(checkpoint={"memoryTier": {"enabled": False}})
    assert render.ENV_MEMORY_CHECKPOINT_DIR not in env_of(off)
    with pytest.raises(ValueError):
        spec(checkpoint={"memoryTier": {"sizeLimit": "lots"}})


def object_store_worker(checkpoint: dict) -> dict:
    """A worker of a job whose spec.checkpoint is exactly `checkpoint` (the builder's volume left out)."""
    s = job()["spec"]
    s["checkpoint"] = checkpoint
    return render.render_worker_pod(REF, api.parse_spec(s), index=0, generation=0, coordinator_ip="10.96.0.7")


def test_object_store_checkpoints_mount_nothing_and_bring_the_credentials_secret():
    pod = object_store_worker({"uri": "s3://bucket/runs/", "credentialsSecret": "s3-creds", "keepLast": 3})
    c = pod["spec"]["containers"][0]
    env = env_of(pod)
    assert env["FTJOB_CHECKPOINT_DIR"] == "s3://bucket/runs/ns/tj" and env["FTJOB_KEEP_LAST"] == "3"
    assert c["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]
    assert "ftjob-checkpoints" not in {v["name"] for v in pod["spec"]["volumes"]}
    assert "ftjob-checkpoints" not in {m["name"] for m in c["volumeMounts"]}
    assert render.ENV_MEMORY_CHECKPOINT_DIR not in env, "the memory tier fronts a volume"
    kubernetes_validate.validate(pod, "1.32", strict=True)
    # no secret: the pod's cloud identity or podTemplate.env; a volume job keeps its volume and no envFrom
    assert "envFrom" not in object_store_worker({"uri": "gs://b/p"})["spec"]["containers"][0]
    plain = worker()
    assert "envFrom" not in plain["spec"]["containers"][0]
    assert "ftjob-checkpoints" in {v["name"] for v in plain["spec"]["volumes"]}
    for bad in ({"uri": "s3://b/p", "volume": {"emptyDir": {}}}, {"credentialsSecret": "s3-creds"}):
        with pytest.raises(ValueError):
            object_store_worker(bad)
