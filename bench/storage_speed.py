"""Write and read speed of a checkpoint on each storage choice, with the real checkpointer (world of one):
a node-local folder (disk), the pod memory tier's medium (/dev/shm) and an S3-compatible object store.

    python bench/storage_speed.py --s3-endpoint http://127.0.0.1:PORT [--model 125m] [--dir /tmp]

The object store is whatever AWS_ENDPOINT_URL / --s3-endpoint points at (the README's figures: moto's server on
the same machine, which measures the protocol path, not a cloud's bandwidth). Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer_image"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from ftjob_trainer.checkpoint import Checkpointer  # noqa: E402
from ftjob_trainer.config import ModelConfig, OptimizerConfig, ParallelConfig  # noqa: E402
from ftjob_trainer.engine import Engine, build_model  # noqa: E402


def engine(model: str) -> Engine:
    cfg = ModelConfig(name=model)
    e = Engine(
        build_model(cfg, torch.device("cpu"), seed=0),
        device=torch.device("cpu"),
        model_cfg=cfg,
        opt_cfg=OptimizerConfig(),
        par_cfg=ParallelConfig(),
        total_steps=10,
    )
    tokens = torch.randint(0, e.vocab_size, (1, 17))
    e.train_step([(tokens[:, :-1], tokens[:, 1:])])  # the optimizer's moments exist after one step
    return e


def measure(root: str, eng: Engine, fresh: Engine) -> dict:
    ckpt = Checkpointer(root, keep_last=1, engine=eng, rank=0, world_size=1)
    t = time.perf_counter()
    path = ckpt.save(1, {"scheduler": eng.scheduler.state_dict()})
    write = time.perf_counter() - t
    nbytes = ckpt.store.nbytes(path)
    t = time.perf_counter()
    loaded = Checkpointer(root, keep_last=1, engine=fresh, rank=0, world_size=1).load_latest()
    read = time.perf_counter() - t
    assert loaded is not None and loaded.step == 1
    return {
        "bytes": nbytes,
        "write_s": round(write, 3),
        "read_s": round(read, 3),
        "write_MBps": round(nbytes / write / 1e6, 1),
        "read_MBps": round(nbytes / read / 1e6, 1),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="125m")
    p.add_argument("--dir", default=tempfile.gettempdir(), help="the disk folder to measure")
    p.add_argument("--s3-endpoint", default=os.environ.get("AWS_ENDPOINT_URL"))
    p.add_argument("--bucket", default=None, help="an existing bucket (default: create one)")
    a = p.parse_args()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    eng, fresh = engine(a.model), engine(a.model)
    out: dict = {"model": a.model, "cpus": os.cpu_count(), "torch": torch.__version__}
    for name, parent in (("disk", a.dir), ("dev_shm", "/dev/shm")):
        root = tempfile.mkdtemp(prefix="ftjob-speed-", dir=parent)
        try:
            out[name] = measure(root, eng, fresh)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    if a.s3_endpoint:
        os.environ["AWS_ENDPOINT_URL"] = a.s3_endpoint
        bucket = a.bucket or f"speed-{uuid.uuid4().hex[:8]}"
        if not a.bucket:
            import boto3

            boto3.client("s3", endpoint_url=a.s3_endpoint).create_bucket(Bucket=bucket)
        out["s3"] = measure(f"s3://{bucket}/speed", eng, fresh)
        out["s3"]["endpoint"] = a.s3_endpoint
    print(json.dumps(out, indent=1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
