"""Each install of the trainer works alone: a fresh virtual environment gets the CPU torch wheel and one extra of
ftjob (no dev, no local), then runs a short job under the real torchrun to exit 0 and resumes it.

pip takes torch from local disk (PIP_FIND_LINKS=/opt/wheels on CI machines); everything else comes from the
package registry, the only network CI's machines reach. The source is copied out of the repository first (as the
image's COPY steps do), so the build leaves nothing in the checkout and the repository's modules shadow nothing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from chart_helpers import ROOT, TORCH_VERSION, base_env, fresh_venv, installed, torch_wheel_here

SOURCES = (
    "pyproject.toml",
    "README.md",
    "operator/ftjob_operator",
    "trainer_image/ftjob_trainer",
    "localcluster/ftjob_local",
)
# A constant learning rate (no warmup, no decay): the schedule does not depend on --steps, so 5 steps then a resume
# to 8 train exactly what 8 straight steps do.
TINY = [
    "--model",
    "tiny",
    "--seq-len",
    "32",
    "--global-batch-size",
    "4",
    "--warmup-steps",
    "0",
    "--min-lr-ratio",
    "1",
]

# A Llama-family transformers config of a few hundred thousand parameters, written here (offline, no hub).
HF_LLAMA = {
    "model_type": "llama",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 172,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 128,
}


def copy_sources(dest: Path) -> Path:
    for rel in SOURCES:
        origin, target = ROOT / rel, dest / rel
        if origin.is_dir():
            shutil.copytree(origin, target, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, target)
    return dest


def venv_with(tmp: Path, extra: str) -> tuple[Path, dict[str, str]]:
    """A fresh venv holding the CPU torch wheel and `ftjob[extra]`, nothing else; (its python, its env)."""
    if not torch_wheel_here():
        pytest.skip(f"no local torch {TORCH_VERSION} wheel (PIP_FIND_LINKS=/opt/wheels on CI machines)")
    python = fresh_venv(tmp / "venv")
    env = base_env(python)
    env.setdefault("PIP_FIND_LINKS", "/opt/wheels")
    env["OMP_NUM_THREADS"] = "1"
    src = copy_sources(tmp / "src")
    for args in (["--upgrade", "pip"], [f"torch=={TORCH_VERSION}"], [f"{src}[{extra}]"]):
        proc = subprocess.run(
            # --no-compile: byte-compiling torch's files took 14 of its 22 s here; Python compiles what it imports
            [str(python), "-m", "pip", "install", "-q", "--no-compile", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert proc.returncode == 0, (
            f"pip install {args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return python, env


def run_trainer(python: Path, env: dict[str, str], cwd: Path, args: list[str], name: str) -> dict:
    """torchrun from the venv, one process; returns the report after asserting exit 0."""
    report = cwd / f"{name}.json"
    proc = subprocess.run(
        [
            str(python.parent / "torchrun"),
            "--standalone",
            "--nproc-per-node=1",
            "-m",
            "ftjob_trainer.train",
            *args,
            "--report",
            str(report),
        ],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (
        f"{name}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    )
    return json.loads(report.read_text())


@pytest.mark.slow
def test_trainer_extra_alone_trains_hashes_and_resumes(tmp_path):
    python, env = venv_with(tmp_path, "trainer")
    have = installed(python)
    assert "torch" in have and "ftjob" in have
    assert "matplotlib" not in have and "pytest" not in have, "only the trainer extra: no local, no dev"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ckpt = str(run_dir / "ckpt")
    first = run_trainer(python, env, run_dir, [*TINY, "--steps", "5", "--checkpoint-dir", ckpt], "first")
    assert (first["exit_code"], first["reason"], first["step"]) == (0, "done", 5)
    assert len(first["state_sha256"]) == 64
    second = run_trainer(python, env, run_dir, [*TINY, "--steps", "8", "--checkpoint-dir", ckpt], "second")
    assert (second["exit_code"], second["step"], second["resumed_from_step"]) == (0, 8, 5)
    assert len(second["state_sha256"]) == 64 and second["state_sha256"] != first["state_sha256"]
    straight = run_trainer(python, env, run_dir, [*TINY, "--steps", "8"], "straight")
    assert straight["state_sha256"] == second["state_sha256"], "the resume is exact"

    # the hf: flag without the hf extra: a configuration error (exit 2) that says how to install it
    model_dir = run_dir / "llama"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(HF_LLAMA))
    no_hf = subprocess.run(  # the trainer alone (torchrun turns any failed worker into its own exit 1)
        [str(python), "-m", "ftjob_trainer.train", "--model", f"hf:{model_dir}", "--steps", "1"],
        env=env,
        cwd=run_dir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert no_hf.returncode == 2, no_hf.stderr[-3000:]
    assert "transformers is not installed; pip install 'ftjob[hf]'" in no_hf.stderr


@pytest.mark.slow
def test_hf_extra_alone_trains_a_transformers_model(tmp_path):
    python, env = venv_with(tmp_path, "hf")
    have = installed(python)
    assert {"torch", "numpy", "transformers", "safetensors"} <= set(have)
    assert "matplotlib" not in have and "pytest" not in have, "only the hf extra (and the trainer it names)"
    run_dir = tmp_path / "run"
    (run_dir / "llama").mkdir(parents=True)
    (run_dir / "llama" / "config.json").write_text(json.dumps(HF_LLAMA))
    env = {**env, "HF_HUB_OFFLINE": "1"}
    args = ["--model", f"hf:{run_dir / 'llama'}", *TINY[2:], "--checkpoint-dir", str(run_dir / "ckpt")]
    first = run_trainer(python, env, run_dir, [*args, "--steps", "3"], "first")
    assert (first["exit_code"], first["step"]) == (0, 3) and len(first["state_sha256"]) == 64
    second = run_trainer(python, env, run_dir, [*args, "--steps", "5"], "second")
    assert (second["exit_code"], second["step"], second["resumed_from_step"]) == (0, 5, 3)


@pytest.mark.slow
def test_s3_extra_alone_checkpoints_to_an_s3_server_and_resumes(tmp_path):
    from support.s3_server import S3Server

    python, env = venv_with(tmp_path, "s3")
    assert {"torch", "numpy", "s3fs"} <= set(installed(python))
    server = S3Server(tmp_path)
    try:
        env = {**env, **server.env()}
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        args = [*TINY, "--checkpoint-dir", server.bucket() + "/job"]
        first = run_trainer(python, env, run_dir, [*args, "--steps", "3"], "first")
        assert first["last_checkpoint"].startswith("s3://") and first["step"] == 3
        second = run_trainer(python, env, run_dir, [*args, "--steps", "5"], "second")
        assert (second["exit_code"], second["step"], second["resumed_from_step"]) == (0, 5, 3)
    finally:
        server.close()


@pytest.mark.slow
def test_gcs_extra_alone_opens_gs_urls(tmp_path):
    python, env = venv_with(tmp_path, "gcs")
    probe = subprocess.run(  # no GCS server offline: the config check that gs:// has its filesystem
        [
            str(python),
            "-c",
            "from ftjob_trainer.config import check_store_url; check_store_url('gs://bucket/prefix'); print('ok')",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert probe.returncode == 0 and probe.stdout.strip() == "ok", probe.stderr[-3000:]
