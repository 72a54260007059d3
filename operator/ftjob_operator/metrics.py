"""Prometheus metrics of the operator (prometheus-client), served with /healthz on --metrics-port.

Counters and gauges come from the jobs' status (preemptions, failures, restarts, step, progress, goodput, lost
time), not from this process: the status is where they survive an operator restart, so a restarted operator
reports the same totals. The checkpoint's age is computed at scrape time from status.lastCheckpoint.time. Only the
two histograms are this process's own observations: time to recover (until the desired workers are ready again;
its start point is persisted on the job, see handlers.py) and recovery to the first step after the resume (the
planner reports each once, with the run that ends it persisted in the status).

`SERIES` lists every series: all but ftjob_jobs and the histograms are labelled namespace and job, the lost ones
cause too. The chart's README documents the same list (a test compares them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from aiohttp import web
from ftjob_trainer import contract
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from . import api

log = logging.getLogger(__name__)

NO_PHASE = "Pending"  # a job the operator has not written a phase for yet
RECOVERY_BUCKETS = (1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 300, 600)
CAUSES = ("preemption", "failure")
# name (as scraped) -> what it is.
SERIES = {
    "ftjob_jobs": "TrainingJobs by phase (label phase)",
    "ftjob_preemptions_total": "pods lost to preemption, eviction or node loss (status.preemptions)",
    "ftjob_failures_total": "pods that failed on their own (status.failures)",
    "ftjob_restarts_total": "job restarts after failures (status.restarts)",
    "ftjob_job_step": "newest training step (status.step)",
    "ftjob_job_workers_ready": "ready worker pods",
    "ftjob_job_progress_ratio": "fraction of the run's steps done, 0..1 (status.progress.percent / 100)",
    "ftjob_job_eta_seconds": "seconds until the last step at the recent step rate (status.progress.etaSeconds)",
    "ftjob_job_goodput_ratio": "kept training time / elapsed time, 0..1 (status.progress.goodput)",
    "ftjob_job_tokens_per_second": "the trainer's recent throughput (status.progress.tokensPerSecond)",
    "ftjob_job_checkpoint_age_seconds": "seconds since the newest committed checkpoint (status.lastCheckpoint.time)",
    "ftjob_job_lost_seconds_total": "training seconds lost, by cause (status.progress.lost.*.seconds)",
    "ftjob_job_lost_steps_total": "steps trained twice, by cause (status.progress.lost.*.steps)",
    "ftjob_time_to_recover_seconds": "histogram: preemption (notice or loss) -> desired workers ready again",
    "ftjob_recovery_seconds": "histogram by cause: notice or loss -> first training step after the resume",
}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def checkpoint_age(status: dict[str, Any], now: float) -> float | None:
    try:
        saved = contract.parse_time((status.get("lastCheckpoint") or {}).get("time"))
    except ValueError:
        return None
    return None if saved is None else max(0.0, now - saved.timestamp())


class _JobStatusCollector(Collector):
    """Reads the latest status the operator wrote for each job, at scrape time."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def _progress(self, jobs: dict[tuple[str, str], dict[str, Any]]) -> Iterator[Metric]:
        """status.progress and the checkpoint's age, per job."""
        labels = ["namespace", "job"]
        gauges = {
            name: GaugeMetricFamily(name, SERIES[name], labels=labels)
            for name in (
                "ftjob_job_progress_ratio",
                "ftjob_job_eta_seconds",
                "ftjob_job_goodput_ratio",
                "ftjob_job_tokens_per_second",
                "ftjob_job_checkpoint_age_seconds",
            )
        }
        lost = {
            unit: CounterMetricFamily(
                f"ftjob_job_lost_{unit}", SERIES[f"ftjob_job_lost_{unit}_total"], labels=[*labels, "cause"]
            )
            for unit in ("seconds", "steps")
        }
        now = time.time()
        for (namespace, name), status in sorted(jobs.items()):
            progress = status.get("progress") or {}
            percent = _number(progress.get("percent"))
            values = {
                "ftjob_job_progress_ratio": None if percent is None else percent / 100,
                "ftjob_job_eta_seconds": _number(progress.get("etaSeconds")),
                "ftjob_job_goodput_ratio": _number(progress.get("goodput")),
                "ftjob_job_tokens_per_second": _number(progress.get("tokensPerSecond")),
                "ftjob_job_checkpoint_age_seconds": checkpoint_age(status, now),
            }
            for key, value in values.items():
                if value is not None:
                    gauges[key].add_metric([namespace, name], value)
            if progress:
                for cause, key in zip(CAUSES, ("preemptions", "failures"), strict=True):
                    by_cause = (progress.get("lost") or {}).get(key) or {}
                    for unit, family in lost.items():
                        family.add_metric([namespace, name, cause], _number(by_cause.get(unit)) or 0.0)
        yield from gauges.values()
        yield from lost.values()

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
        yield from self._progress(jobs)


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
        self.recovery = Histogram(
            "ftjob_recovery_seconds",
            "Seconds from an interruption (its termination notice, or the loss) to the first training step after "
            "the resume, by cause (preemption, failure).",
            labelnames=["cause"],
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

    def observe_recovery_to_first_step(self, cause: str, seconds: float) -> None:
        self.recovery.labels(cause=cause).observe(max(0.0, seconds))

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
