"""The children: what to create (Secret, NetworkPolicy, Service, coordinator, workers) and what to delete (older generations,
retired pods), so that a stale list or an operator restart never makes a second pod for one slot.

Pod names come from `status.operator.nextPodIndex` and the largest index observed; a created pod stays in
`status.operator.pendingPods` (its Create re-issued; a 409 means done) until a list shows it. A pod is deleted only when the
persisted status already accounts for it (retired, or of an older restart generation).
"""

from __future__ import annotations

from typing import Any

from .. import conditions as cond
from .. import network_policy, render
from . import preemption
from .context import FOLLOW_UP_SECONDS, Context, Create
from .observed import pod_index, pod_name, pod_role


def delete_old_generation(ctx: Context) -> None:
    # Older generations are accounted for by the persisted restartGeneration: safe to delete.
    for pod in ctx.old:
        ctx.delete_pod(pod)


def forget_observed_pending(ctx: Context) -> None:
    ctx.st.operator.pending_pods = [n for n in ctx.st.operator.pending_pods if n not in ctx.by_name]


def _next_index(ctx: Context) -> int:
    pending = [int(n.rsplit("-", 1)[1]) for n in ctx.st.operator.pending_pods]
    index = max([ctx.st.operator.next_pod_index, ctx.max_index + 1] + [i + 1 for i in pending])
    ctx.st.operator.next_pod_index = index + 1
    return index


def _avoid(ctx: Context) -> list[str]:
    """Nodes a new pod must not land on: going away (termination taint) or being drained (cordoned)."""
    return preemption.nodes_going_away(ctx.nodes)


def _create(ctx: Context, manifest: dict[str, Any]) -> None:
    ctx.actions.append(Create(manifest))
    if manifest["kind"] == "Pod":
        ctx.st.operator.pending_pods.append(manifest["metadata"]["name"])


# step: Secret, NetworkPolicy (before the coordinator, so it is never reachable without one), Service, pods
def ensure(ctx: Context) -> None:
    if not ctx.o.secret_exists:
        if not ctx.o.new_token:
            raise ValueError(
                "Observed.new_token is empty: the handler must pass a fresh token for the Secret"
            )
        ctx.actions.append(Create(render.render_secret(ctx.ref, ctx.o.new_token)))
    if ctx.o.network_policy and not ctx.o.network_policy_exists:
        ctx.actions.append(Create(network_policy.render_network_policy(ctx.ref, ctx.o.operator_pods)))
    if ctx.o.service is None:
        ctx.actions.append(Create(render.render_service(ctx.ref)))
    cluster_ip = ((ctx.o.service or {}).get("spec") or {}).get("clusterIP")
    if cluster_ip in (None, "", "None"):
        ctx.requeue_in(FOLLOW_UP_SECONDS)  # workers need the address; wait for the API server to assign it
        return
    _reissue_pending(ctx, cluster_ip)
    first = not ctx.prev.start_time
    lost_now = [n for n in ctx.st.operator.retired_pods if n not in ctx.prev.operator.retired_pods]
    _ensure_coordinator(ctx)
    _ensure_workers(ctx, cluster_ip, first, lost_now)
    # Deferred deletes: only pods the persisted status already retired (counted or scaled away).
    for pod in ctx.current:
        if pod_name(pod) in ctx.prev.operator.retired_pods:
            ctx.delete_pod(pod)
    if first:
        ctx.st.start_time = ctx.now_s
        ctx.condition(
            cond.CREATED, cond.TRUE, cond.REASON_CREATED, "coordinator, Service and workers created"
        )
    if lost_now or ctx.st.operator.pending_pods:
        ctx.requeue_in(FOLLOW_UP_SECONDS)


def _reissue_pending(ctx: Context, cluster_ip: str) -> None:
    """Re-issue creates that no list has shown yet (a 409 means they exist): never a second pod for one slot."""
    spec, ref, gen = ctx.spec, ctx.ref, ctx.st.operator.restart_generation
    for name in list(ctx.st.operator.pending_pods):
        index = int(name.rsplit("-", 1)[1])
        if name == render.coordinator_name(ref.name, index):
            coordinator = render.render_coordinator_pod(
                ref,
                spec,
                index=index,
                generation=gen,
                avoid_nodes=_avoid(ctx),
                world_epoch=ctx.st.operator.world_epoch,
            )
            ctx.actions.append(Create(coordinator))
        else:
            worker = render.render_worker_pod(
                ref, spec, index=index, generation=gen, coordinator_ip=cluster_ip, avoid_nodes=_avoid(ctx)
            )
            ctx.actions.append(Create(worker))


def _ensure_coordinator(ctx: Context) -> None:
    pending = [n for n in ctx.st.operator.pending_pods if not ctx.is_worker_name(n)]
    if ctx.alive(render.ROLE_COORDINATOR) or pending:
        return
    index = _next_index(ctx)
    _create(
        ctx,
        render.render_coordinator_pod(
            ctx.ref,
            ctx.spec,
            index=index,
            generation=ctx.st.operator.restart_generation,
            avoid_nodes=_avoid(ctx),
            world_epoch=ctx.st.operator.world_epoch,
        ),
    )
    if any(pod_role(p) == render.ROLE_WORKER for p in ctx.current):
        # Workers of this generation outlived their coordinator: this one replaces it.
        ctx.event(cond.NORMAL, cond.REASON_COORDINATOR_REPLACED, "created a new coordinator")


def _ensure_workers(ctx: Context, cluster_ip: str, first: bool, lost_now: list[str]) -> None:
    """Scale to spec.workers.pods (the desired count, plus warm spares at max): new names up; newest first down
    (retired now, deleted next pass). Which pods train and which wait as spares is the rendezvous's choice."""
    spec, ref, gen = ctx.spec, ctx.ref, ctx.st.operator.restart_generation
    retired = set(ctx.st.operator.retired_pods)
    workers = [p for p in ctx.alive(render.ROLE_WORKER) if pod_name(p) not in retired]
    have = len(workers) + len([n for n in ctx.st.operator.pending_pods if ctx.is_worker_name(n)])
    wanted = spec.workers.pods
    if have < wanted:
        created = []
        for _ in range(wanted - have):
            index = _next_index(ctx)
            _create(
                ctx,
                render.render_worker_pod(
                    ref, spec, index=index, generation=gen, coordinator_ip=cluster_ip, avoid_nodes=_avoid(ctx)
                ),
            )
            created.append(render.worker_name(ref.name, index))
        if first:
            ctx.event(cond.NORMAL, cond.REASON_CREATED, f"created coordinator and {len(created)} worker(s)")
        elif lost_now:
            ctx.event(
                cond.NORMAL, cond.REASON_REPLACED, f"replaced {', '.join(lost_now)} with {', '.join(created)}"
            )
        elif ctx.prev.phase == "Restarting" or ctx.prev.operator.backoff_until:
            ctx.event(cond.NORMAL, cond.REASON_RESTARTED, f"restart generation {gen}: {', '.join(created)}")
        else:
            ctx.event(cond.NORMAL, cond.REASON_SCALED_UP, f"{have} -> {wanted} workers: {', '.join(created)}")
    elif have > wanted:
        # Scale down: newest first (the oldest have been in the rendezvous longest). Retire now, delete next pass.
        names = [pod_name(p) for p in sorted(workers, key=pod_index, reverse=True)[: have - wanted]]
        ctx.st.operator.retired_pods += names
        if names:
            ctx.event(
                cond.NORMAL,
                cond.REASON_SCALED_DOWN,
                f"{have} -> {wanted} workers: removing {', '.join(names)}",
            )
            ctx.requeue_in(FOLLOW_UP_SECONDS)
