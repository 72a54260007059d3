"""The `ftjob` console command: `crd`, `operator`, `local ...`, `demo`.

Subcommands that belong to other packages are imported lazily, so `ftjob crd` works without them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

SUBCOMMANDS = ("operator", "crd", "local", "demo")
# What `ftjob operator` reads from its environment (handlers.py, tokens.py, network_policy.py).
OPERATOR_ENV = (
    "FTJOB_DEFAULT_TRAINER_IMAGE",
    "FTJOB_EXTRA_TERMINATION_TAINTS",
    "FTJOB_TOKEN_KEY",
    "FTJOB_OPERATOR_POD_LABELS",
    "POD_NAMESPACE",
    "POD_ID",
    "POD_NAME",
)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ftjob", description="Preemption-safe elastic PyTorch training on Kubernetes."
    )
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(SUBCOMMANDS) + "}", required=True)

    op = sub.add_parser(
        "operator", help="run the operator against the current kubeconfig or in-cluster config"
    )
    op.add_argument(
        "--namespace",
        "-n",
        action="append",
        dest="namespaces",
        metavar="NS",
        help="watch this namespace (repeatable; default: all namespaces)",
    )
    op.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    op.add_argument("--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS, help="default INFO")
    op.add_argument(
        "--metrics-port", type=int, default=8080, help="Prometheus /metrics port; 0 disables (default 8080)"
    )
    op.add_argument(
        "--network-policy",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="give each job a NetworkPolicy that admits only its own pods (and the operator's) to its coordinator "
        "(default: on)",
    )
    op.add_argument(
        "--peering",
        default=None,
        help="kopf peering name, so only one of several operator replicas acts (default: no peering)",
    )

    crd = sub.add_parser("crd", help="print the TrainingJob CRD as YAML")
    mode = crd.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="regenerate crds/ and the chart's copy instead")
    mode.add_argument("--check", action="store_true", help="exit 1 when the committed CRD files are stale")

    # `local` and `demo` take their own flags; everything after the subcommand goes to them untouched.
    sub.add_parser("local", help="the embedded local cluster: up|down|status|restart|preempt", add_help=False)
    sub.add_parser(
        "demo", help="run the demo job on the local cluster and print recovery figures", add_help=False
    )
    return parser


def _delegate(module: str, what: str, argv: list[str]) -> int:
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            print(
                f"ftjob: `{what}` needs the module {module}, which is not installed here "
                "(install ftjob with the 'local' extra from a full checkout: pip install -e '.[local]')",
                file=sys.stderr,
            )
            return 1
        raise
    result = mod.main(argv)
    return int(result or 0)


def _crd(args: argparse.Namespace) -> int:
    from . import crd

    if args.write:
        for path in crd.write():
            print(f"wrote {path}")
        return 0
    if args.check:
        stale = crd.stale_files()
        for path in stale:
            print(f"stale: {path} (regenerate with `{crd.REGENERATE_COMMAND}`)", file=sys.stderr)
        return 1 if stale else 0
    sys.stdout.write(crd.render_yaml())
    return 0


def _register_with_local_cluster(kubeconfig: str | None, argv: list[str]) -> None:
    """An operator run by hand against a local cluster records itself in that cluster's state folder, so
    `ftjob local status|down|restart` know it (a no-op on a real cluster, or where ftjob_local is absent)."""
    try:
        records = importlib.import_module("ftjob_local.records")
    except ModuleNotFoundError:
        return
    # The environment the operator reads, so `ftjob local restart operator` starts it the same way.
    env = {k: os.environ[k] for k in OPERATOR_ENV if k in os.environ}
    where = records.register_hand_started(kubeconfig, argv, env)
    if where is not None:
        print(f"ftjob operator: registered in the local cluster's {where}", file=sys.stderr)


def _operator(args: argparse.Namespace, argv: list[str]) -> int:
    if args.metrics_port < 0 or args.metrics_port > 65535:
        print(f"ftjob operator: --metrics-port must be 0..65535 (got {args.metrics_port})", file=sys.stderr)
        return 2
    _register_with_local_cluster(args.kubeconfig, argv)
    # Imported here: kopf and the handlers are not needed by `ftjob crd` and the other subcommands.
    handlers = importlib.import_module("ftjob_operator.handlers")
    result = handlers.run(
        namespaces=args.namespaces or [],
        kubeconfig=args.kubeconfig,
        log_level=args.log_level,
        metrics_port=args.metrics_port,
        peering=args.peering,
        network_policy=args.network_policy,
    )
    return int(result or 0)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Pass-through subcommands keep their own flags (argparse would reject them).
    if argv and argv[0] == "local":
        return _delegate("ftjob_local.cli", "ftjob local", argv[1:])
    if argv and argv[0] == "demo":
        return _delegate("ftjob_local.demo", "ftjob demo", argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "crd":
        return _crd(args)
    if args.command == "operator":
        return _operator(args, argv[1:])
    raise AssertionError(f"unhandled subcommand {args.command}")  # argparse's choices make this unreachable


if __name__ == "__main__":
    sys.exit(main())
