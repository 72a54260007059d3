"""An embedded, Kubernetes-API-compatible API server (aiohttp): the real kubectl, helm, the official `kubernetes`
client and kopf work against it unchanged. `python -m ftjob_local.apiserver --state-dir DIR --port P`, or
`start_in_thread(state_dir)` in tests."""

from .app import ServerHandle, run_forever, start_in_thread
from .server import ApiServer

__all__ = ["ApiServer", "ServerHandle", "run_forever", "start_in_thread"]
