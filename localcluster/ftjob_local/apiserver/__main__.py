"""`python -m ftjob_local.apiserver --state-dir DIR --port P [--host 127.0.0.1]`"""

from __future__ import annotations

import argparse
import logging

from .app import run_forever


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m ftjob_local.apiserver",
        description="ftjob's embedded Kubernetes-compatible API server",
    )
    parser.add_argument("--state-dir", required=True, help="where objects persist (created if missing)")
    parser.add_argument(
        "--port", type=int, default=6443, help="TCP port (0 picks a free one; see DIR/apiserver.url)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_forever(args.state_dir, args.port, args.host)


if __name__ == "__main__":
    main()
