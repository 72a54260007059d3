"""The kopf handlers: gather observations, call the pure planner, apply its plan.

One daemon per TrainingJob loops observe -> plan -> apply. Watch events on the job, on its children (label
ftjob.dev/job-name, informer.py) and on nodes wake it at once, so a preempted worker is replaced within a pass;
otherwise it sleeps for the planner's requeue hint (or a short poll of the coordinator's progress). No daemon
passes before the children's caches have listed once since the operator started.

Each pass, in this order:
1. observe: the job (fresh GET), its pods and its coordinator Service (its clusterIP) from the watch-fed caches
   (informer.py: no list per pass), the nodes (a kopf index fed by the node watch), the job's token (derived,
   tokens.py; read back from its cached Secret only without a key), and the coordinator's progress over its HTTP API;
2. plan: `planner.plan(observed, now)`;
3. write the status (a merge patch of what changed). Nothing else happens unless this succeeds;
4. emit the plan's events (after the status write, so each transition is announced once);
5. apply the actions in order: creates (409 AlreadyExists = done), deletes (the planner's grace period,
   Background propagation), checkpoint requests to the coordinator.
Counters and "already handled" marks live in the status the planner returns, so an operator restarted at any
instant creates no duplicates and loses no counter.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import secrets
import sys
from datetime import datetime, timedelta, timezone
from typing import Any

import kopf
from ftjob_trainer import contract

from . import api, planner, render, tokens
from . import conditions as cond
from . import network_policy as netpol
from .coordinator_client import CoordinatorClient, CoordinatorError, control_url
from .informer import JobChildren
from .kube import Kube
from .nodes import node_entry, node_view
from .runtime import Runtime

log = logging.getLogger(__name__)

FINALIZER = "ftjob.dev/operator"  # kopf's daemons need one: it stops the daemon before the job is gone
REPORTING_COMPONENT = "ftjob-operator"
DEFAULT_IMAGE_ENV = "FTJOB_DEFAULT_TRAINER_IMAGE"
EXTRA_TAINTS_ENV = (
    "FTJOB_EXTRA_TERMINATION_TAINTS"  # comma-separated taint keys (the chart's extraTerminationTaints)
)
# Re-read the coordinator's progress this often while pods run, when nothing else wakes the loop.
ACTIVE_POLL_SECONDS = 10.0
# Jobs without a ready coordinator (waiting, finished, suspended): a safety net only, as every change that matters
# to them is a watch event. Long, so that thousands of such jobs cost next to nothing.
IDLE_POLL_SECONDS = 600.0
DEBOUNCE_SECONDS = 0.1  # let a burst of watch events (a pod's status, then its deletion) end in one pass
PERMANENT_ERROR_RETRY_SECONDS = 60.0
CHECKPOINT_REQUEST_ATTEMPTS = 3
NOTICE_MEMORY = timedelta(minutes=10)  # a termination notice older than this does not start a recovery clock


def _runtime(memo: Any) -> Runtime:
    return memo.runtime


# --- operator lifecycle --------------------------------------------------------------------------------------
@kopf.on.startup()
async def connect_and_configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    rt = _runtime(memo)
    settings.persistence.finalizer = FINALIZER
    # The CRD's status schema is ftjob's own: keep kopf's bookkeeping in annotations, never in status.kopf.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=api.GROUP, key="last-handled-configuration"
    )
    # ftjob posts its own events (Preempted, Replaced, ...); kopf adds only warnings and errors (API trouble).
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = REPORTING_COMPONENT
    rt.kube = await Kube.connect(rt.kubeconfig)
    rt.coordinator = CoordinatorClient.create()
    rt.children = JobChildren(rt.kube, rt.namespaces, rt.wake, secrets=rt.token_key is None)
    rt.children.start()
    if rt.peering:
        await rt.kube.ensure_peering(rt.peering, rt.namespaces)
    if rt.metrics_port:
        await rt.metrics.serve(rt.metrics_port)


@kopf.on.login()
async def login_with_operator_credentials(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    rt = _runtime(memo)
    if rt.kube is None:
        rt.kube = await Kube.connect(rt.kubeconfig)
    return await rt.kube.connection_info()


@kopf.on.cleanup()
async def close_clients(memo: kopf.Memo, **_: Any) -> None:
    rt = _runtime(memo)
    if rt.children is not None:
        await rt.children.stop()
    await rt.metrics.close()
    if rt.coordinator is not None:
        await rt.coordinator.close()
    if rt.kube is not None:
        await rt.kube.close()


# --- what wakes a job's loop ---------------------------------------------------------------------------------
# These are coroutines on purpose: kopf runs a plain function in a thread pool, which costs a thread hand-off per
# watch event and would set the daemons' asyncio.Events from outside their loop (not thread-safe).
@kopf.index("", "v1", "nodes")
async def nodes_by_name(
    name: str, spec: kopf.Spec, status: kopf.Status, **_: Any
) -> dict[str, dict[str, Any]]:
    """The nodes as the planner reads them, from the node watch (no list per pass)."""
    return {name: node_entry(name, spec, status)}


@kopf.on.event("", "v1", "nodes")
async def wake_jobs_on_node_change(
    name: str, spec: kopf.Spec, status: kopf.Status, memo: kopf.Memo, type: str | None, **_: Any
) -> None:
    rt = _runtime(memo)
    if type == "DELETED":
        rt.deleted_nodes.add(name)
        rt.nodes_seen.pop(name, None)
        changed = True
    else:
        rt.deleted_nodes.discard(name)  # a node of that name (re)appeared
        entry = node_entry(name, spec, status)
        changed = rt.nodes_seen.get(name) != entry
        rt.nodes_seen[name] = entry
    # A node that appears, goes, or changes what the planner reads of it (a termination taint, a cordon, its
    # readiness) concerns whichever jobs have pods there: a pass for every job. Its heartbeats (a status write every
    # few seconds) wake no job: with thousands of jobs, waking all on each would cost a pass per job per
    # heartbeat. None: the initial listing, which the daemons' first pass covers anyway.
    if changed and type is not None:
        rt.wake_all()


def extra_taints_from_env() -> frozenset[str]:
    """The chart's extraTerminationTaints, as the operator's environment carries them (comma-separated)."""
    return frozenset(k.strip() for k in os.environ.get(EXTRA_TAINTS_ENV, "").split(",") if k.strip())


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
async def wake_job_on_change(namespace: str, name: str, meta: kopf.Meta, memo: kopf.Memo, **_: Any) -> None:
    rt = _runtime(memo)
    if rt.written.get((namespace, name)) != meta.get("resourceVersion"):
        rt.wake(namespace, name)


# --- the per-job loop ----------------------------------------------------------------------------------------
@kopf.daemon(api.GROUP, api.VERSION, api.PLURAL, cancellation_timeout=10.0, backoff=5.0)
async def keep_training_job_converged(
    namespace: str,
    name: str,
    uid: str,
    body: kopf.Body,
    stopped: kopf.DaemonStopped,
    memo: kopf.Memo,
    nodes_by_name: kopf.Index,
    logger: logging.Logger,
    **_: Any,
) -> None:
    # A kopf.TemporaryError (409, 5xx, timeouts) leaves this function: kopf logs it, posts a warning event on the
    # job and calls the daemon again after the error's delay.
    rt = _runtime(memo)
    wake = rt.waker(namespace, name)
    assert rt.children is not None
    if (
        not rt.children.synced()
    ):  # plan from complete caches only (a pod missing from them would be re-created)
        await _wait_or_stop(rt.children.wait_synced(), stopped)
    while not stopped:
        async with rt.passes:  # a slot among the passes in flight (runtime.py), taken in the order asked
            if stopped:
                break
            wake.clear()  # events from now on mean "look again"
            try:
                timeout = await reconcile(rt, namespace, name, uid, nodes_by_name, logger)
            except planner.InvalidStatus as exc:
                # No actions on an unreadable status: a reset one would delete the running pods.
                logger.error("%s", exc)
                kopf.event(body, type="Warning", reason="InvalidStatus", message=str(exc)[:1024])
                timeout = PERMANENT_ERROR_RETRY_SECONDS
            except kopf.PermanentError as exc:
                # Not worth a quick retry (403, 422, ...): say so on the job and wait for a change to it or its pods.
                logger.error("cannot converge: %s", exc)
                kopf.event(body, type="Warning", reason="ApiError", message=str(exc)[:1024])
                timeout = PERMANENT_ERROR_RETRY_SECONDS
        if timeout is None:
            break  # the job is gone (or replaced by a new one of the same name)
        await _sleep_until_woken(wake, stopped, timeout)
    # Stopped: the job was deleted, the operator exits, or peering paused it; its figures are no longer ours.
    rt.forget(namespace, name)


async def _wait_or_stop(waiting: Any, stopped: kopf.DaemonStopped) -> None:
    task = asyncio.ensure_future(waiting)
    stop = asyncio.create_task(stopped.wait())
    try:
        await asyncio.wait([task, stop], return_when=asyncio.FIRST_COMPLETED)
    finally:
        task.cancel()
        stop.cancel()


async def _sleep_until_woken(wake: asyncio.Event, stopped: kopf.DaemonStopped, timeout: float) -> None:
    async def stop_requested() -> None:
        await stopped.wait()

    waiters = [asyncio.create_task(wake.wait()), asyncio.create_task(stop_requested())]
    try:
        await asyncio.wait(
            waiters, timeout=max(timeout, DEBOUNCE_SECONDS), return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        for task in waiters:
            task.cancel()
    if wake.is_set() and not stopped:
        await asyncio.sleep(DEBOUNCE_SECONDS)


async def reconcile(
    rt: Runtime, namespace: str, name: str, uid: str, nodes: kopf.Index, logger: logging.Logger
) -> float | None:
    """One pass. Returns seconds until the next pass, or None when the job no longer exists."""
    assert rt.kube is not None
    job = await rt.kube.get_job(namespace, name)
    if job is None or (job.get("metadata") or {}).get("uid") != uid:
        return None
    observed = await observe(rt, job, [node for store in nodes.values() for node in store], logger)
    now = datetime.now(timezone.utc)
    plan = planner.plan(observed, now)
    await apply(rt, job, plan, now, logger)
    if plan.requeue_after is not None:
        return plan.requeue_after
    # Only a ready coordinator's progress changes without a watch event: poll it. Anything else (pods, nodes, the
    # job) wakes the loop itself, so a job waiting for its pods costs nothing while it waits.
    active = plan.status.get("phase") not in (*api.FINISHED_PHASES, "Suspended", "Invalid")
    return ACTIVE_POLL_SECONDS if active and _coordinator_ready(observed.pods) else IDLE_POLL_SECONDS


async def observe(
    rt: Runtime, job: dict[str, Any], nodes: list[dict[str, Any]], logger: logging.Logger
) -> planner.Observed:
    assert rt.children is not None
    meta = job["metadata"]
    namespace, name, uid = meta.get("namespace") or "default", meta["name"], meta.get("uid")
    # Pods of an earlier job with the same name (still being garbage-collected) are not this job's.
    pods = [p for p in rt.children.pods(namespace, name) if planner.owned_by(p, uid)]
    known_nodes = node_view(nodes, pods, rt.deleted_nodes)
    service = rt.children.get("services", namespace, render.service_name(name))
    secret_exists, token = await job_token(rt, namespace, name, uid)
    progress = await read_progress(rt, pods, service, token, logger)
    return planner.Observed(
        job=job,
        pods=pods,
        nodes=known_nodes,
        service=service,
        secret_exists=secret_exists,
        progress=progress,
        new_token=token or secrets.token_urlsafe(32),
        default_image=rt.default_image,
        network_policy=rt.network_policy,
        network_policy_exists=rt.was_created(
            namespace, name, "NetworkPolicy", netpol.policy_name(name), uid or ""
        ),
        operator_pods=rt.operator_pods,
        extra_termination_taints=rt.extra_termination_taints,
    )


async def job_token(rt: Runtime, namespace: str, name: str, uid: str) -> tuple[bool, str]:
    """(whether the job's token Secret exists, its token): derived from the key, never read (tokens.py); without
    a key, read back from the Secret ("" when there is none yet)."""
    assert rt.children is not None
    if rt.token_key is not None:
        exists = rt.was_created(namespace, name, "Secret", render.secret_name(name), uid)
        return exists, tokens.derive(rt.token_key, namespace, name, uid)
    secret = rt.children.get("secrets", namespace, render.secret_name(name))
    if secret is None:
        return False, ""
    # The API server turns stringData into data on write; a read never carries stringData.
    encoded = (secret.get("data") or {}).get(render.TOKEN_KEY)
    return True, base64.b64decode(encoded).decode() if encoded else ""


def _coordinator_url(service: dict[str, Any] | None) -> str | None:
    ip = ((service or {}).get("spec") or {}).get("clusterIP")
    return control_url(ip) if ip and ip != "None" else None


def _coordinator_ready(pods: list[dict[str, Any]]) -> bool:
    return any(
        planner.pod_role(p) == render.ROLE_COORDINATOR
        and planner.pod_ready(p)
        and not p["metadata"].get("deletionTimestamp")
        for p in pods
    )


async def read_progress(
    rt: Runtime,
    pods: list[dict[str, Any]],
    service: dict[str, Any] | None,
    token: str,
    logger: logging.Logger,
) -> dict[str, Any] | None:
    url = _coordinator_url(service)
    if not (url and token and _coordinator_ready(pods) and rt.coordinator):
        return None
    try:
        return await rt.coordinator.progress(url, token)
    except CoordinatorError as exc:
        logger.debug("no progress this pass: %s", exc)
        return None


async def apply(
    rt: Runtime, job: dict[str, Any], plan: planner.Plan, now: datetime, logger: logging.Logger
) -> None:
    assert rt.kube is not None and rt.children is not None
    meta = job["metadata"]
    namespace, name = meta.get("namespace") or "default", meta["name"]
    key = (namespace, name)
    old_status = job.get("status") or {}
    patch = planner.status_patch(old_status, plan.status)
    if patch:
        written = await rt.kube.patch_job_status(namespace, name, patch)
        rt.written[key] = (written.get("metadata") or {}).get("resourceVersion", "")
    rt.metrics.record(namespace, name, plan.status)
    _observe_recovery(rt, key, old_status, plan, now)
    for recovery in plan.recoveries:  # once each: the run that ends it is in the status just written
        rt.metrics.observe_recovery_to_first_step(recovery.cause, recovery.seconds)
    for event in plan.of(planner.Event):
        kopf.event(job, type=event.type, reason=event.reason, message=event.message)
    for action in plan.actions:
        if isinstance(action, planner.Create):
            created = await rt.kube.create_object(namespace, action.manifest)
            logger.info("%s %s %s", "created" if created else "already exists:", action.kind, action.name)
            if created is not None:
                # In the cache now, so the next pass does not create it again (informer.py), and that pass runs
                # at once: the watch echo that used to wake the loop no longer does.
                rt.children.remember(action.kind, created)
                rt.wake(namespace, name)
            rt.record_created(namespace, name, action.kind, action.name, meta.get("uid") or "")
        elif isinstance(action, planner.Delete):
            gone = not await rt.kube.delete(
                namespace,
                action.kind,
                action.name,
                grace_period_seconds=action.grace_period_seconds,
                uid=action.uid,
            )
            logger.info(
                "deleted %s %s%s%s",
                action.kind,
                action.name,
                "" if action.grace_period_seconds is None else f" (grace {action.grace_period_seconds}s)",
                " (already gone)" if gone else "",
            )
        elif isinstance(action, planner.RequestCheckpoint):
            await request_checkpoint(rt, job, action.reason, logger)


async def request_checkpoint(rt: Runtime, job: dict[str, Any], reason: str, logger: logging.Logger) -> None:
    """POST /v1/checkpoint. The planner already recorded the request as handled, so a few quick retries here."""
    assert rt.children is not None and rt.coordinator is not None
    meta = job["metadata"]
    namespace, name = meta.get("namespace") or "default", meta["name"]
    error = "the coordinator Service has no clusterIP"
    url = _coordinator_url(rt.children.get("services", namespace, render.service_name(name)))
    _, token = await job_token(rt, namespace, name, meta.get("uid") or "")
    for attempt in range(CHECKPOINT_REQUEST_ATTEMPTS if url else 0):
        try:
            rid = await rt.coordinator.request_checkpoint(url, token, reason)
            logger.info("checkpoint request %d sent to the coordinator: %s", rid, reason)
            return
        except CoordinatorError as exc:
            error = str(exc)
            await asyncio.sleep(0.5 * (attempt + 1))
    logger.warning("checkpoint request (%s) did not reach the coordinator: %s", reason, error)
    kopf.event(
        job,
        type="Warning",
        reason="CheckpointRequestFailed",
        message=f"{reason}: {error}"[:1024],
    )


def _observe_recovery(
    rt: Runtime, key: tuple[str, str], old: dict[str, Any], plan: planner.Plan, now: datetime
) -> None:
    """Time to recover: from the notice (or the loss, the Preempted condition's persisted transition) until
    the planner reports the desired workers ready again (Preempted -> False, reason Recovered)."""
    if any(e.reason == cond.REASON_TERMINATION_NOTICE for e in plan.of(planner.Event)):
        rt.notices.setdefault(key, now)
    was = cond.find(old.get("conditions") or [], cond.PREEMPTED)
    is_ = cond.find(plan.status.get("conditions") or [], cond.PREEMPTED)
    if not (was and is_ and was.get("status") == cond.TRUE and is_.get("status") == cond.FALSE):
        return
    if is_.get("reason") != cond.REASON_RECOVERED:
        return
    start = contract.parse_time(was.get("lastTransitionTime")) or now
    notice = rt.notices.pop(key, None)
    if notice is not None and start - NOTICE_MEMORY < notice < start:
        start = notice
    rt.metrics.observe_recovery((now - start).total_seconds())


# --- entry point ---------------------------------------------------------------------------------------------
class _QuietWakeups(logging.Filter):
    """kopf logs every successful event handler at INFO; the wake-ups fire on every pod and node change."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Handler 'wake_")


def run(
    namespaces: list[str],
    kubeconfig: str | None,
    log_level: str,
    metrics_port: int,
    peering: str | None,
    network_policy: bool = True,
) -> int:
    """`ftjob operator`: kopf standalone, or one of several replicas when `peering` names a kopf peering."""
    logging.basicConfig(
        level=getattr(logging, log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    logging.getLogger("kopf.objects").addFilter(_QuietWakeups())
    try:
        token_key, operator_pods = tokens.key_from_env(), netpol.operator_pods_from_env()
    except ValueError as exc:  # the chart's environment is malformed: say which variable
        print(f"ftjob operator: {exc}", file=sys.stderr)
        return 2
    rt = Runtime(
        namespaces=list(namespaces),
        kubeconfig=kubeconfig,
        metrics_port=metrics_port,
        peering=peering,
        default_image=os.environ.get(DEFAULT_IMAGE_ENV, ""),
        extra_termination_taints=extra_taints_from_env(),
        token_key=token_key,
        network_policy=network_policy,
        operator_pods=operator_pods,
    )
    if rt.token_key is None:
        log.warning(
            "%s is not set: job tokens are random and read back from their Secrets (needs list and watch on secrets; "
            "the chart sets a key so the operator never reads a Secret)",
            tokens.TOKEN_KEY_ENV,
        )
    # Peers of equal priority would all stay active (kopf only warns); a random priority per replica makes one
    # active and the others standby until its keep-alives stop.
    priority = secrets.randbelow(2**30) + 1 if peering else None
    try:
        kopf.run(
            clusterwide=not namespaces,
            namespaces=list(namespaces),
            standalone=peering is None,
            peering_name=peering,
            priority=priority,
            memo=kopf.Memo(runtime=rt),
        )
    except Exception as exc:
        # A startup handler that failed permanently (no configuration, peering CRDs missing) already said why in
        # the log; end with that one line instead of kopf's wrapper traceback.
        if isinstance(exc.__cause__, kopf.PermanentError):
            print(f"ftjob operator: {exc.__cause__}", file=sys.stderr)
            return 1
        raise
    return 0
