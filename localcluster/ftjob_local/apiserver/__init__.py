"""An embedded, Kubernetes-API-compatible API server (aiohttp): the real kubectl, helm, the official `kubernetes`
client and kopf work against it unchanged.

Run it: `python -m ftjob_local.apiserver --state-dir DIR --port P` (plain HTTP; the URL goes to DIR/apiserver.url),
or `start_in_thread(state_dir)` in tests (returns a handle with `.url`, `.stop()` and `.call(fn)`).

Modules, top to bottom (each imports only modules below it; no cycles):
- `app` (foreground / background-thread runners) -> `server` (`ApiServer`: the state, the aiohttp app, housekeeping);
- `routing` (URL -> handler, authentication and RBAC per request), `discovery` (/api, /apis, APIResourceLists);
- `handlers` (a resource's endpoints: one handler per HTTP method in COLLECTION / OBJECT) and `subresources` (the
  subresource table: one entry gives a subresource its discovery and its handlers);
- `watch` (streams, bookmarks, 410 Gone), `pods` (binding, eviction, logs), `scale`; `calls` (one API call);
- `objects` (the object core: create/get/update/patch, resourceVersion, generation, status) over `deletion`
  (graceful deletion, finalizers, ownerReference garbage collection, namespaces) and `admission` (the table of
  per-type admission: `admission_core` for pods/services/namespaces/secrets, `admission_crd`; `validation`);
- the bottom: `store` (sqlite persistence in batched commits, resourceVersions, indexes by namespace, label and
  field, watch history per kind), `resources` (built-in types, CRD
  registry), `schema` (structural schemas and CEL), `patch` (merge, JSON and strategic merge patch), `selectors`,
  `tables` (server-side printing), `openapi` (v3 documents), `auth` (tokens, RBAC, access reviews), `protobuf` (the
  few protobuf bodies typed client-go clients send), `wire` (JSON responses, bodies, errors as Status), `errors`.

Not emulated: controllers (Deployments do not create pods, no Endpoints), admission webhooks, CRD conversion
webhooks (all served versions share one stored form), server-side apply field ownership (apply patches merge),
aggregated discovery, OpenAPI v2, pods/exec|attach|portforward, protobuf bodies beyond those listed in
`protobuf.py` (`kubectl create deployment` fails; `kubectl apply -f` works), TLS (client-go therefore sends no
tokens; use `kubectl --as`).
"""

from .app import ServerHandle, run_forever, start_in_thread
from .server import ApiServer

__all__ = ["ApiServer", "ServerHandle", "run_forever", "start_in_thread"]
