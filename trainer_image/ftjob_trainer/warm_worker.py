"""What a warm worker runs first (ftjob_trainer.launch): forked from the launcher's forkserver, which imported
torch and the trainer already, with torchrun's environment for its rank set, it becomes what `python -u [-m]
PROGRAM ARGS` would have been in torchrun's own new interpreter.

Only what a fresh interpreter would do differently is redone here: torch's thread count follows OMP_NUM_THREADS as
torchrun set it for this worker (the forkserver read the agent's), and the program runs as __main__ with its own
argv.
"""

from __future__ import annotations

import os
import runpy
import sys
import warnings


def run(*argv: str) -> None:
    """`run("-m", "pkg.mod", *args)` or `run("path/to/script.py", *args)`, as python's own command line."""
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    if argv[:1] == ("-m",):
        module, args = argv[1], argv[2:]
        sys.argv = [module, *args]
        # the forkserver imported the module already (that is the point): runpy's warning about it is noise
        warnings.filterwarnings(
            "ignore", message=r".*found in sys\.modules after import", category=RuntimeWarning
        )
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script, args = argv[0], argv[1:]
        sys.argv = [script, *args]
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python script.py` does
        runpy.run_path(script, run_name="__main__")
