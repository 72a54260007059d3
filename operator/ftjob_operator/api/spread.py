"""`spec.scheduling.spread`: whether the worker pods of one job may share a node (issue 14).

One node lost must cost one worker, not two: by default every worker (warm spares included) gets a node of its
own, and a replacement waits Pending for a free node rather than landing beside a survivor. placement.py
turns the mode into pod anti-affinity; docs/scheduling.md says when to relax it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

SPREAD_REQUIRED = "Required"
SPREAD_PREFERRED = "Preferred"
SPREAD_NONE = "None"
Spread = Literal["Required", "Preferred", "None"]
SPREAD_MODES: tuple[str, ...] = (SPREAD_REQUIRED, SPREAD_PREFERRED, SPREAD_NONE)


def spread_field() -> Any:
    return Field(
        SPREAD_REQUIRED,
        description="spread is whether worker pods of this job share nodes (kubernetes.io/hostname). Required "
        "(default): one worker per node, and a worker waits Pending until a node without one fits (an elastic "
        "job trains on at workers.min meanwhile); Preferred: one per node while nodes allow, else shared; None: "
        "placement is the scheduler's alone (several workers per node, e.g. one big machine).",
    )
