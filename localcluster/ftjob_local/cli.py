"""`ftjob local up|down|status|restart|preempt`: the embedded local cluster from the command line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .cluster import RESTARTABLE, ClusterError, LocalCluster

DEFAULT_STATE_DIR = ".ftjob-local"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ftjob local",
        description="The embedded local cluster: a Kubernetes API "
        "server, a service proxy, a scheduler and a kubelet that runs pods as processes, and the operator.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="{up,down,status,restart,preempt}")

    def state_dir(sp):
        sp.add_argument(
            "--state-dir",
            type=Path,
            default=None,
            help=f"cluster state folder (default: {DEFAULT_STATE_DIR})",
        )

    up = sub.add_parser(
        "up",
        help="start API server, service proxy, node agent and operator in the background; on a state folder "
        "whose cluster ran before, start only what does not run",
    )
    state_dir(up)
    up.add_argument("--nodes", type=int, default=1, help="on-demand nodes local-node-<i> (default 1)")
    up.add_argument("--spot-nodes", type=int, default=2, help="spot nodes local-spot-<i> (default 2)")
    up.add_argument("--no-operator", action="store_true", help="do not start the operator")
    up.add_argument("--timeout", type=float, default=60, help="seconds to wait for readiness (default 60)")

    down = sub.add_parser("down", help="stop every component (operators started by hand included) and pod")
    state_dir(down)

    rs = sub.add_parser(
        "restart",
        help="stop and start one component (or all); running pods keep running",
        description="kubelet is the node agent (kubelet, node heartbeats, scheduler); operator is every operator "
        "of the state folder, those started by hand included.",
    )
    rs.add_argument("component", choices=RESTARTABLE)
    state_dir(rs)
    rs.add_argument("--timeout", type=float, default=60, help="seconds to wait for readiness (default 60)")

    st = sub.add_parser("status", help="report what runs")
    state_dir(st)
    st.add_argument("--json", action="store_true", help="print JSON")

    pre = sub.add_parser(
        "preempt",
        help="simulate a spot interruption of a node",
        usage="ftjob local preempt [--state-dir] DIR NODE [--notice S] [--hard] [--replace-after S]",
    )
    pre.add_argument(
        "where", nargs="+", metavar="[DIR] NODE", help="state folder (or --state-dir) and node name"
    )
    state_dir(pre)
    pre.add_argument(
        "--notice",
        type=float,
        default=0.0,
        help="seconds between the taint and the pods' termination (default 0)",
    )
    pre.add_argument(
        "--hard", action="store_true", help="no notice: kill the pods and remove the node at once"
    )
    pre.add_argument(
        "--replace-after",
        type=float,
        default=None,
        help="register a fresh node of the same kind this many seconds after the request",
    )
    pre.add_argument(
        "--wait", action="store_true", help="return once the node is gone (and replaced, if asked)"
    )
    pre.add_argument("--timeout", type=float, default=300, help="--wait limit in seconds (default 300)")
    return p


def _dir(args) -> Path:
    return args.state_dir or Path(DEFAULT_STATE_DIR)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        if args.command == "up":
            LocalCluster(_dir(args)).up(args.nodes, args.spot_nodes, not args.no_operator, args.timeout)
            return 0
        if args.command == "down":
            LocalCluster(_dir(args)).down()
            return 0
        if args.command == "status":
            return _status(LocalCluster(_dir(args)), args.json)
        if args.command == "restart":
            LocalCluster(_dir(args)).restart(args.component, args.timeout)
            return 0
        if args.command == "preempt":
            return _preempt(args)
    except ClusterError as e:
        print(f"ftjob local {args.command}: {e}", file=sys.stderr)
        return 1
    raise AssertionError(args.command)


def _status(cluster: LocalCluster, as_json: bool) -> int:
    st = cluster.status()
    if as_json:
        print(json.dumps(st, indent=2))
    else:
        print(f"state dir   {st['stateDir']}")
        for name, c in st["components"].items():
            how = ", started by hand" if c.get("handStarted") else ""
            print(f"{name:11} {'running (pid ' + str(c['pid']) + how + ')' if c['running'] else 'stopped'}")
        for n in st.get("nodes", []):
            flags = ["Ready" if n["ready"] else "NotReady"] + (["spot"] if n["spot"] else []) + n["taints"]
            print(f"node        {n['name']}  {' '.join(flags)}")
        if "pods" in st:
            print("pods        " + (", ".join(f"{k} {v}" for k, v in sorted(st["pods"].items())) or "none"))
        if st.get("apiError"):
            print(f"api error   {st['apiError']}")
        if st["components"]["apiserver"]["running"]:
            print(f"export KUBECONFIG={st['kubeconfig']}")
    return 0 if any(c["running"] for c in st["components"].values()) else 3


def _preempt(args) -> int:
    from .client import ApiError, Kube
    from .objects import node_path
    from .preempt import request_preemption

    if len(args.where) == 2:
        if args.state_dir is not None:
            raise ClusterError("give the state folder once: either --state-dir DIR or DIR before NODE")
        state_dir, node = Path(args.where[0]), args.where[1]
    elif len(args.where) == 1:
        state_dir, node = _dir(args), args.where[0]
    else:
        raise ClusterError(f"expected [DIR] NODE, got {' '.join(args.where)}")
    if args.hard and args.notice:
        raise ClusterError("--hard means no notice: drop --notice or --hard")
    cluster = LocalCluster(state_dir)
    if not cluster.alive("apiserver") or not cluster.kubeconfig.exists():
        raise ClusterError(
            f"no local cluster runs from {cluster.dir}: start one with "
            f"ftjob local up --state-dir {cluster.dir}"
        )
    if not cluster.alive("node-agent"):
        raise ClusterError(
            f"the node agent of {cluster.dir} is not running, so nothing would carry out the "
            f"preemption; start it: ftjob local restart kubelet --state-dir {cluster.dir}"
        )
    kube = Kube(str(cluster.kubeconfig))
    before = {n["metadata"]["name"] for n in kube.request("GET", "/api/v1/nodes").get("items") or []}
    try:
        req = request_preemption(
            kube, node, notice=args.notice, hard=args.hard, replace_after=args.replace_after
        )
    except (LookupError, ValueError) as e:
        raise ClusterError(str(e)) from None
    what = "hard (no notice)" if args.hard else f"with {args.notice:g}s notice"
    print(
        f"preempting {node} {what}"
        + (
            f"; a replacement registers after {args.replace_after:g}s"
            if args.replace_after is not None
            else ""
        )
    )
    if not args.wait:
        return 0
    deadline = time.monotonic() + args.timeout
    while kube.get(node_path(node)) is not None:
        if time.monotonic() > deadline:
            raise ClusterError(f"{node} still exists after {args.timeout:g}s")
        time.sleep(0.2)
    print(f"{node} is gone")
    if req.get("replaceAfter") is not None:
        while True:
            try:
                names = {
                    n["metadata"]["name"] for n in kube.request("GET", "/api/v1/nodes").get("items") or []
                }
            except ApiError:
                names = set()
            fresh = sorted(names - before)
            if fresh:
                print(f"replacement {fresh[0]} registered")
                break
            if time.monotonic() > deadline:
                raise ClusterError(f"no replacement node registered within {args.timeout:g}s")
            time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
