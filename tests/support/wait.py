"""The one polling helper of the tests: wait on a condition, never a fixed sleep, and say what it saw on failure."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 30.0,
    what: str = "condition",
    *,
    interval: float = 0.1,
    diagnose: Callable[[], str] | None = None,
    give_up: Callable[[], str | None] | None = None,
) -> Any:
    """Polls predicate until it returns something truthy and returns that value.

    Fails the test (AssertionError) after timeout seconds, naming what it waited for and appending diagnose()'s
    text (the job's status, a process log...). give_up() returns a reason when waiting is hopeless (a process it
    depends on exited): the predicate gets one last look, then the test fails at once with that reason.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        reason = give_up() if give_up is not None else None
        if reason is not None:
            value = predicate()
            if value:
                return value
            raise AssertionError(_message(f"gave up waiting for {what}: {reason}", diagnose))
        if time.monotonic() > deadline:
            raise AssertionError(_message(f"timed out after {timeout:g}s waiting for {what}", diagnose))
        time.sleep(interval)


def _message(head: str, diagnose: Callable[[], str] | None) -> str:
    if diagnose is None:
        return head
    try:
        detail = diagnose()
    except Exception as e:  # noqa: BLE001 - a failing diagnosis must not hide the timeout itself
        detail = f"(could not diagnose: {e!r})"
    return f"{head}\n{detail}" if detail else head
