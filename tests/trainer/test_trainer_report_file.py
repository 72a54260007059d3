"""The --report file is an account of the run, not its state: a write that fails (a full volume, which it often
shares with the checkpoints) is warned about once and training goes on; no half-written copy stays."""

from __future__ import annotations

import json
import logging


def test_a_report_that_cannot_be_written_is_warned_once_and_written_when_it_can(tmp_path, caplog):
    from ftjob_trainer.config import parse_args
    from ftjob_trainer.reporting import Reporter

    path = tmp_path / "report.json"
    path.mkdir()  # a folder where the file should be: os.replace onto it fails, as a write to a full disk would
    (path / "in-the-way").touch()
    report = Reporter(parse_args(["--report", str(path)], env={}), 0, 1)
    with caplog.at_level(logging.WARNING, logger="ftjob_trainer.reporting"):
        report.write()
        report.doc["step"] = 3
        report.write()
    warnings = [r.getMessage() for r in caplog.records if r.name == "ftjob_trainer.reporting"]
    assert len(warnings) == 1 and f"could not write the report {path}" in warnings[0], warnings
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"], "the temporary copy must go"

    (path / "in-the-way").unlink()
    path.rmdir()  # room again: the next write lands
    report.write()
    assert json.loads(path.read_text())["step"] == 3
    assert not report.write_failing
