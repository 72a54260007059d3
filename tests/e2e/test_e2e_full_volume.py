"""A checkpoint volume that fills up while the job trains, on the local cluster with the real trainer and operator.

The trainer drops the periodic saves that do not fit and trains on; the job shows it (condition CheckpointFailing,
a CheckpointSaveFailed Warning event, status.lastCheckpointFailure) with the trainer's error, which says the volume
is full. Given room, the next save commits and the condition clears while the job trains on. The volume is a real tmpfs
with room for one tiny checkpoint (22 MB) and not two; mounting it needs root (CI runs as root)."""

from __future__ import annotations

import pytest
from e2e_lib import apply, job_status, pvc_dir, tiny_job, wait_until
from support.tmpfs import grow, small_tmpfs

pytestmark = pytest.mark.slow
NAME = "full-volume"
STEPS = (
    100_000  # trains until the test deletes it: the operator polls progress every 10 s, whatever the speed
)


def _condition(st: dict, type_: str) -> dict:
    return next((c for c in st.get("conditions", []) if c["type"] == type_), {})


@pytest.fixture
def small_volume(session):
    with small_tmpfs(pvc_dir(session, NAME), "30m") as folder:  # one tiny checkpoint (22 MB) fits, two do not
        yield folder


def test_a_full_checkpoint_volume_shows_on_the_job_until_a_save_fits_again(session, small_volume):
    docs = tiny_job(NAME, steps=STEPS, workers=(1, 1))
    docs[1]["spec"]["checkpoint"]["everySteps"] = 4
    apply(session, docs)

    def failing():
        st = job_status(session, NAME)
        return _condition(st, "CheckpointFailing").get("status") == "True" and st

    st = wait_until(session, failing, 240, "condition CheckpointFailing=True", job=NAME)
    dropped, kept = st["lastCheckpointFailure"], st["lastCheckpoint"]
    assert dropped["kind"] == "periodic" and dropped["step"] > kept["step"], st
    assert dropped["kept"] == kept["path"], st
    message = _condition(st, "CheckpointFailing")["message"]
    assert message.startswith(f"checkpoint of step {dropped['step']} (periodic) was not saved"), message
    assert "(full: give the checkpoint volume room for --keep-last + 1 checkpoints)" in message, message
    assert st["phase"] == "Running" and st["failures"] == 0, (
        st
    )  # it trains on: a dropped save is not a failure
    warnings = [
        e
        for e in session.events()
        if e.get("reason") == "CheckpointSaveFailed" and e["involvedObject"].get("name") == NAME
    ]
    assert warnings and all(e["type"] == "Warning" for e in warnings), warnings

    grow(small_volume, "200m")

    def saved():
        st = job_status(session, NAME)
        return _condition(st, "CheckpointFailing").get("status") == "False" and st

    st = wait_until(session, saved, 240, "condition CheckpointFailing=False", job=NAME)
    cleared = _condition(st, "CheckpointFailing")
    assert cleared["reason"] == "CheckpointSaved", cleared
    assert st["lastCheckpoint"]["step"] > st["lastCheckpointFailure"]["step"], st

    assert st["phase"] == "Running" and st["failures"] == 0, st
    session.kubectl("delete", "trainingjob", NAME, "--wait=false")
