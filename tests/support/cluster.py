"""A local cluster for one test module: up on entry, down on exit whatever happened."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ftjob_local.cluster import LocalCluster


def _quiet(*_: object) -> None:
    pass


@contextmanager
def local_cluster(
    state: Path, *, nodes: int = 1, spot_nodes: int = 2, operator: bool = False, timeout: float = 60
) -> Iterator[LocalCluster]:
    """`ftjob local up` in state (API server, node agent, the operator only if asked); `down` on exit."""
    cluster = LocalCluster(state)
    cluster.up(nodes=nodes, spot_nodes=spot_nodes, operator=operator, timeout=timeout, say=_quiet)
    try:
        yield cluster
    finally:
        cluster.down(say=_quiet)
