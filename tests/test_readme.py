"""The README's opening TrainingJob is what users copy first: it must be a valid job under the API models."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from ftjob_operator import api

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_is_a_valid_trainingjob():
    block = re.search(r"```yaml\n(.*?)```", README.read_text(), re.S)
    assert block, "README.md lost its example TrainingJob"
    doc = yaml.safe_load(block.group(1))
    assert (doc["apiVersion"], doc["kind"]) == (api.API_VERSION, api.KIND)
    spec = api.TrainingJobSpec.model_validate(doc["spec"])
    assert (spec.workers.min, spec.workers.max) == (2, 4)


def test_readme_names_the_two_commands_ci_runs():
    text = README.read_text()
    ci = (README.parent / ".ci" / "run").read_text()
    assert "./dev demo" in text and "./dev test" in text
    assert "exec ./dev test" in ci, ".ci/run must call the README's test command"
