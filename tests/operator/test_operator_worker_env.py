"""The worker env and args the operator renders mean what the spec says to the trainer's own parser.

ftjob_trainer.config is torch-free on purpose, so this cross-part check runs without torch.
"""

from __future__ import annotations

import pytest
from ftjob_operator import api, render
from ftjob_trainer import config
from tj_builders import UID, job

REF = render.JobRef(name="tj", namespace="ns", uid=UID)


def rendered(**overrides) -> tuple[list[str], dict[str, str]]:
    spec = api.parse_spec(job(**overrides)["spec"])
    pod = render.render_worker_pod(REF, spec, index=1, generation=0, coordinator_ip="10.96.0.7")
    c = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    args = c["args"]
    program_at = (
        args.index("ftjob_trainer.train") + 1
    )  # what follows `-m ftjob_trainer.train` goes to the trainer
    return args[program_at:], env


def test_every_trainer_variable_the_operator_sets_is_a_trainer_flag():
    _, env = rendered(
        trainer={"learningRate": 0.001, "seed": 7, "data": "synthetic"}, checkpoint={"asyncSave": True}
    )
    known = set(config.all_flags().values())
    operator_only = {"FTJOB_COORDINATOR_ADDR", "FTJOB_JOB_NAME", "FTJOB_NAMESPACE"}  # not trainer flags
    ftjob_vars = {k for k in env if k.startswith("FTJOB_")} - operator_only
    assert ftjob_vars <= known, f"unknown to the trainer: {sorted(ftjob_vars - known)}"


def test_the_trainer_parses_the_rendered_spec():
    argv, env = rendered(
        trainer={
            "model": "tiny",
            "steps": 77,
            "globalBatchSize": 4,
            "seqLen": 32,
            "learningRate": 0.001,
            "seed": 7,
        },
        checkpoint={"everySteps": 5, "keepLast": 3, "mountPath": "/ck", "asyncSave": True},
        preemption={"gracePeriodSeconds": 40},
        args=["--log-every=3"],
    )
    cfg = config.parse_args(argv, env)
    assert (cfg.model.name, cfg.run.steps, cfg.run.log_every) == ("tiny", 77, 3)
    assert (cfg.data.global_batch_size, cfg.data.seq_len, cfg.data.seed) == (4, 32, 7)
    assert cfg.optimizer.lr == 0.001
    ck = cfg.checkpoint
    assert (ck.checkpoint_dir, ck.checkpoint_every, ck.keep_last, ck.async_checkpoint) == (
        "/ck/ns/tj",
        5,
        3,
        True,
    )
    assert (
        ck.save_deadline_seconds
        == render.timing(
            api.parse_spec(job(preemption={"gracePeriodSeconds": 40})["spec"])
        ).save_deadline_seconds
    )
    assert cfg.preemption.coordinator_url == "http://10.96.0.7:29401"


def test_extra_trainer_flags_reach_the_trainer():
    argv, env = rendered(trainer={"flags": {"warmup-steps": "3", "grad-accum": "2"}})
    cfg = config.parse_args(argv, env)
    assert (cfg.optimizer.warmup_steps, cfg.data.grad_accum) == (3, 2)


def test_torchrun_accepts_the_rendered_arguments():
    pytest.importorskip("torch", reason="torch is not installed (the operator itself needs none)")
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config
    from torch.distributed.run import get_args_parser

    spec = api.parse_spec(job(workers={"min": 2, "max": 3}, processesPerWorker=2)["spec"])
    pod = render.render_worker_pod(REF, spec, index=1, generation=4, coordinator_ip="10.96.0.7")
    # Kubernetes expands $(VAR) from the container env before torchrun sees the arguments.
    args = [
        a.replace("$(FTJOB_COORDINATOR_ADDR)", "10.96.0.7").replace("$(POD_IP)", "127.10.0.5")
        for a in pod["spec"]["containers"][0]["args"]
    ]
    # No command: the image's entrypoint (tini) runs the args: ftjob's launcher, then torchrun's own arguments.
    assert "command" not in pod["spec"]["containers"][0] and args[:3] == render.LAUNCHER
    ns = get_args_parser().parse_args(args[3:])
    assert (ns.nnodes, ns.nproc_per_node, ns.rdzv_backend) == ("2:3", "2", "c10d")
    assert (
        ns.rdzv_endpoint == "10.96.0.7:29400" and ns.rdzv_id == f"{UID}-g4" and ns.local_addr == "127.10.0.5"
    )
    assert float(ns.shutdown_timeout) == render.timing(spec).shutdown_timeout_seconds
    assert (ns.module, ns.training_script) == (True, "ftjob_trainer.train")
    conf = _parse_rendezvous_config(ns.rdzv_conf)
    params = RendezvousParameters("c10d", ns.rdzv_endpoint, ns.rdzv_id, 2, 3, **conf)
    assert params.get_as_bool("is_host") is False
    assert [
        params.get_as_int(k)
        for k in ("last_call_timeout", "join_timeout", "keep_alive_interval", "keep_alive_max_attempt")
    ] == [
        5,
        600,
        1,
        2,
    ]
