"""Fixtures of the end-to-end tests (helpers live in e2e_lib.py)."""

from __future__ import annotations

import pytest
from e2e_lib import start_cluster


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """One local cluster (1 on-demand + 2 spot nodes, operator, CRD) per test module."""
    s = start_cluster(tmp_path_factory.mktemp("cluster") / "state")
    try:
        yield s
    finally:
        s.cluster.down(say=lambda *_: None)
