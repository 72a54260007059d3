"""The two Dockerfiles: hadolint, their shape (exec-form entrypoints, non-root, pinned bases), one requirements
source, and their install steps replayed in a fresh virtual environment (no docker engine exists here)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from chart_helpers import (
    ROOT,
    TORCH_VERSION,
    base_env,
    canonical,
    fresh_venv,
    installed,
    tool,
    torch_wheel_here,
)
from packaging.requirements import Requirement

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

OPERATOR = ROOT / "Dockerfile"
TRAINER = ROOT / "trainer_image" / "Dockerfile"
LOCK = ROOT / "requirements" / "operator.txt"
TRAINER_LOCK = ROOT / "requirements" / "trainer.txt"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)


def parse(dockerfile: Path) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages): instructions with continuation lines joined and comments dropped."""
    logical, buf = [], ""
    for line in dockerfile.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        logical.append(buf + line)
        buf = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.strip().partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            parts = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), parts[0])
            stages.append(Stage(base, parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None))
        elif not stages and keyword == "ARG":
            name, _, default = rest.partition("=")
            args[name] = default
        else:
            stages[-1].instructions.append((keyword, rest))
    return args, stages


def last(stage: Stage, keyword: str) -> str:
    found = [rest for kw, rest in stage.instructions if kw == keyword]
    assert found, f"no {keyword} in the stage from {stage.base}"
    return found[-1]


# --- lint and shape ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dockerfile", [OPERATOR, TRAINER], ids=["operator", "trainer"])
def test_hadolint_passes(dockerfile):
    proc = subprocess.run(
        [tool("hadolint"), "--config", str(ROOT / ".hadolint.yaml"), "--no-color", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_config_still_fails_on_findings(tmp_path):
    """Guards .hadolint.yaml: a shell-form entrypoint and an unpinned pip install must still fail."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11.11-slim\nRUN pip install requests\nENTRYPOINT ftjob operator\n")
    proc = subprocess.run(
        [tool("hadolint"), "--config", str(ROOT / ".hadolint.yaml"), "--no-color", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "DL3013" in proc.stdout and "DL3025" in proc.stdout


def test_operator_image_shape():
    _, stages = parse(OPERATOR)
    assert len(stages) == 2, "one build stage and one slim final stage"
    build, final = stages
    assert build.name == "build"
    for stage in stages:
        assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim(-\w+)?", stage.base), (
            f"unpinned or non-slim base {stage.base}"
        )
    assert final.base == build.base
    assert ("COPY", "--from=build /opt/ftjob /opt/ftjob") in final.instructions
    assert not [i for i in final.instructions if i[0] == "RUN" and "pip" in i[1]], (
        "the final stage installs nothing"
    )
    assert json.loads(last(final, "ENTRYPOINT")) == ["ftjob", "operator"]
    assert_numeric_non_root(last(final, "USER"))


def test_trainer_image_shape():
    args, (stage,) = parse(TRAINER)
    assert re.fullmatch(r"pytorch/pytorch:\d+\.\d+\.\d+-cuda[\d.]+-cudnn\d+-runtime", args["BASE_IMAGE"])
    assert stage.base == args["BASE_IMAGE"]
    base_torch = re.match(r"pytorch/pytorch:(\d+\.\d+)", args["BASE_IMAGE"]).group(1)
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "trainer"
    ]
    (torch_req,) = [Requirement(r) for r in extra if Requirement(r).name == "torch"]
    assert torch_req.specifier.contains(f"{base_torch}.0"), "the base's torch must satisfy the trainer extra"
    # tini forwards SIGTERM to torchrun; exec form, so no shell sits between them.
    entrypoint = json.loads(last(stage, "ENTRYPOINT"))
    assert entrypoint == ["/usr/bin/tini", "--"]
    assert json.loads(last(stage, "CMD"))[0] != "sh"
    assert_numeric_non_root(last(stage, "USER"))
    assert "CPU variant" in TRAINER.read_text() and "BASE_IMAGE=python:" in TRAINER.read_text()


def assert_numeric_non_root(user: str) -> None:
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, (
        f"USER {user}: numeric and non-zero, so runAsNonRoot can be verified"
    )


def test_one_requirements_source_the_lock_pins_pyprojects_base_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins: dict[str, str] = {}
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith("#"):
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"{line}: the lock pins exact versions"
            pins[canonical(req.name)] = spec.version
    for dep in project["dependencies"]:
        req = Requirement(dep)
        assert canonical(req.name) in pins, (
            f"{req.name} is in pyproject.toml but not in {LOCK.name}: run lock.py"
        )
        assert req.specifier.contains(pins[canonical(req.name)]), f"{LOCK.name} pins {req.name} outside {req}"
    assert "torch" not in pins, "the operator image must not pull torch"
    # Both Dockerfiles install from pyproject.toml, each constrained by its lock (lock.py writes both).
    for dockerfile, lock in ((OPERATOR, LOCK), (TRAINER, TRAINER_LOCK)):
        installs = [
            rest
            for _, stages in [parse(dockerfile)]
            for s in stages
            for kw, rest in s.instructions
            if kw == "RUN" and "pip install" in rest
        ]
        assert len(installs) == 1 and f"--constraint requirements/{lock.name}" in installs[0], dockerfile


def test_the_trainer_lock_pins_the_base_and_the_installed_extras_and_leaves_torch_to_the_base_image():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = lock_pins(TRAINER_LOCK)
    assert "torch" not in pins, "torch is the base image's"
    (install,) = [
        rest for kw, rest in parse(TRAINER)[1][0].instructions if kw == "RUN" and "pip install" in rest
    ]
    installed_extras = re.search(r'"\.\[([\w,]+)\]"', install).group(1).split(",")
    wanted = list(project["dependencies"]) + [
        r for e in installed_extras for r in project["optional-dependencies"][e]
    ]
    for dep in map(Requirement, wanted):
        if dep.name in ("torch", "ftjob"):
            continue
        assert canonical(dep.name) in pins, f"{dep.name} is not in {TRAINER_LOCK.name}: run lock.py"
        assert dep.specifier.contains(pins[canonical(dep.name)]), (
            f"{TRAINER_LOCK.name} pins {dep.name} outside {dep}"
        )


def bytecode_of(python: Path, package: str, source: str) -> Path:
    """Where `python` keeps the compiled bytecode of the `source` file of `package` (found without importing it,
    which would compile what it imports)."""
    code = (
        "import importlib.util as u, os; "
        f"print(u.cache_from_source(os.path.join(os.path.dirname(u.find_spec({package!r}).origin), {source!r})))"
    )
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return Path(done.stdout.strip())


def lock_pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            req = Requirement(line)
            pins[canonical(req.name)] = next(iter(req.specifier)).version
    return pins


# --- the install steps, replayed -----------------------------------------------------------------------------------

SYSTEM_STEPS = ("apt-get", "groupadd", "useradd")  # need root and the image's distribution; not replayed


def replay(
    dockerfile: Path, stage: Stage, fake_root: Path, env: dict[str, str], keep: tuple[str, ...] = ()
) -> list[str]:
    """Run one stage's COPY/ENV/WORKDIR/RUN steps with `/` mapped to fake_root; returns the RUN steps run.
    Variables named in `keep` hold paths already mapped under fake_root, so their ENV lines are not applied."""
    workdir = fake_root
    ran = []
    for keyword, rest in stage.instructions:
        if keyword == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                if key not in keep:
                    env[key] = expand(value, env)
        elif keyword == "ARG":
            key, _, default = rest.partition("=")
            env.setdefault(key, default.strip('"'))
        elif keyword == "WORKDIR":
            workdir = fake_root / rest.lstrip("/")
            workdir.mkdir(parents=True, exist_ok=True)
        elif keyword == "COPY":
            assert not rest.startswith("--from"), "replay covers build steps only"
            *sources, dest = rest.split()
            for src in sources:
                target = (workdir / dest) if not dest.startswith("/") else fake_root / dest.lstrip("/")
                origin = ROOT / src
                if origin.is_dir():
                    shutil.copytree(
                        origin, target, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
                    )
                else:
                    target = target / origin.name if dest.endswith("/") else target
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(origin, target)
        elif keyword == "RUN":
            if rest.lstrip().startswith(SYSTEM_STEPS):
                continue
            assert "pip install" in rest or "-m venv" in rest, (
                f"{dockerfile.name}: teach this test the step {rest!r}"
            )
            proc = subprocess.run(
                ["bash", "-o", "pipefail", "-c", rest],
                cwd=workdir,
                env=env,
                capture_output=True,
                text=True,
                timeout=900,
            )
            assert proc.returncode == 0, (
                f"{dockerfile.name} step failed: {rest}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            )
            ran.append(rest)
    return ran


def expand(value: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), ""), value)


@pytest.mark.slow
def test_operator_install_steps_succeed_in_a_fresh_venv_without_torch(tmp_path):
    _, (build, _) = parse(OPERATOR)
    base_python = fresh_venv(tmp_path / "image-python")  # stands in for the base image's python
    env = base_env(base_python)
    env["VENV"] = str(tmp_path / "opt" / "ftjob")  # Dockerfile's ENV VENV=/opt/ftjob, under the fake root
    ran = replay(OPERATOR, build, tmp_path, env, keep=("VENV",))
    assert any("pip install" in r for r in ran)
    venv_python = tmp_path / "opt" / "ftjob" / "bin" / "python"
    probe = subprocess.run(
        [
            str(venv_python),
            "-c",
            "import importlib.util as u, ftjob_operator.cli, kopf; print(u.find_spec('torch'))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "None", "torch must be absent from the operator image"
    help_out = subprocess.run(
        [str(venv_python.parent / "ftjob"), "operator", "--help"], capture_output=True, text=True, timeout=120
    )
    assert help_out.returncode == 0 and "--peering" in help_out.stdout, help_out.stderr
    freeze = installed(venv_python)
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            assert freeze.get(canonical(name)) == version, (
                f"{name}: installed {freeze.get(canonical(name))}, lock {version}"
            )


@pytest.mark.slow
def test_trainer_install_steps_keep_the_base_images_torch(tmp_path):
    if not torch_wheel_here():
        pytest.skip(f"no local torch {TORCH_VERSION} wheel (PIP_FIND_LINKS=/opt/wheels on CI machines)")
    _, (stage,) = parse(TRAINER)
    python = fresh_venv(tmp_path / "image-python")
    env = base_env(python)
    env.setdefault("PIP_FIND_LINKS", "/opt/wheels")
    # The base image: torch already installed (the CPU build here, the CUDA build in pytorch/pytorch).
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-compile", f"torch=={TORCH_VERSION}"],
        env=env,
        check=True,
        timeout=900,
    )
    before = installed(python)["torch"]
    # a base image whose torch (and sympy, which came with it) has no bytecode: installed --no-compile
    dynamo_pyc, sympy_pyc = (
        bytecode_of(python, "torch", "_dynamo/__init__.py"),
        bytecode_of(python, "sympy", "core/expr.py"),
    )
    assert not dynamo_pyc.exists() and not sympy_pyc.exists()
    replay(TRAINER, stage, tmp_path, env)
    after = installed(python)
    assert after["torch"] == before, f"pip replaced the base image's torch {before} with {after['torch']}"
    assert dynamo_pyc.exists(), "the image must hold torch's bytecode: every worker would compile it at start"
    # sympy is not torch's: its bytecode comes from importing what the launcher's forkserver imports
    assert sympy_pyc.exists(), "the image must hold the bytecode of what torch._dynamo imports (sympy)"
    probe = subprocess.run(
        [
            str(python),
            "-c",
            "import ftjob_trainer.contract as c, numpy, torch; print(c.EXIT_RESTART, torch.__version__)",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["75", before]
    assert (python.parent / "torchrun").exists()
