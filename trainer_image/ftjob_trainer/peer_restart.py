"""The agent's own restarts of its workers stop them with the trainer's peer-stop signal, not SIGTERM.

torchrun's agent stops its workers itself when its round changes: a node joined (a replacement or a spare that
arrived after the survivors' round formed) or a worker of the group failed. It sends SIGTERM, the signal a kubelet
sends a preempted pod, so the built-in trainer took such a stop for its own pod's preemption: it made the stop save
durable, said so (FTJOB_STOP_COMMITTED_FILE), its agent left the rendezvous while restarting into the next round
(and crashed there: c10d's KeyError), and the pod's termination message said "preempted". On a loaded 2-core
machine the replacement's agent joined after the survivor's round had formed: the operator counted a second
preemption and then a failure. Here those stops send the trainer's peer-stop signal (--peer-stop-signals, SIGUSR2 by
default: this pod stays, save as a survivor does and exit 75 to be restarted). The agent's shutdown on its own
signal (a real preemption) still forwards that signal.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from typing import Any


def peer_stop_signal(trainer_args: list[str], env: Mapping[str, str] | None = None) -> signal.Signals | None:
    """The first of the trainer's peer-stop signals, read by its own parser (--peer-stop-signals, then
    FTJOB_PEER_STOP_SIGNALS, then its default); None when it has none, or when the trainer will refuse its command
    line (it says what to fix, and the agent keeps torchrun's SIGTERM)."""
    from ftjob_trainer.config import parse_args_quietly

    cfg = parse_args_quietly(trainer_args, env)
    names = cfg.preemption.peer_signal_names() if cfg else []
    return signal.Signals[names[0]] if names else None


def stop_workers_with(stop_workers: Callable, sig: signal.Signals) -> Callable:
    """An agent's _stop_workers (called only to restart or after a failure, never for its own shutdown) whose
    _shutdown sends `sig` instead of its default SIGTERM."""

    def stop(self: Any, *args: Any, **kwargs: Any) -> Any:
        shutdown = self._shutdown

        def shutdown_with(death_sig: Any = None, *rest: Any, **named: Any) -> Any:
            return shutdown(sig, *rest, **named)

        self._shutdown = shutdown_with  # this call only: the instance attribute shadows the method
        try:
            return stop_workers(self, *args, **kwargs)
        finally:
            del self._shutdown

    return stop
