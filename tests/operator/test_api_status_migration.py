"""The operator's bookkeeping moved under status.operator (issue 13). A status an earlier operator wrote, with the
bookkeeping at the top level, is read from there once; an upgraded operator loses no counter and makes no second
pod, with the CRD upgraded or not (helm never upgrades CRDs, and an old CRD prunes status.operator)."""

from __future__ import annotations

import copy

from ftjob_operator import api, crd, planner
from tj_builders import Store, at, converge, job


def _legacy(status: dict) -> dict:
    """The same status as an earlier operator wrote it: the bookkeeping at the top level, no status.operator (and
    none of what it did not keep)."""
    old = {k: v for k, v in status.items() if k not in ("operator", "progress")}
    return {**old, **{k: v for k, v in status["operator"].items() if k in api.LEGACY_BOOKKEEPING}}


def _failed_once_then_preempted() -> Store:
    """A job in restart generation 1 (a failure restart) that then lost a worker to a preemption."""
    store = Store(job())
    converge(store, at(0))
    store.exit(store.names("worker")[0], 1)
    converge(store, at(1))
    store.finish_terminating()
    converge(store, at(100))  # after the backoff: generation 1 runs
    store.preempt(store.names("worker")[0])
    converge(store, at(101))
    store.finish_terminating()
    converge(store, at(102))
    st = store.status
    assert (st["failures"], st["preemptions"], st["operator"]["restartGeneration"]) == (1, 1, 1), st
    return store


def test_a_legacy_status_is_read_once_and_loses_nothing():
    store = _failed_once_then_preempted()
    pods = sorted(store.pods)
    book = {k: v for k, v in store.status["operator"].items() if k in api.LEGACY_BOOKKEEPING}
    store.job["status"] = _legacy(store.status)
    assert api.has_legacy_bookkeeping(store.status)
    read = api.parse_status(store.status).operator.to_json()
    assert {k: read[k] for k in book} == book

    first = planner.plan(store.observe(), at(103))
    assert not [a for a in first.actions if not isinstance(a, planner.Event)], first.actions
    assert {k: first.status["operator"][k] for k in book} == book
    # Until status.operator is seen persisted, the old fields stay current too.
    assert {k: first.status[k] for k in book} == book
    store.apply(first)

    second = planner.plan(store.observe(), at(104))
    assert {k: second.status["operator"][k] for k in book} == book
    assert not set(api.LEGACY_BOOKKEEPING) & set(second.status)
    patch = planner.status_patch(store.status, second.status)
    assert {k: patch[k] for k in api.LEGACY_BOOKKEEPING if k in store.status} == {
        k: None for k in api.LEGACY_BOOKKEEPING if k in store.status
    }
    store.apply(second)
    assert sorted(store.pods) == pods and (store.status["failures"], store.status["preemptions"]) == (1, 1)


class OldCrdStore(Store):
    """A cluster whose CRD was not upgraded: the API server prunes status.operator from every status write."""

    def apply(self, plan, **kw) -> None:
        super().apply(plan, **kw)
        self.job.get("status", {}).pop("operator", None)


def test_an_old_crd_that_prunes_status_operator_keeps_the_operator_working_from_the_old_fields():
    reference = _failed_once_then_preempted()
    store = OldCrdStore(job(status=_legacy(reference.status)))
    store.pods, store.service, store.secret = copy.deepcopy(reference.pods), reference.service, True
    store.preempt(store.names("worker")[0])
    converge(store, at(200))
    store.finish_terminating()
    converge(store, at(201))
    st = store.status
    assert "operator" not in st and (st["preemptions"], st["failures"], st["restartGeneration"]) == (2, 1, 1)
    assert len(store.names("worker")) == 2 and len(store.names("coordinator")) == 1
    assert store.creates == 1  # one replacement, no second pod for its slot
    assert st["nextPodIndex"] == reference.status["operator"]["nextPodIndex"] + 1


def test_the_crd_keeps_the_old_fields_as_deprecated_so_they_are_not_pruned_before_they_are_read():
    status = crd.structural_schema()["properties"]["status"]["properties"]
    book = status["operator"]["properties"]
    for name in api.LEGACY_BOOKKEEPING:
        assert status[name]["description"].startswith(f"{name} is deprecated: it moved to status.operator.")
        # The same type, without a default (the API server would fill it in, and it would never go away).
        assert {k: v for k, v in status[name].items() if k != "description"} == {
            k: v for k, v in book[name].items() if k not in ("description", "default")
        }
