"""The pod's status as the kubelet reports it: phase, conditions, container statuses; written when it changes."""

from __future__ import annotations

import json
import logging

from ftjob_trainer.contract import now_rfc3339

from ..client import ApiError, Obj
from ..objects import pod_path, set_condition
from .container import HOST_IP, Ctr
from .pod import PodBase

log = logging.getLogger(__name__)

_KUBELET_CONDITIONS = ("PodScheduled", "Initialized", "ContainersReady", "Ready", "PodReadyToStartContainers")


class PodStatus(PodBase):
    def _container_status(self, c: Ctr) -> Obj:
        s = {
            "name": c.name,
            "image": c.spec.get("image", ""),
            "imageID": "",
            "ready": c.ready,
            "restartCount": c.restart_count,
            "started": c.proc is not None,
            "state": c.state,
            "lastState": c.last_state,
        }
        if c.proc is not None:
            s["containerID"] = f"local://{self.uid}/{c.name}"
        return s

    def _phase(self) -> str:
        if not self.initialized:
            return "Failed" if self._init_failed() else "Pending"
        if all(c.done for c in self.ctrs):
            codes = [c.state.get("terminated", {}).get("exitCode", 1) for c in self.ctrs]
            return "Succeeded" if all(x == 0 for x in codes) else "Failed"
        if any(c.proc is not None or c.restart_count or "terminated" in c.state for c in self.ctrs):
            return "Running"
        return "Pending"

    def _status(self) -> Obj:
        phase = self._phase()
        current = (self.pod.get("status") or {}).get("conditions") or []
        ready = phase == "Running" and all(c.ready for c in self.ctrs)
        conds = [c for c in current if c.get("type") not in _KUBELET_CONDITIONS]
        extra_types = {c["type"] for c in self.extra_conditions}
        conds = [c for c in conds if c.get("type") not in extra_types] + self.extra_conditions
        mine = [c for c in current if c.get("type") in _KUBELET_CONDITIONS]
        mine = set_condition(mine, "PodScheduled", "True")
        mine = set_condition(mine, "PodReadyToStartContainers", "True")
        mine = set_condition(
            mine,
            "Initialized",
            "True" if self.initialized else "False",
            "" if self.initialized else "ContainersNotInitialized",
        )
        reason = (
            "" if ready else ("PodCompleted" if phase in ("Succeeded", "Failed") else "ContainersNotReady")
        )
        mine = set_condition(mine, "ContainersReady", "True" if ready else "False", reason)
        mine = set_condition(mine, "Ready", "True" if ready else "False", reason)
        status: Obj = {
            "phase": phase,
            "conditions": mine + conds,
            "hostIP": HOST_IP,
            "hostIPs": [{"ip": HOST_IP}],
            "podIP": self.pod_ip,
            "podIPs": [{"ip": self.pod_ip}],
            "startTime": (self.pod.get("status") or {}).get("startTime") or now_rfc3339(),
            "containerStatuses": [self._container_status(c) for c in self.ctrs],
        }
        if self.inits:
            status["initContainerStatuses"] = [self._container_status(c) for c in self.inits]
        return status

    def _patch_status(self, force: bool = False) -> bool:
        """Writes the pod's status if it changed (or force); False when the write failed (retried later)."""
        if self.gone or not self.pod_ip:
            return True
        status = self._status()
        comparable = json.dumps(
            {
                **status,
                "conditions": [
                    {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status["conditions"]
                ],
            },
            sort_keys=True,
        )
        if not force and comparable == self.last_status:
            return True
        try:
            self.pod = self.k.kube.merge_patch(
                pod_path(self.ns, self.name, "status"), {"metadata": {"uid": self.uid}, "status": status}
            )
            self.last_status = comparable
            return True
        except ApiError as e:
            if e.status == 404:
                self.gone = True
                return True
            log.warning("pod %s/%s: status update failed: %s", self.ns, self.name, e)
        except Exception as e:  # the API server may be restarting; retried on the next tick
            log.warning("pod %s/%s: status update failed: %s", self.ns, self.name, e)
        return False
