"""Trainer errors reported to the coordinator (POST /v1/error) count as failures (losses.trainer_error).

torchrun restarts a crashed trainer inside its pod (--max-restarts stays huge so that exit 75 always restarts), so
the pod never fails; the error report in the coordinator's progress is the only sign. The progress documents here
come from the real coordinator's State (the HTTP half, torch-free), one per coordinator pod: a recreated
coordinator starts with an empty memory, as the real one does.
"""

from __future__ import annotations

import time

import pytest
from ftjob_operator import conditions as cond
from ftjob_operator import planner
from ftjob_operator.planner import Event, plan
from ftjob_trainer import contract
from ftjob_trainer.coordinator import State
from tj_builders import NOW, Store, at, job


class Cluster:
    """A Store plus the memory of each coordinator pod; `observe` reads progress from the live one only."""

    def __init__(self, **spec_overrides):
        self.store = Store(job(**spec_overrides))
        self.coordinators: dict[str, State] = {}
        self.events: list[Event] = []
        self.plan_and_apply(NOW, passes=6)
        assert len(self.store.names("worker")) == 2

    def coordinator(self) -> State | None:
        names = self.store.names("coordinator")
        if not names:
            return None
        return self.coordinators.setdefault(names[-1], State())

    def report(self, pod: str, *, rank: int = 0, exit_code: int = 1, message: str = "boom", step=7) -> int:
        state = self.coordinator()
        assert state is not None, "no live coordinator to report to"
        return state.report_error(
            {"pod": pod, "rank": rank, "exitCode": exit_code, "message": message, "step": step}
        )

    def observe(self) -> planner.Observed:
        state = self.coordinator()
        self.store.progress = state.snapshot() if state else None
        return self.store.observe()

    def plan_and_apply(self, now, passes: int = 1, **apply_kw) -> planner.Plan:
        p = None
        for _ in range(passes):
            p = plan(self.observe(), now)
            self.store.apply(p, **apply_kw)
            self.events += p.of(Event)
        assert p is not None
        return p

    @property
    def status(self) -> dict:
        return self.store.status

    def workers(self) -> list[str]:
        return self.store.names("worker")


def counters(status: dict) -> tuple:
    return (
        status.get("failures"),
        status.get("restarts"),
        status.get("operator", {}).get("restartGeneration"),
        status.get("phase"),
    )


def test_a_reported_error_is_a_failure_that_restarts_the_job_after_the_backoff():
    c = Cluster()
    victim = c.workers()[1]
    eid = c.report(victim, rank=1, exit_code=1, message="RuntimeError: loss is NaN", step=41)
    p = c.plan_and_apply(at(1))
    st = p.status
    assert counters(st) == (1, 1, 1, "Restarting")
    assert st["operator"]["handledErrorId"] == eid and st["preemptions"] == 0
    assert st["lastFailure"]["pod"] == victim and st["lastFailure"]["exitCode"] == 1
    assert st["lastFailure"]["reason"] == planner.REASON_TRAINER_ERROR
    assert st["lastFailure"]["message"] == "rank 1 after step 41: RuntimeError: loss is NaN"
    until = contract.parse_time(st["operator"]["backoffUntil"])
    assert 8 <= (until - at(1)).total_seconds() <= 10  # base 10 s, jitter 0.2
    assert [e.reason for e in p.of(Event)] == [cond.REASON_WORKER_FAILED, cond.REASON_RESTART_BACKOFF]
    # The old generation goes, no new pod before the backoff ends, then a new generation runs.
    c.plan_and_apply(at(2))
    assert all(pm["metadata"].get("deletionTimestamp") for pm in c.store.pods.values())
    c.store.finish_terminating()
    assert not c.store.pods and not planner.Plan.of(c.plan_and_apply(at(5)), planner.Create)
    converge_cluster(c, at(12))
    assert counters(c.status) == (1, 1, 1, "Running")
    assert {planner.pod_generation(pm) for pm in c.store.pods.values()} == {1}


def converge_cluster(c: Cluster, now, passes: int = 6) -> None:
    for _ in range(passes):
        c.plan_and_apply(now)


# Each row: what the coordinator holds when the operator looks, and what the planner must conclude.
ROWS = {
    # the oldest report of a live worker names the root cause; a peer's broken collective after it does not count
    "root cause first": (
        lambda c: [
            c.report(c.workers()[0], message="ValueError: bad batch"),
            c.report(c.workers()[1], rank=1),
        ],
        1,
        "ValueError: bad batch",
    ),
    # a report naming a pod of no current worker (an older generation, a typo) is set aside
    "unknown pod": (lambda c: [c.report("tj-worker-99")], 0, None),
    # a pod without POD_NAME (the trainer run by hand) cannot be blamed on a pod
    "no pod name": (lambda c: [c.report("")], 0, None),
    # a configuration error inside the pod (exit 2) counts once and fails the job (test_planner_config_error)
    "config error": (
        lambda c: [c.report(c.workers()[0], exit_code=2, message="configuration error: --lr", step=None)],
        1,
        "rank 0: configuration error: --lr",
    ),
}


@pytest.mark.parametrize("row", list(ROWS))
def test_which_reports_count(row):
    make, failures, message = ROWS[row]
    c = Cluster()
    ids = make(c)
    st = c.plan_and_apply(at(1)).status
    assert st["failures"] == failures and st["operator"]["handledErrorId"] == max(ids)
    if message:
        assert message in st["lastFailure"]["message"]
        assert st["lastFailure"]["pod"] == c.workers()[0]  # the old generation is deleted on the next pass
    else:
        assert (
            "lastFailure" not in st and st["operator"]["restartGeneration"] == 0 and st["phase"] == "Running"
        )
    # Seen once: the next passes never count them again.
    for i in range(3):
        assert c.plan_and_apply(at(2 + i)).status["failures"] == failures


def test_a_report_seen_again_after_the_restart_is_not_counted_twice():
    """The old coordinator may still answer after the restart was decided: its report names an old-generation pod."""
    c = Cluster()
    c.report(c.workers()[0])
    c.plan_and_apply(at(1))
    old = c.coordinator()
    # the status write succeeded; pretend the progress document still comes from the old coordinator
    c.store.progress = old.snapshot()
    p = plan(c.store.observe(), at(2))
    assert counters(p.status) == (1, 1, 1, "Restarting")


def test_errors_soon_after_a_preemption_are_its_consequence_and_a_later_one_counts():
    c = Cluster()
    gone, survivor = c.workers()
    c.store.preempt(gone)
    c.plan_and_apply(at(1))
    assert (
        c.status["preemptions"] == 1 and c.status["operator"]["lastPreemptionTime"] == "2026-01-01T12:00:01Z"
    )
    c.report(survivor, message="RuntimeError: Connection reset by peer")  # its all-reduce lost the peer
    p = c.plan_and_apply(at(3))
    assert counters(p.status) == (0, 0, 0, "Running")
    assert any("after a preemption" in e.message for e in p.of(Event))
    c.store.finish_terminating()
    converge_cluster(c, at(4))
    # A minute later the trainer still crashes: that is a failure.
    c.report(survivor, message="KeyError: 'step'")
    p = c.plan_and_apply(at(1 + planner.PREEMPTION_COLLATERAL_SECONDS + 1))
    assert counters(p.status) == (1, 1, 1, "Restarting") and "KeyError" in p.status["lastFailure"]["message"]


def test_a_pod_failure_and_a_report_in_the_same_pass_count_once():
    c = Cluster()
    a, b = c.workers()
    c.report(b, rank=1)
    c.store.exit(a, 1, "Error")
    p = c.plan_and_apply(at(1))
    assert counters(p.status) == (1, 1, 1, "Restarting") and p.status["lastFailure"]["pod"] == a
    assert any(f"{b} reported an error" in e.message for e in p.of(Event))


def test_a_recreated_coordinators_reports_count_although_its_memory_started_empty():
    c = Cluster()
    handled = c.report(c.workers()[0], message="first")
    c.plan_and_apply(at(1))
    c.plan_and_apply(at(2))  # deletes the old generation
    c.store.finish_terminating()
    converge_cluster(c, at(12))
    assert c.status["operator"]["handledErrorId"] == handled and c.status["phase"] == "Running"
    assert c.store.names("coordinator") != ["tj-coordinator-0"]  # a new coordinator, a new memory
    # Its ids are milliseconds since the epoch: above the old one's once a millisecond has passed.
    deadline = time.monotonic() + 5
    while time.time_ns() // 1_000_000 <= handled and time.monotonic() < deadline:
        time.sleep(0.001)  # poll, do not spin
    eid = c.report(c.workers()[0], message="second")
    assert eid > handled
    p = c.plan_and_apply(at(30))
    assert counters(p.status)[:3] == (2, 2, 2) and "second" in p.status["lastFailure"]["message"]


def test_only_last_error_from_an_older_coordinator_still_counts():
    c = Cluster()
    c.report(c.workers()[0], message="only lastError")
    c.store.progress = {**c.coordinator().snapshot()}
    c.store.progress.pop("errors")
    p = plan(c.store.observe(), at(1))
    assert p.status["failures"] == 1 and "only lastError" in p.status["lastFailure"]["message"]


@pytest.mark.parametrize(
    "progress", [{"errors": [{"pod": "tj-worker-1"}]}, {"errors": "nope"}, {"lastError": {"id": "1"}}]
)
def test_malformed_reports_are_ignored(progress):
    c = Cluster()
    c.store.progress = progress
    p = plan(c.store.observe(), at(1))
    assert counters(p.status) == (0, 0, 0, "Running")


def test_budget_spent_fails_naming_pod_exit_code_and_the_trainers_message():
    c = Cluster(failurePolicy={"maxFailures": 1})
    victims = []
    for t in (1, 40):
        converge_cluster(c, at(t - 1))
        victims.append(c.workers()[0])
        c.report(victims[-1], exit_code=1, message="RuntimeError: crashed on purpose", step=3)
        st = c.plan_and_apply(at(t)).status
        c.plan_and_apply(at(t + 1))  # deletes the pods of the generation that failed
        c.store.finish_terminating()
    assert (st["failures"], st["restarts"], st["phase"]) == (2, 1, "Failed")
    assert victims[0] != victims[1] and st["lastFailure"]["pod"] == victims[1]
    failed = next(x for x in st["conditions"] if x["type"] == "Failed")
    assert failed["reason"] == cond.REASON_BACKOFF_LIMIT
    for part in (victims[1], "exit code 1", "rank 0 after step 3: RuntimeError: crashed on purpose"):
        assert part in failed["message"], failed["message"]
    assert not c.store.pods and c.status["phase"] == "Failed"


# --- an operator restart at any pass: no double count, nothing lost ---------------------------------------------
def _run(crash_at: int | None, crash_kind: str, reports: int) -> Cluster:
    """Two errors reported one after the other (each once the job runs again); the operator dies at pass
    `crash_at`: its status written but no action applied, or the actions applied and the status write lost."""
    c = Cluster(failurePolicy={"maxFailures": 5})
    passes, reported = 0, set()  # the restart generations whose workers reported an error
    for i in range(60):
        now = at(1 + i * 2)
        gens = {planner.pod_generation(c.store.pods[n]) for n in c.workers()}
        gen = gens.pop() if len(gens) == 1 and len(c.workers()) == 2 else None
        if gen is not None and gen not in reported and len(reported) < reports and c.coordinator():
            c.report(c.workers()[0], message=f"error {len(reported)}")
            reported.add(gen)
        if passes == crash_at:
            c.plan_and_apply(
                now, write_status=crash_kind == "after-status", apply_actions=crash_kind == "after-actions"
            )
        else:
            c.plan_and_apply(now)
        passes += 1
        if i % 3 == 2:
            c.store.finish_terminating()
    return c


@pytest.mark.parametrize("crash_kind", ["after-status", "after-actions"])
def test_operator_restart_mid_error_restart_counts_each_report_once(crash_kind):
    reference = _run(None, crash_kind, reports=2)
    expected = counters(reference.status)
    assert expected == (2, 2, 2, "Running"), reference.status
    for crash_at in range(0, 12):
        c = _run(crash_at, crash_kind, reports=2)
        assert counters(c.status) == expected, f"crash at pass {crash_at}: {c.status}"
        assert len(c.store.names("coordinator")) == 1 and len(c.workers()) == 2, sorted(c.store.pods)
