"""What rank 0 tells the coordinator about training (contract.py, "Progress document keys"): the step and when it
finished, the recent throughput, the run's length, and which run this is: when its process started, the step it
resumed from and when that step was first trained, and when it finished its first step. The operator computes
progress, ETA, goodput and the time lost to each interruption from these (planner/progress.py).

Torch-free. Times on the wire are RFC 3339 with microseconds; the checkpoint meta keeps the step's time as unix
seconds (`STEP_TIME_KEY`), so a resume can say when the step it resumed from was trained.
"""

from __future__ import annotations

import time
from collections import deque
from datetime import datetime, timezone
from typing import Any

from ftjob_trainer import contract

STEP_TIME_KEY = "step_time"  # checkpoint meta: unix seconds when the saved step finished
RATE_WINDOW = 20  # steps the recent throughput is measured over


def wire_time(unix: float | None) -> str | None:
    return None if unix is None else contract.format_time_micro(datetime.fromtimestamp(unix, timezone.utc))


class RunProgress:
    """One trainer process's progress: call `step_done` after every step, `document` for a progress post."""

    def __init__(
        self,
        total_steps: int,
        tokens_per_step: int,
        resumed_from_step: int,
        resumed_step_time: float | None,
        started_at: float,
    ) -> None:
        self.total_steps, self.tokens_per_step = total_steps, tokens_per_step
        self.run = {
            "startedAt": wire_time(started_at),
            "resumedFromStep": resumed_from_step,
            "resumedStepTime": wire_time(resumed_step_time),
            "firstStepTime": None,
        }
        self.step = resumed_from_step
        self.step_time: float | None = resumed_step_time  # unix seconds when `step` finished
        self.recent: deque[tuple[int, float]] = deque(maxlen=RATE_WINDOW + 1)

    def step_done(self, step: int, now: float | None = None) -> None:
        now = time.time() if now is None else now
        if self.run["firstStepTime"] is None:
            self.run["firstStepTime"] = wire_time(now)
        self.step, self.step_time = step, now
        self.recent.append((step, now))

    def tokens_per_second(self) -> float | None:
        """Over the last RATE_WINDOW steps (checkpoint stalls included); None before two steps."""
        if len(self.recent) < 2:
            return None
        (s0, t0), (s1, t1) = self.recent[0], self.recent[-1]
        return round(self.tokens_per_step * (s1 - s0) / (t1 - t0), 1) if t1 > t0 else None

    def document(self, loss: float | None, world_size: int) -> dict[str, Any]:
        """The fields of a progress post (every one of them: a recreated coordinator learns the run from any)."""
        return {
            "step": self.step,
            "stepTime": wire_time(self.step_time),
            "loss": loss,
            "worldSize": world_size,
            "totalSteps": self.total_steps,
            "tokensPerSecond": self.tokens_per_second(),
            "run": dict(self.run),
        }
