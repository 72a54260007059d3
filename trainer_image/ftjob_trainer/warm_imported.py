"""Imported last by the launcher's forkserver (ftjob_trainer.launch): its preload is done, and workers forked from
now on start without waiting for it. The event says when, so a replacement's start-up reads as its parts."""

from __future__ import annotations

from ftjob_trainer import contract, events

events.emit(contract.EVENT_WARM_IMPORTS_DONE, since_start_s=round(events.since_start(), 4))
