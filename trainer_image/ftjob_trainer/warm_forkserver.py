"""Imported first, and only, by the launcher's forkserver (ftjob_trainer.launch), before torch and the trainer.

It moves the forkserver into a session of its own, so that it and the workers forked from it get only the signals
their agent sends them, as torchrun's own workers (each in a session of its own) do: a signal to the agent's
process group (the local kubelet's SIGTERM, a terminal's Ctrl-C) would otherwise end the forkserver under its
workers, and their agent would read them as exited (255) in the middle of their preemption save.
"""

from __future__ import annotations

import os

if os.getpid() != os.getsid(0):  # not a session leader already (setsid would fail)
    os.setsid()
