"""What the handlers share (`Runtime`): the clients, the caches, and what the operator keeps per job in memory
(wake-up events, its last status write, notices, the children it created). Everything per job is dropped by
`forget` when the job's daemon stops, so the operator's memory follows the jobs it runs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from . import network_policy as netpol
from .coordinator_client import CoordinatorClient
from .informer import JobChildren
from .kube import Kube
from .metrics import Metrics

# Passes in flight at once, over all jobs. Enough to keep the API server busy; beyond it more concurrent passes only
# queue there, each holding its job's rendered children meanwhile (the operator's peak memory grew with the jobs
# created at once), and every job finished late as all advanced in step. Waiting passes get a slot in the order
# they asked (asyncio.Semaphore is FIFO), so the first jobs created are the first served.
MAX_PASSES_IN_FLIGHT = 32


@dataclass
class Runtime:
    """What the handlers share: created once by `run()`, reached through kopf's memo."""

    namespaces: list[str]
    kubeconfig: str | None
    metrics_port: int
    peering: str | None
    # For jobs without spec.image: env FTJOB_DEFAULT_TRAINER_IMAGE (the chart sets it from trainer.image).
    default_image: str = ""
    metrics: Metrics = field(default_factory=Metrics)
    kube: Kube | None = None
    coordinator: CoordinatorClient | None = None
    children: JobChildren | None = None  # the jobs' pods, Services (and Secrets without a key), watch-fed
    wakers: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    # resourceVersion of our last status write, so its watch echo does not wake the loop again
    written: dict[tuple[str, str], str] = field(default_factory=dict)
    notices: dict[tuple[str, str], datetime] = field(default_factory=dict)  # first termination notice seen
    # Nodes whose DELETED watch event we saw: only these count as gone (the index may lag a new node).
    deleted_nodes: set[str] = field(default_factory=set)
    # What the planner reads of each node (handlers.node_entry), as last seen: a change wakes the jobs.
    nodes_seen: dict[str, dict[str, Any]] = field(default_factory=dict)
    # tokens.py: the key the job tokens are derived from (env FTJOB_TOKEN_KEY); None: read them back instead.
    token_key: bytes | None = None
    network_policy: bool = True  # make each job's NetworkPolicy (`--network-policy`)
    operator_pods: netpol.OperatorPods | None = None
    # Termination taint keys beyond preemption.TERMINATION_TAINTS (env FTJOB_EXTRA_TERMINATION_TAINTS).
    extra_termination_taints: frozenset[str] = frozenset()
    # Children the operator creates once and never reads back (the Secret when tokens are derived, the
    # NetworkPolicy), per job (namespace, job name): (kind, name, job uid) once created or found existing (409)
    # by this process.
    created: dict[tuple[str, str], set[tuple[str, str, str]]] = field(default_factory=dict)
    passes: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(MAX_PASSES_IN_FLIGHT))

    def waker(self, namespace: str, name: str) -> asyncio.Event:
        return self.wakers.setdefault((namespace, name), asyncio.Event())

    def wake(self, namespace: str | None, name: str | None) -> None:
        event = self.wakers.get((namespace or "", name or ""))
        if event is not None:
            event.set()

    def forget(self, namespace: str, name: str) -> None:
        """Everything kept per job, dropped when its daemon stops."""
        self.metrics.forget(namespace, name)
        for per_job in (self.written, self.wakers, self.notices, self.created):
            per_job.pop((namespace, name), None)

    def record_created(self, namespace: str, job: str, kind: str, name: str, uid: str) -> None:
        self.created.setdefault((namespace, job), set()).add((kind, name, uid))

    def was_created(self, namespace: str, job: str, kind: str, name: str, uid: str) -> bool:
        return (kind, name, uid) in self.created.get((namespace, job), ())

    def wake_all(self) -> None:
        for event in self.wakers.values():
            event.set()
