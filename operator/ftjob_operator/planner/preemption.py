"""The preemption policy: what proves a lost pod was preempted, how a preemption is counted, the limit, the notice
that asks for a checkpoint before the SIGTERM, and recovery. A preemption never spends the failure budget.

Everything about counting preemptions lives here (losses.py asks `evidence` which kind a loss is; the trainer's
termination reasons are contract.REASON_*).
"""

from __future__ import annotations

from typing import Any

from ftjob_trainer import contract

from .. import conditions as cond
from . import progress
from .context import Context, Ending, RequestCheckpoint
from .lifecycle import finish
from .observed import (
    Nodes,
    pod_condition,
    pod_conditions,
    pod_deleting,
    pod_name,
    pod_node,
    terminated,
    termination_message,
)

# Node taints that announce the node's termination (spot notice, autoscaler scale-down, GKE shutdown, Karpenter's
# disruption, a node declared shut down); docs/clouds.md names each, and the chart's extraTerminationTaints adds more.
TERMINATION_TAINTS = frozenset(
    {
        "aws-node-termination-handler/spot-itn",
        "aws-node-termination-handler/scheduled-maintenance",
        "aws-node-termination-handler/asg-lifecycle-termination",
        "aws-node-termination-handler/rebalance-recommendation",
        "ToBeDeletedByClusterAutoscaler",
        "cloud.google.com/impending-node-termination",
        "karpenter.sh/disrupted",  # Karpenter v1 (interruption, consolidation, drift, expiry)
        "karpenter.sh/disruption",  # Karpenter before v1 (value "disrupting")
        "node.kubernetes.io/out-of-service",  # non-graceful node shutdown: the node is not coming back
    }
)
# pod.status.reason values the kubelet/node lifecycle give pods they stop for reasons outside the pod
# (UnexpectedAdmissionError: a restarted kubelet whose device plugin is not back yet rejects the pod).
PREEMPTION_POD_REASONS = frozenset(
    {
        "Evicted",
        "Preempting",
        "NodeLost",
        "Terminated",
        "Shutdown",
        "NodeShutdown",
        "UnexpectedAdmissionError",
    }
)
# A restarted kubelet rejects a pod the node no longer has room for with reason OutOf<resource> (OutOfcpu, ...).
KUBELET_ADMISSION_PREFIX = "OutOf"
# Container termination reasons that mean the platform lost the container, not that the program ended: the
# runtime could not find it (kubelet restart, node reboot, container runtime restart), exit code 137.
LOST_CONTAINER_REASONS = frozenset({"ContainerStatusUnknown"})
SIGNAL_EXIT_CODES = frozenset({128 + 15, 128 + 9})  # SIGTERM, SIGKILL
TRAINER_PREEMPTED_REASONS = frozenset(
    {contract.REASON_PREEMPTED, contract.REASON_PEER, contract.REASON_DEADLINE}
)
# Trainer errors reported within this long after a preemption are its consequence (a peer vanished in the middle
# of a collective), not failures. A trainer that keeps crashing reports again later, and that report counts.
PREEMPTION_COLLATERAL_SECONDS = 60
# A known pod that vanished before a pass saw it stop was deleted by someone else: a preemption, in these words.
VANISHED = "deleted (gone before ftjob saw it stop)"


# --- what proves a preemption ----------------------------------------------------------------------------------
def termination_taint(nodes: Nodes, node: str | None) -> str | None:
    known = TERMINATION_TAINTS | nodes.extra_termination_taints
    return next((key for key in nodes.taint_keys(node) if key in known), None)


def nodes_going_away(nodes: Nodes) -> list[str]:
    """Nodes no new pod of the job should land on: a termination taint or cordoned (placement.py says why by name)."""
    return sorted(n for n in nodes.by_name if termination_taint(nodes, n) or nodes.cordoned(n))


def notice_of(pod: dict[str, Any], nodes: Nodes) -> str | None:
    """Why this pod is about to be stopped from outside, or None."""
    if any(c.get("type") == "DisruptionTarget" and c.get("status") == "True" for c in pod_conditions(pod)):
        c = pod_condition(pod, "DisruptionTarget") or {}
        return f"DisruptionTarget ({c.get('reason') or 'no reason'})"
    node = pod_node(pod)
    taint = termination_taint(nodes, node)
    if taint:
        return f"node {node} tainted {taint}"
    return None


def evidence(pod: dict[str, Any], nodes: Nodes, noticed: set[str]) -> str | None:
    """Why this lost pod was preempted, in words; None when nothing outside the pod stopped it (a failure)."""
    status = pod.get("status") or {}
    node = pod_node(pod)
    exit_code = (terminated(pod) or {}).get("exitCode")
    notice = notice_of(pod, nodes) or (
        "termination notice seen earlier" if pod_name(pod) in noticed else None
    )
    if notice:
        return notice
    if nodes.gone(node):
        return f"node {node} is gone"
    pod_reason = status.get("reason") or ""
    if pod_reason in PREEMPTION_POD_REASONS or pod_reason.startswith(KUBELET_ADMISSION_PREFIX):
        return f"pod {pod_reason}: {status.get('message') or ''}".strip()
    lost = (terminated(pod) or {}).get("reason")
    if lost in LOST_CONTAINER_REASONS:
        return f"container {lost}: the platform lost it (exit code {exit_code})"
    reason = termination_message(pod).get("reason")
    if reason in TRAINER_PREEMPTED_REASONS:
        return f"trainer stopped: {reason}"
    if pod_deleting(pod) and not terminated(pod):
        return "deleted while running (not by ftjob)"
    if pod_deleting(pod) and exit_code in SIGNAL_EXIT_CODES:
        return f"deleted, exit code {exit_code}"
    return None


# --- counting --------------------------------------------------------------------------------------------------
def count(ctx: Context, pod: str, role: str, why: str) -> None:
    """One preemption: the counter, its time (trainer errors soon after are its consequence), the Preempted
    condition and a Warning event."""
    ctx.st.preemptions += 1
    ctx.st.operator.last_preemption_time = ctx.now_s
    progress.note_interruption(ctx, progress.PREEMPTION)
    ctx.condition(cond.PREEMPTED, cond.TRUE, cond.REASON_PREEMPTED, f"{pod}: {why}")
    ctx.event(cond.WARNING, cond.REASON_PREEMPTED, f"{role} {pod} preempted: {why}")


def enforce_limit(ctx: Context) -> Ending | None:
    """spec.preemption.maxPreemptions: more preemptions than that fail the job."""
    max_pre = ctx.spec.preemption.max_preemptions
    if max_pre is None or ctx.st.preemptions <= max_pre:
        return None
    return finish(
        ctx,
        Ending.FAILED,
        cond.REASON_PREEMPTION_LIMIT,
        f"{ctx.st.preemptions} preemptions exceed spec.preemption.maxPreemptions={max_pre}",
    )


def soon_after_a_preemption(ctx: Context) -> bool:
    """Within PREEMPTION_COLLATERAL_SECONDS of the last counted preemption."""
    preempted_at = contract.parse_time(ctx.st.operator.last_preemption_time)
    return (
        preempted_at is not None and (ctx.now - preempted_at).total_seconds() <= PREEMPTION_COLLATERAL_SECONDS
    )


# --- the notice and recovery -----------------------------------------------------------------------------------
def checkpoint_on_notice(ctx: Context) -> None:
    """One checkpoint request for the live pods whose termination notice is new (each pod's notice once)."""
    noticed = set(ctx.st.operator.noticed_pods)
    fresh = [(pod_name(p), notice_of(p, ctx.nodes)) for p in ctx.live_pods() if pod_name(p) not in noticed]
    fresh = [(n, why) for n, why in fresh if why]
    if fresh:
        progress.note_notice(ctx)
    if fresh and ctx.spec.preemption.checkpoint_on_notice:
        names = ", ".join(n for n, _ in fresh)
        ctx.actions.append(RequestCheckpoint(f"termination notice: {fresh[0][1]}"))
        ctx.event(
            cond.NORMAL, cond.REASON_TERMINATION_NOTICE, f"{names}: {fresh[0][1]}; checkpoint requested"
        )
    ctx.st.operator.noticed_pods += [n for n, _ in fresh]


def mark_recovered(ctx: Context, ready: int, desired: int) -> None:
    """Preempted turns False (Recovered) once the desired workers are ready again."""
    if cond.is_true(ctx.conds, cond.PREEMPTED) and ready >= desired:
        ctx.condition(cond.PREEMPTED, cond.FALSE, cond.REASON_RECOVERED, f"back to {ready}/{desired} workers")
