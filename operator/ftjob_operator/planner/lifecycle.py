"""The lifecycle: a usable spec, suspend and resume, an edited pod template, success, the end (finish, clean-up,
TTL), and the one place a new restart generation begins.

Each step takes the pass's Context and returns an Ending when the pass ends there (None: go on).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from ftjob_trainer import contract
from pydantic import ValidationError

from .. import api, render
from .. import conditions as cond
from . import progress
from .context import FOLLOW_UP_SECONDS, POLL_SECONDS, Context, Delete, Ending, RequestCheckpoint
from .observed import pod_name, pod_ready, pod_role, pod_succeeded


def start_new_generation(ctx: Context) -> None:
    """The one place a restart generation begins (a failure restart, suspend, an edited template). The current
    pods become an older generation: deleted next pass, once this status is persisted, and never counted as lost.
    Their replacements get a new rendezvous id (render: --rdzv-id=<uid>-g<generation>)."""
    ctx.st.operator.restart_generation += 1
    ctx.st.operator.pending_pods, ctx.st.operator.known_pods = [], []


def finish(ctx: Context, ending: Ending, reason: str, message: str) -> Ending:
    """Succeeded or Failed: terminal. Pods are deleted on the next pass (after this status is persisted)."""
    phase = ending.value  # the Succeeded and Failed conditions are named like the phases
    ctx.st.completion_time = ctx.now_s
    ctx.condition(phase, cond.TRUE, reason, message)
    ctx.clear(cond.RUNNING, cond.REASON_FINISHED, f"the job {phase.lower()}")
    ctx.clear(cond.RESTARTING, cond.REASON_FINISHED, f"the job {phase.lower()}")
    ctx.st.operator.backoff_until = None
    ctx.event(cond.NORMAL if ending is Ending.SUCCEEDED else cond.WARNING, reason, message)
    ctx.requeue_in(FOLLOW_UP_SECONDS)
    return ending


# step: finished jobs only clean up and honour the TTL
def clean_up_finished(ctx: Context) -> Ending:
    spec = _try_spec(ctx)
    clean_all = spec is None or spec.clean_pod_policy == "All"
    for pod in ctx.by_name.values():
        ended = pod_succeeded(pod) or (pod.get("status") or {}).get("phase") == "Failed"
        if clean_all or not ended or pod_role(pod) == render.ROLE_COORDINATOR:
            ctx.delete_pod(pod)
    ttl = spec.ttl_seconds_after_finished if spec else None
    done_at = contract.parse_time(ctx.prev.completion_time)
    if ttl is not None and done_at is not None:
        expires = done_at + timedelta(seconds=ttl)
        if ctx.now >= expires:
            ctx.actions.append(Delete(api.KIND, ctx.ref.name, uid=ctx.ref.uid or None))
            ctx.event(cond.NORMAL, cond.REASON_TTL_EXPIRED, f"deleted {ttl}s after it finished")
        else:
            ctx.requeue_in((expires - ctx.now).total_seconds())
    return Ending.FINISHED


def _try_spec(ctx: Context) -> api.TrainingJobSpec | None:
    try:
        return api.parse_spec(ctx.o.job.get("spec") or {})
    except ValidationError:
        return None


# step: InvalidSpec (what the schema cannot catch, or a server that does not validate)
def validate(ctx: Context) -> Ending | None:
    """Sets ctx.spec (with the image resolved) when the spec is usable; else InvalidSpec says what to fix."""
    try:
        spec = api.parse_spec(ctx.o.job.get("spec") or {})
        problems = api.spec_problems(ctx.ref.name, spec)
    except ValidationError as exc:
        spec, problems = None, api.validation_problems(exc)
    image = resolve_image(ctx, spec) if spec is not None else None
    if spec is not None and not image:
        problems.append(
            "spec.image is not set and the operator has no default trainer image: set spec.image, or give the "
            "operator one (helm value trainer.image.repository/tag, env FTJOB_DEFAULT_TRAINER_IMAGE)"
        )
    if problems or spec is None:
        message = "; ".join(problems)
        was = cond.find(ctx.conds, cond.INVALID_SPEC)
        if not was or was.get("status") != cond.TRUE or was.get("message") != message:
            ctx.event(cond.WARNING, cond.REASON_INVALID_SPEC, message)
        ctx.condition(cond.INVALID_SPEC, cond.TRUE, cond.REASON_INVALID_SPEC, message)
        return Ending.INVALID
    if cond.is_true(ctx.conds, cond.INVALID_SPEC):
        ctx.condition(cond.INVALID_SPEC, cond.FALSE, cond.REASON_SPEC_VALID, "the spec is valid now")
    # Render from the resolved image, and keep it: the pods (and the template hash) stay on it.
    ctx.spec = spec.model_copy(update={"image": image})
    ctx.st.image = image
    ctx.st.workers.desired = spec.workers.desired
    return None


def resolve_image(ctx: Context, spec: api.TrainingJobSpec) -> str | None:
    """spec.image; else the image this job already runs (an operator upgrade with a new default must not
    restart it); else the operator's default."""
    return spec.image or ctx.prev.image or ctx.o.default_image or None


# step: suspend (checkpoint, bounded wait, delete pods) and resume
def suspend(ctx: Context) -> Ending:
    workers = ctx.alive(render.ROLE_WORKER)
    coordinator = ctx.alive(render.ROLE_COORDINATOR)
    if not (workers + coordinator) and not ctx.st.operator.pending_pods:
        if ctx.prev.phase != "Suspended":
            ctx.event(
                cond.NORMAL, cond.REASON_SUSPENDED, "no pods run; the job keeps its checkpoints and counters"
            )
        ctx.condition(cond.SUSPENDED, cond.TRUE, cond.REASON_SUSPENDED, "spec.suspend is true")
        ctx.clear(cond.RUNNING, cond.REASON_SUSPENDED, "suspended")
        return Ending.SUSPENDED
    requested = contract.parse_time(ctx.st.operator.suspend_requested_at)
    can_ask = bool(workers) and any(pod_ready(p) for p in coordinator)
    if requested is None and can_ask:
        ctx.st.operator.suspend_requested_at = ctx.now_s
        ctx.actions.append(RequestCheckpoint("suspend"))
        ctx.event(cond.NORMAL, cond.REASON_CHECKPOINT_REQUESTED, "checkpoint before suspending")
        ctx.condition(
            cond.SUSPENDED, cond.FALSE, cond.REASON_SUSPENDING, "waiting for the suspend checkpoint"
        )
        ctx.requeue_in(POLL_SECONDS)
        return Ending.SUSPENDING
    if requested is not None:
        ck = ctx.st.last_checkpoint
        saved = (
            ck is not None
            and (contract.parse_time(ck.time) or datetime.min.replace(tzinfo=timezone.utc)) >= requested
        )
        deadline = requested + timedelta(seconds=ctx.spec.checkpoint.suspend_timeout_seconds)
        if not saved and ctx.now < deadline:
            ctx.requeue_in(min(POLL_SECONDS, (deadline - ctx.now).total_seconds()))
            return Ending.SUSPENDING
        how = (
            f"checkpoint at step {ck.step}" if saved and ck else "no checkpoint within suspendTimeoutSeconds"
        )
    else:
        how = "no coordinator to checkpoint"
    start_new_generation(ctx)
    ctx.condition(cond.SUSPENDED, cond.TRUE, cond.REASON_SUSPENDED, f"spec.suspend is true ({how})")
    ctx.clear(cond.RUNNING, cond.REASON_SUSPENDED, "suspended")
    ctx.event(cond.NORMAL, cond.REASON_SUSPENDED, f"deleting pods ({how})")
    ctx.requeue_in(FOLLOW_UP_SECONDS)
    return Ending.SUSPENDED


def resume_if_suspended(ctx: Context) -> None:
    if ctx.prev.phase in ("Suspended", "Suspending") or ctx.st.operator.suspend_requested_at:
        suspended = cond.find(ctx.conds, cond.SUSPENDED) or {}
        if suspended.get("status") == cond.TRUE:  # the time suspended is not elapsed time (goodput)
            progress.note_resumed_from_suspension(
                ctx, contract.parse_time(suspended.get("lastTransitionTime"))
            )
        ctx.st.operator.suspend_requested_at = None
        ctx.condition(cond.SUSPENDED, cond.FALSE, cond.REASON_RESUMED, "spec.suspend is false")
        ctx.event(cond.NORMAL, cond.REASON_RESUMED, "resuming from the latest checkpoint")


# step: an edited pod template (image, min/max, trainer settings, ...) restarts the pods
def restart_on_template_change(ctx: Context) -> Ending | None:
    digest = render.template_hash(ctx.ref, ctx.spec)
    before, ctx.st.operator.pod_template_hash = ctx.st.operator.pod_template_hash, digest
    if before is None or before == digest or not (ctx.live_pods() or ctx.st.operator.pending_pods):
        return None
    start_new_generation(ctx)  # SIGTERM makes the old pods' trainers checkpoint first
    message = f"the pod template changed (generation {ctx.generation}); restarting from the latest checkpoint"
    ctx.condition(cond.RESTARTING, cond.TRUE, cond.REASON_SPEC_CHANGED, message)
    ctx.clear(cond.RUNNING, cond.REASON_SPEC_CHANGED, "restarting with the new spec")
    ctx.event(cond.NORMAL, cond.REASON_SPEC_CHANGED, message)
    ctx.requeue_in(FOLLOW_UP_SECONDS)
    return Ending.RESTARTING


# step: success when a worker exits 0 (torchrun exits 0 only after the last step)
def succeed(ctx: Context) -> Ending | None:
    # The trainer exits 0 only after the job's last step (a collective one), and torchrun exits 0 only when
    # its workers did: one worker pod that exits 0 proves the job is done. Waiting for the others can take
    # torchrun's exit barrier (the launcher's 30 s) when a peer was lost near the end; they are deleted next pass.
    workers = [p for p in ctx.current if pod_role(p) == render.ROLE_WORKER]
    done = [p for p in workers if pod_succeeded(p)]
    if not done:
        return None
    return finish(
        ctx, Ending.SUCCEEDED, cond.REASON_SUCCEEDED, f"{pod_name(done[0])} exited 0 after the last step"
    )


def checkpoint_on_annotation(ctx: Context) -> None:
    """The user's ftjob.dev/checkpoint-request annotation: one request per new value."""
    value = (ctx.meta.get("annotations") or {}).get(render.ANNOTATION_CHECKPOINT_REQUEST)
    if value and value != ctx.st.operator.handled_checkpoint_request:
        ctx.st.operator.handled_checkpoint_request = value
        ctx.actions.append(RequestCheckpoint(f"annotation {render.ANNOTATION_CHECKPOINT_REQUEST}={value}"))
        ctx.event(
            cond.NORMAL, cond.REASON_CHECKPOINT_REQUESTED, f"{render.ANNOTATION_CHECKPOINT_REQUEST}={value}"
        )
