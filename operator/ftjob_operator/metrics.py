"""Prometheus metrics of the operator (prometheus-client), served with /healthz on --metrics-port.

Counters come from the jobs' status (preemptions, failures, restarts), not from this process: the status is where
they survive an operator restart, so a restarted operator reports the same totals. Only the time-to-recover
histogram is this process's own observation (its start point is persisted on the job, see handlers.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from . import api

log = logging.getLogger(__name__)

NO_PHASE = "Pending"  # a job the operator has not written a phase for yet
RECOVERY_BUCKETS = (1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 300, 600)


class _JobStatusCollector(Collector):
    """Reads the latest status the operator wrote for each job, at scrape time."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        jobs = dict(self.metrics.jobs)
        by_phase = GaugeMetricFamily("ftjob_jobs", "TrainingJobs by phase.", labels=["phase"])
        counts = dict.fromkeys(api.PHASES, 0)
        for status in jobs.values():
            phase = status.get("phase") or NO_PHASE
            counts[phase] = counts.get(phase, 0) + 1
        for phase, n in sorted(counts.items()):
            by_phase.add_metric([phase], n)
        yield by_phase
        labels = ["namespace", "job"]
        families = {
            "preemptions": CounterMetricFamily(
                "ftjob_preemptions",
                "Pods lost to preemption, eviction or node loss (status.preemptions).",
                labels=labels,
            ),
            "failures": CounterMetricFamily(
                "ftjob_failures", "Pods that failed on their own (status.failures).", labels=labels
            ),
            "restarts": CounterMetricFamily(
                "ftjob_restarts", "Job restarts after failures (status.restarts).", labels=labels
            ),
        }
        step = GaugeMetricFamily(
            "ftjob_job_step", "Newest training step the coordinator reported.", labels=labels
        )
        ready = GaugeMetricFamily("ftjob_job_workers_ready", "Ready worker pods.", labels=labels)
        for (namespace, name), status in sorted(jobs.items()):
            for key, family in families.items():
                family.add_metric([namespace, name], int(status.get(key) or 0))
            if isinstance(status.get("step"), int):
                step.add_metric([namespace, name], status["step"])
            ready.add_metric([namespace, name], int((status.get("workers") or {}).get("ready") or 0))
        yield from families.values()
        yield step
        yield ready


class Metrics:
    """The operator's registry (its own, not the process-global one) and the HTTP endpoint."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.time_to_recover = Histogram(
            "ftjob_time_to_recover_seconds",
            "Seconds from a preemption (its notice, or the loss) until the job has its desired ready workers again.",
            buckets=RECOVERY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_JobStatusCollector(self))
        self._runner: web.AppRunner | None = None

    def record(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.jobs[(namespace, name)] = status

    def forget(self, namespace: str, name: str) -> None:
        self.jobs.pop((namespace, name), None)

    def observe_recovery(self, seconds: float) -> None:
        self.time_to_recover.observe(max(0.0, seconds))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def serve(self, port: int, host: str = "0.0.0.0") -> None:
        """/metrics for Prometheus, /healthz for the chart's probes (answered by the operator's own event loop,
        so a stuck loop fails the probe)."""

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(body=self.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/healthz", healthz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        log.info("metrics on http://%s:%d/metrics", host, port)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
