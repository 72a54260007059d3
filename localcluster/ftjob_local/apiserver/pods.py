"""What only pods have: binding to a node (pods/binding and the `bindings` resource), eviction that respects
PodDisruptionBudgets (pods/eviction), and container output (pods/log, followed while the container runs)."""

from __future__ import annotations

import asyncio
import copy
import math
import os
from typing import Any

from aiohttp import web
from ftjob_trainer.contract import now_rfc3339

from .errors import ApiError, FieldError, bad_request, conflict, invalid
from .objects import Objects
from .resources import PDB_KEY, POD_KEY
from .selectors import label_selector_from_dict
from .store import Store
from .wire import truthy

LOG_POLL_S = 0.2


def bind(objects: Objects, ns: str, name: str, body: Any) -> dict[str, Any]:
    pod = objects.get(objects.registry.types[POD_KEY], ns, name)
    target = (body or {}).get("target") or {}
    node = target.get("name")
    if not node:
        raise invalid(
            "Binding", "", name, [FieldError("target.name", "Required value", "FieldValueRequired")]
        )
    if (pod.get("spec") or {}).get("nodeName"):
        raise conflict(
            "pods/binding",
            "",
            name,
            f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"',
        )
    if pod["metadata"].get("deletionTimestamp"):
        raise conflict("pods/binding", "", name, f"pod {name} is being deleted, cannot be assigned to a host")
    new = copy.deepcopy(pod)
    new["spec"]["nodeName"] = node
    conds = [
        c for c in (new.setdefault("status", {}).get("conditions") or []) if c.get("type") != "PodScheduled"
    ]
    conds.append(
        {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": now_rfc3339()}
    )
    new["status"]["conditions"] = conds
    new["metadata"]["resourceVersion"] = str(objects.store.next_rv())
    objects.store.put(POD_KEY, new, pod)
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def evict(objects: Objects, ns: str, name: str, body: Any) -> dict[str, Any]:
    rt = objects.registry.types[POD_KEY]
    pod = objects.get(rt, ns, name)
    if not pod["metadata"].get("deletionTimestamp") and _pod_ready(pod):
        for pdb in objects.store.list(PDB_KEY, ns):
            select = label_selector_from_dict((pdb.get("spec") or {}).get("selector"))
            if not select(pod["metadata"].get("labels") or {}):
                continue
            if not _pdb_allows(objects.store, ns, pdb, select):
                raise ApiError(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's "
                    f"disruption budget {pdb['metadata']['name']!r}.",
                    {
                        "causes": [
                            {
                                "reason": "DisruptionBudget",
                                "message": "The disruption budget "
                                f"{pdb['metadata']['name']} does not allow more disruptions",
                            }
                        ]
                    },
                )
    new = copy.deepcopy(pod)
    conds = [
        c
        for c in (new.setdefault("status", {}).get("conditions") or [])
        if c.get("type") != "DisruptionTarget"
    ]
    conds.append(
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "EvictionByEvictionAPI",
            "message": "Eviction API: evicting",
            "lastProbeTime": None,
            "lastTransitionTime": now_rfc3339(),
        }
    )
    new["status"]["conditions"] = conds
    new["metadata"]["resourceVersion"] = str(objects.store.next_rv())
    objects.store.put(POD_KEY, new, pod)
    objects.delete(rt, ns, name, (body or {}).get("deleteOptions") or {})
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def _pdb_allows(store: Store, ns: str, pdb: dict[str, Any], select: Any) -> bool:
    pods = [p for p in store.list(POD_KEY, ns) if select(p["metadata"].get("labels") or {})]
    expected = len(pods)
    healthy = sum(1 for p in pods if _pod_ready(p) and not p["metadata"].get("deletionTimestamp"))
    spec = pdb.get("spec") or {}

    def resolve(value: Any, round_up: bool) -> int:
        if isinstance(value, str) and value.endswith("%"):
            f = int(value[:-1]) * expected / 100
            return math.ceil(f) if round_up else math.floor(f)
        return int(value)

    if "minAvailable" in spec:
        return healthy - 1 >= resolve(spec["minAvailable"], True)
    if "maxUnavailable" in spec:
        return (expected - healthy) + 1 <= resolve(spec["maxUnavailable"], True)
    return True


async def pod_log(
    request: web.Request, objects: Objects, logs_dir: str, ns: str, name: str
) -> web.StreamResponse:
    pod = objects.get(objects.registry.types[POD_KEY], ns, name)
    params = request.query
    names = [c["name"] for c in (pod.get("spec") or {}).get("containers") or []]
    names += [c["name"] for c in (pod.get("spec") or {}).get("initContainers") or []]
    container = params.get("container")
    if not container:
        if len(names) != 1:
            raise bad_request(
                f"a container name must be specified for pod {name}, choose one of: [{' '.join(names)}]"
            )
        container = names[0]
    if container not in names:
        raise bad_request(f"container {container} is not valid for pod {name}")
    suffix = ".previous.log" if truthy(params.get("previous")) else ".log"
    path = os.path.join(logs_dir, container + suffix)
    if not os.path.exists(path):
        if suffix == ".previous.log":
            raise bad_request(f'previous terminated container "{container}" in pod "{name}" not found')
        raise bad_request(f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating')
    tail = int(params["tailLines"]) if params.get("tailLines") else None
    limit = int(params["limitBytes"]) if params.get("limitBytes") else None
    with open(path, "rb") as f:
        data = f.read()
        offset = f.tell()
    if tail is not None:
        lines = data.splitlines(keepends=True)
        data = b"".join(lines[-tail:]) if tail > 0 else b""
    if limit is not None:
        data = data[:limit]
    if not truthy(params.get("follow")):
        return web.Response(body=data, content_type="text/plain")
    resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    try:
        await resp.write(data)
        sent = len(data)
        while limit is None or sent < limit:
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
                offset = f.tell()
            if chunk:
                if limit is not None:
                    chunk = chunk[: limit - sent]
                await resp.write(chunk)
                sent += len(chunk)
                continue
            current = objects.store.get(POD_KEY, ns, name)
            if (
                current is None
                or current["metadata"]["uid"] != pod["metadata"]["uid"]
                or _container_done(current, container)
            ):
                break
            if request.transport is None or request.transport.is_closing():
                break
            await asyncio.sleep(LOG_POLL_S)  # following a file the kubelet appends to
        await resp.write_eof()
    except (ConnectionResetError, ConnectionError):
        pass
    return resp


def _pod_ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _container_done(pod: dict[str, Any], container: str) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    for cs in (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or []):
        if cs.get("name") == container and "terminated" in (cs.get("state") or {}):
            return True
    return False
