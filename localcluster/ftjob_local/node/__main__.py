"""`python -m ftjob_local.node`: run the node agent until SIGTERM or SIGINT.

SIGTERM stops the agent as a kubelet stops: its pods keep running, and the next agent adopts them (`ftjob local
restart kubelet`). SIGINT (Ctrl-C on an agent run by hand) also kills every pod process. `ftjob local down` kills
what is left of the pods after the agent is gone, either way.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from .agent import NodeAgent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ftjob_local.node", description=__doc__)
    p.add_argument("--kubeconfig", required=True, help="kubeconfig of the API server")
    p.add_argument("--state-dir", required=True, type=Path, help="cluster state folder (pods, volumes, logs)")
    p.add_argument("--nodes", type=int, default=1, help="on-demand nodes local-node-<i> (first start only)")
    p.add_argument("--spot-nodes", type=int, default=2, help="spot nodes local-spot-<i> (first start only)")
    p.add_argument("--gpus", type=int, default=0, help="nvidia.com/gpu capacity per node")
    p.add_argument("--cpu", help="cpu capacity per node (default: this machine's cores)")
    p.add_argument("--memory", help="memory capacity per node (default: this machine's memory)")
    p.add_argument("--max-pods", type=int, default=1000, help="pods capacity per node")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    if args.nodes < 0 or args.spot_nodes < 0 or args.nodes + args.spot_nodes == 0:
        p.error("--nodes and --spot-nodes must be >= 0 and at least one node in total")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("urllib3").setLevel(logging.ERROR)  # its retry warnings repeat what our own logs say
    stop = threading.Event()
    kill_pods = []
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: (kill_pods.append(True), stop.set()))
    agent = NodeAgent(
        args.kubeconfig,
        args.state_dir,
        args.nodes,
        args.spot_nodes,
        args.gpus,
        args.cpu,
        args.memory,
        args.max_pods,
    )
    try:
        agent.start()
        logging.info("node agent ready: nodes %s", ", ".join(sorted(agent.served)))
        stop.wait()
    finally:
        agent.shutdown(kill_pods=bool(kill_pods))
    return 0


if __name__ == "__main__":
    sys.exit(main())
