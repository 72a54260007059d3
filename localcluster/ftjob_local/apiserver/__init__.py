"""An embedded, Kubernetes-API-compatible API server (aiohttp): the real kubectl, helm, the official `kubernetes`
client and kopf work against it unchanged.

Run it: `python -m ftjob_local.apiserver --state-dir DIR --port P` (plain HTTP; the URL goes to DIR/apiserver.url),
or `start_in_thread(state_dir)` in tests (returns a handle with `.url`, `.stop()` and `.call(fn)`).

Modules: `server` (routing and object semantics), `store` (sqlite persistence, resourceVersions, watch history),
`resources` (built-in types, CRD registry), `schema` (structural schemas and CEL), `patch` (merge, JSON and
strategic merge patch), `tables` (server-side printing), `openapi` (v3 documents), `auth` (tokens, RBAC),
`protobuf` (the few protobuf bodies typed client-go clients send).

Not emulated: controllers (Deployments do not create pods, no Endpoints), admission webhooks, CRD conversion
webhooks (all served versions share one stored form), server-side apply field ownership (apply patches merge),
aggregated discovery, OpenAPI v2, pods/exec|attach|portforward, protobuf bodies beyond those listed in
`protobuf.py` (`kubectl create deployment` fails; `kubectl apply -f` works), TLS (client-go therefore sends no
tokens; use `kubectl --as`).
"""

from .app import ServerHandle, run_forever, start_in_thread
from .server import ApiServer

__all__ = ["ApiServer", "ServerHandle", "run_forever", "start_in_thread"]
