"""`bench/local_scale.py --profile DIR`: this folder goes first on the components' PYTHONPATH, so Python imports
this module at start-up in every process the local cluster starts. With FTJOB_PROFILE_DIR set, it runs cProfile
on the main thread (where the API server's and the operator's event loops run) and writes
DIR/<component>.<pid>.prof when the process exits (SIGTERM included: both components exit cleanly on it).
Read one with `python -m pstats DIR/operator.<pid>.prof` (then `sort cumtime`, `stats 30`)."""

import atexit
import os

_DIR = os.environ.get("FTJOB_PROFILE_DIR")
_NAME = os.environ.get("FTJOB_LOCAL_COMPONENT")  # records.MANAGED_ENV: set on what `ftjob local` starts
if _DIR and _NAME:
    import cProfile

    _profiler = cProfile.Profile()

    def _write() -> None:
        _profiler.disable()
        _profiler.dump_stats(os.path.join(_DIR, f"{_NAME}.{os.getpid()}.prof"))

    atexit.register(_write)
    _profiler.enable()
