"""Deletion: preconditions, graceful deletion of pods, finalizers, namespaces that empty themselves, and garbage
collection along ownerReferences (Background, Foreground and Orphan propagation)."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

from ftjob_trainer.contract import format_time

from .errors import bad_request, conflict, not_found
from .resources import CRD_KEY, NS_KEY, POD_KEY, Registry, ResourceType
from .store import Store


def deletion_time(grace_s: float = 0.0) -> str:
    """deletionTimestamp: when the grace period ends."""
    return format_time(dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=grace_s))


def grace_pending(rt: ResourceType, obj: dict[str, Any]) -> bool:
    """A pod whose grace period is running stays until the kubelet deletes it with grace 0."""
    return rt.key == POD_KEY and int(obj["metadata"].get("deletionGracePeriodSeconds") or 0) > 0


class Deletion:
    """Deletes objects over the store; the object core (objects.Objects) hands every delete to it."""

    def __init__(self, store: Store, registry: Registry):
        self.store = store
        self.registry = registry

    def delete(self, rt: ResourceType, ns: str, name: str, opts: dict[str, Any]) -> dict[str, Any]:
        obj = self.store.get(rt.key, ns if rt.namespaced else "", name)
        if obj is None:
            raise not_found(rt.plural, rt.group, name)
        meta = obj["metadata"]
        pre = opts.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != meta["uid"]:
            raise conflict(
                rt.plural,
                rt.group,
                name,
                f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: {meta['uid']}",
            )
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
            raise conflict(
                rt.plural,
                rt.group,
                name,
                "Precondition failed: ResourceVersion in precondition: "
                f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                f"{meta['resourceVersion']}",
            )
        if opts.get("dryRun"):
            return obj
        policy = opts.get("propagationPolicy") or ("Orphan" if opts.get("orphanDependents") else "Background")
        if policy not in ("Background", "Foreground", "Orphan"):
            raise bad_request(f"invalid propagationPolicy {policy!r}: use Background, Foreground or Orphan")
        grace = 0
        if rt.key == POD_KEY:
            spec, status = obj.get("spec") or {}, obj.get("status") or {}
            grace = opts.get("gracePeriodSeconds")
            if grace is None:
                grace = int(spec.get("terminationGracePeriodSeconds", 30))
            if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
                grace = 0  # nothing runs it (or it already ended): gone at once, as in Kubernetes
            grace = max(int(grace), 0)
        if policy == "Orphan":
            self._orphan_dependents(meta["uid"])
        new = copy.deepcopy(obj)
        nmeta = new["metadata"]
        finalizers = list(nmeta.get("finalizers") or [])
        if (
            policy == "Foreground"
            and self.store.by_owner(meta["uid"])
            and "foregroundDeletion" not in finalizers
        ):
            finalizers.append("foregroundDeletion")
            nmeta["finalizers"] = finalizers
        if rt.key == NS_KEY:
            return self._delete_namespace(rt, new)
        already = nmeta.get("deletionTimestamp")
        if already:
            current = int(nmeta.get("deletionGracePeriodSeconds") or 0)
            if rt.key == POD_KEY and grace < current:
                nmeta["deletionGracePeriodSeconds"] = grace
                nmeta["deletionTimestamp"] = deletion_time(grace)
            elif new == obj:
                return obj
        else:
            nmeta["deletionTimestamp"] = deletion_time(grace)
            nmeta["deletionGracePeriodSeconds"] = grace
        if not finalizers and grace == 0:
            nmeta["resourceVersion"] = str(self.store.next_rv())
            self.remove(rt, new)
            return new
        nmeta["resourceVersion"] = str(self.store.next_rv())
        self.store.put(rt.key, new, obj)
        if "foregroundDeletion" in finalizers:
            self._cascade(meta["uid"], "Foreground")
            self._maybe_finish_foreground(meta["uid"])
        return self.store.get(rt.key, ns if rt.namespaced else "", name) or new

    def remove(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        """Remove for good (obj carries its final resourceVersion), then collect what depended on it."""
        self.store.remove(rt.key, obj)
        meta = obj["metadata"]
        if rt.key == CRD_KEY:
            custom = self.registry.types.get((obj["spec"]["group"], obj["spec"]["names"]["plural"]))
            if custom is not None and custom.crd is not None:
                for cr in self.store.list(custom.key):
                    final = copy.deepcopy(cr)
                    final["metadata"]["resourceVersion"] = str(self.store.next_rv())
                    self.store.remove(custom.key, final)
            self.registry.remove_crd(obj)
        self._cascade(meta["uid"], "Background")
        for ref in meta.get("ownerReferences") or []:
            self._maybe_finish_foreground(ref.get("uid", ""))
        ns = meta.get("namespace")
        if ns:
            self._maybe_finish_namespace(ns)

    def _cascade(self, owner_uid: str, policy: str) -> None:
        for key, dep in self.store.by_owner(owner_uid):
            dmeta = dep["metadata"]
            if dmeta.get("deletionTimestamp") and policy == "Background":
                continue
            owners_left = [
                r
                for r in dmeta.get("ownerReferences") or []
                if r.get("uid") != owner_uid and self.store.locate(r.get("uid", "")) is not None
            ]
            if owners_left:
                continue
            dep_rt = self.registry.types.get(key)
            if dep_rt is None:
                continue
            if dmeta.get("deletionTimestamp"):
                continue
            self.delete(dep_rt, dmeta.get("namespace", ""), dmeta["name"], {"propagationPolicy": policy})

    def _maybe_finish_foreground(self, owner_uid: str) -> None:
        loc = self.store.locate(owner_uid)
        if loc is None:
            return
        key, ns, name = loc
        owner = self.store.get(key, ns, name)
        if owner is None or "foregroundDeletion" not in (owner["metadata"].get("finalizers") or []):
            return
        if self.store.by_owner(owner_uid):
            return
        rt = self.registry.types[key]
        new = copy.deepcopy(owner)
        new["metadata"]["finalizers"] = [
            f for f in new["metadata"]["finalizers"] if f != "foregroundDeletion"
        ]
        if not new["metadata"]["finalizers"]:
            new["metadata"].pop("finalizers")
        new["metadata"]["resourceVersion"] = str(self.store.next_rv())
        if not new["metadata"].get("finalizers") and not grace_pending(rt, new):
            self.remove(rt, new)
        else:
            self.store.put(key, new, owner)

    def _orphan_dependents(self, owner_uid: str) -> None:
        for key, dep in self.store.by_owner(owner_uid):
            new = copy.deepcopy(dep)
            refs = [r for r in new["metadata"]["ownerReferences"] if r.get("uid") != owner_uid]
            if refs:
                new["metadata"]["ownerReferences"] = refs
            else:
                new["metadata"].pop("ownerReferences")
            new["metadata"]["resourceVersion"] = str(self.store.next_rv())
            self.store.put(key, new, dep)

    def _delete_namespace(self, rt: ResourceType, new: dict[str, Any]) -> dict[str, Any]:
        name = new["metadata"]["name"]
        old = self.store.get(NS_KEY, "", name)
        if not new["metadata"].get("deletionTimestamp"):
            new["metadata"]["deletionTimestamp"] = deletion_time()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            new.setdefault("status", {})["phase"] = "Terminating"
            new["metadata"]["resourceVersion"] = str(self.store.next_rv())
            self.store.put(NS_KEY, new, old)
        for key, rtype in list(self.registry.types.items()):
            if not rtype.namespaced:
                continue
            for obj in self.store.list(key, name):
                if not obj["metadata"].get("deletionTimestamp"):
                    self.delete(rtype, name, obj["metadata"]["name"], {})
        self._maybe_finish_namespace(name)
        return self.store.get(NS_KEY, "", name) or new

    def _maybe_finish_namespace(self, ns: str) -> None:
        nso = self.store.get(NS_KEY, "", ns)
        if nso is None or not nso["metadata"].get("deletionTimestamp"):
            return
        for key, rtype in self.registry.types.items():
            if rtype.namespaced and self.store.list(key, ns):
                return
        if nso["metadata"].get("finalizers"):
            return
        final = copy.deepcopy(nso)
        final["metadata"]["resourceVersion"] = str(self.store.next_rv())
        self.store.remove(NS_KEY, final)
