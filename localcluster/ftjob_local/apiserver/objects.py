"""The object core: create, read, update and patch over the Store, with the semantics clients rely on
(resourceVersion and optimistic concurrency, generation, status as a subresource, dry runs, admission); deletes go
to deletion.Deletion. Everything that writes an object goes through here."""

from __future__ import annotations

import copy
import random
import uuid
from typing import Any

from ftjob_trainer.contract import now_rfc3339

from .admission import AdmissionEnv, admit
from .auth import Tokens
from .deletion import Deletion, grace_pending
from .errors import (
    ApiError,
    FieldError,
    already_exists,
    bad_request,
    conflict,
    forbidden,
    invalid,
    not_found,
)
from .patch import apply_patch, merge_patch
from .resources import CRD_KEY, NODE_KEY, NS_KEY, POD_KEY, SA_KEY, Registry, ResourceType
from .selectors import index_terms, object_matcher
from .store import Store, sort_objects
from .validation import name_errors

_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def served(rt: ResourceType, version: str, obj: dict[str, Any]) -> dict[str, Any]:
    """An object as served at `version`: custom resources are stored once and shown at the version asked for."""
    if rt.crd is not None or obj.get("apiVersion") != rt.api_version(version) or "kind" not in obj:
        obj = dict(obj)
        obj["apiVersion"] = rt.api_version(version)
        obj["kind"] = rt.kind
    obj.pop("__warnings__", None)
    return obj


def _dry_run(params: Any) -> bool:
    return bool(params.get("dryRun")) if hasattr(params, "get") else False


def spec_part(obj: dict[str, Any], with_status: bool) -> dict[str, Any]:
    """Everything generation tracks: all but metadata (and status where status is a subresource)."""
    skip = {"metadata", "status"} if with_status else {"metadata"}
    return {k: v for k, v in obj.items() if k not in skip}


def check_kind(rt: ResourceType, version: str, body: dict[str, Any]) -> None:
    if not isinstance(body, dict):
        raise bad_request(f"the body must be a JSON object (a {rt.kind})")
    kind, api_version = body.get("kind"), body.get("apiVersion")
    if kind and kind != rt.kind:
        raise bad_request(
            f"the kind of the body ({kind}) does not match the resource of the URL "
            f"({rt.qualified()}, kind {rt.kind})"
        )
    if api_version and api_version not in [rt.api_version(v) for v in rt.versions]:
        raise bad_request(
            f"the apiVersion of the body ({api_version}) does not match the URL ({rt.api_version(version)})"
        )


class Objects:
    """The objects of one server: `store` holds them, `registry` knows their types."""

    def __init__(self, store: Store, registry: Registry, tokens: Tokens):
        self.store = store
        self.registry = registry
        self.admission = AdmissionEnv(store, tokens)
        self.deletion = Deletion(store, registry)

    def get(self, rt: ResourceType, ns: str, name: str) -> dict[str, Any]:
        obj = self.store.get(rt.key, ns if rt.namespaced else "", name)
        if obj is None:
            raise not_found(rt.plural, rt.group, name)
        return obj

    def out(self, rt: ResourceType, version: str, obj: dict[str, Any]) -> dict[str, Any]:
        return served(rt, version, obj)

    def select(
        self, rt: ResourceType, ns: str | None, params: Any, name: str | None = None
    ) -> list[dict[str, Any]]:
        """The objects of a list, a watch or a collection delete: in `ns` (None: all), matching the selectors."""
        match = object_matcher(params, ns, name)
        if name is not None and ns is not None:  # one object (a legacy watch of it)
            obj = self.store.get(rt.key, ns, name)
            return [obj] if obj is not None and match(obj) else []
        terms = index_terms(params)
        candidates = self.store.kind(rt.key).candidates(ns, terms.labels, terms.label_keys, terms.fields)
        return sort_objects(o for o in candidates if match(o))

    def _check_namespace(self, rt: ResourceType, ns: str, creating: bool) -> None:
        if not rt.namespaced:
            return
        nso = self.store.get(NS_KEY, "", ns)
        if nso is None:
            raise not_found("namespaces", "", ns)
        if creating and nso["metadata"].get("deletionTimestamp"):
            raise forbidden(
                f'{rt.plural} "{ns}" is forbidden: unable to create new content in namespace {ns} '
                "because it is being terminated",
                {
                    "name": ns,
                    "kind": rt.plural,
                    "causes": [
                        {
                            "reason": "NamespaceTerminating",
                            "message": f"namespace {ns} is being terminated",
                            "field": "metadata.namespace",
                        }
                    ],
                },
            )

    def create(self, rt: ResourceType, version: str, ns: str, body: Any, params: Any) -> dict[str, Any]:
        check_kind(rt, version, body)
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != ns:
                raise bad_request(
                    f"the namespace of the provided object ({meta['namespace']}) does not match the "
                    f"namespace sent on the request ({ns})"
                )
            meta["namespace"] = ns
            self._check_namespace(rt, ns, creating=True)
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if meta.get("generateName"):
                for _ in range(10):
                    meta["name"] = meta["generateName"] + "".join(random.choices(_GENERATE_ALPHABET, k=5))
                    if self.store.get(rt.key, ns, meta["name"]) is None:
                        break
            else:
                raise invalid(
                    rt.kind,
                    rt.group,
                    "",
                    [
                        FieldError(
                            "metadata.name",
                            "Required value: name or generateName is required",
                            "FieldValueRequired",
                        )
                    ],
                )
        name = meta["name"]
        obj["apiVersion"] = rt.api_version(version)
        obj["kind"] = rt.kind
        for k in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion", "selfLink"):
            meta.pop(k, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        meta["generation"] = 1
        if rt.has_status(version) and rt.key not in (NODE_KEY, POD_KEY, NS_KEY):
            obj.pop("status", None)
        errors = name_errors(rt, name)
        try:
            admit(self.admission, rt, version, obj, None, params)
        except ApiError as e:
            if e.reason != "Invalid" or not errors:
                raise
            errors += [FieldError(c["field"], c["message"], c["reason"]) for c in (e.details or {})["causes"]]
        if errors:
            raise invalid(rt.kind, rt.group, name, errors)
        if self.store.get(rt.key, ns if rt.namespaced else "", name) is not None:
            raise already_exists(rt.plural, rt.group, name)
        warnings = obj.pop("__warnings__", None)  # for the response only, never stored
        if _dry_run(params):
            meta["resourceVersion"] = str(self.store.rv)
        else:
            meta["resourceVersion"] = str(self.store.next_rv())
            self.store.put(rt.key, obj, None)
            self._after_write(rt, obj, None)
        return dict(obj, __warnings__=warnings) if warnings else obj

    def update(
        self,
        rt: ResourceType,
        version: str,
        ns: str,
        name: str,
        body: Any,
        params: Any,
        sub: str | None = None,
        precondition_required: bool = True,
    ) -> dict[str, Any]:
        check_kind(rt, version, body)
        old = self.get(rt, ns, name)
        meta = body.get("metadata") or {}
        if meta.get("name") and meta["name"] != name:
            raise bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL ({name})"
            )
        if rt.namespaced and meta.get("namespace") and meta["namespace"] != ns:
            raise bad_request(
                f"the namespace of the provided object ({meta['namespace']}) does not match the "
                f"namespace sent on the request ({ns})"
            )
        rv = meta.get("resourceVersion")
        if rv and str(rv) != old["metadata"]["resourceVersion"]:
            raise conflict(rt.plural, rt.group, name)
        if not rv and rt.crd is not None and precondition_required:
            raise invalid(
                rt.kind,
                rt.group,
                name,
                [
                    FieldError(
                        "metadata.resourceVersion", "Invalid value: 0x0: must be specified for an update"
                    )
                ],
            )
        with_status = rt.has_status(version)
        if sub == "status":
            new = copy.deepcopy(old)
            if "status" in body:
                new["status"] = copy.deepcopy(body["status"])
            else:
                new.pop("status", None)
        else:
            new = copy.deepcopy(body)
            new.setdefault("metadata", {})
            if with_status:
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
        nmeta = new["metadata"]
        ometa = old["metadata"]
        for k in (
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "namespace",
            "name",
        ):
            if k in ometa:
                nmeta[k] = ometa[k]
            else:
                nmeta.pop(k, None)
        new["apiVersion"] = rt.api_version(version)
        new["kind"] = rt.kind
        if ometa.get("deletionTimestamp"):
            added = set(nmeta.get("finalizers") or []) - set(ometa.get("finalizers") or [])
            if added:
                raise forbidden(
                    f'{rt.plural} "{name}" is forbidden: no new finalizers can be added if the object '
                    f"is being deleted, found new finalizers {sorted(added)}"
                )
        if spec_part(new, with_status) != spec_part(old, with_status):
            nmeta["generation"] = int(ometa.get("generation", 1)) + 1
        admit(self.admission, rt, version, new, old, params)
        nmeta["resourceVersion"] = ometa["resourceVersion"]
        new_warn = new.pop("__warnings__", None)
        if new == old:
            return old  # a no-op update changes nothing and wakes no watcher, as in Kubernetes
        if new_warn:
            new["__warnings__"] = new_warn
        if _dry_run(params):
            return new
        warnings = new.pop("__warnings__", None)
        nmeta["resourceVersion"] = str(self.store.next_rv())
        if nmeta.get("deletionTimestamp") and not nmeta.get("finalizers") and not grace_pending(rt, new):
            self.deletion.remove(rt, new)
            return new
        self.store.put(rt.key, new, old)
        self._after_write(rt, new, old)
        if warnings:
            new = dict(new, __warnings__=warnings)
        return new

    def patch(
        self,
        rt: ResourceType,
        version: str,
        ns: str,
        name: str,
        body: Any,
        content_type: str,
        params: Any,
        sub: str | None = None,
    ) -> tuple[dict[str, Any], bool]:
        """The patched object and whether it was created (an apply patch of an object that does not exist)."""
        old = self.store.get(rt.key, ns if rt.namespaced else "", name)
        if content_type == "application/apply-patch+yaml":
            # Server-side apply, simplified: create when missing, else merge (no field ownership tracking).
            if old is None:
                body.setdefault("metadata", {})["name"] = name
                return self.create(rt, version, ns, body, params), True
            patched = merge_patch(old, body)
        else:
            if old is None:
                raise not_found(rt.plural, rt.group, name)
            patched = apply_patch(self.out(rt, version, old), body, content_type, strategic=rt.crd is None)
        if not isinstance(patched, dict):
            raise bad_request("the patch must leave an object")
        patched.setdefault("metadata", {})
        prv = patched["metadata"].get("resourceVersion")
        if prv and str(prv) != old["metadata"]["resourceVersion"]:
            raise conflict(rt.plural, rt.group, name)
        patched["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        return self.update(rt, version, ns, name, patched, params, sub), False

    def _after_write(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if rt.key == CRD_KEY:
            self.registry.add_crd(obj)
        elif rt.key == NS_KEY and old is None:
            sa_rt = self.registry.types[SA_KEY]
            name = obj["metadata"]["name"]
            if self.store.get(SA_KEY, name, "default") is None:
                self.create(sa_rt, "v1", name, {"metadata": {"name": "default"}}, {})

    def delete(self, rt: ResourceType, ns: str, name: str, opts: dict[str, Any]) -> dict[str, Any]:
        """`opts`: DeleteOptions (handlers.delete_options adds the query's). Returns the object after the call."""
        return self.deletion.delete(rt, ns, name, opts)

    def delete_collection(
        self, rt: ResourceType, version: str, ns: str | None, params: Any, opts: dict[str, Any]
    ) -> dict[str, Any]:
        """Delete every object `params`' selectors match, each with the DeleteOptions `opts`."""
        deleted = [
            self.out(
                rt, version, self.delete(rt, o["metadata"].get("namespace", ""), o["metadata"]["name"], opts)
            )
            for o in self.select(rt, ns, params)
        ]
        return {
            "kind": rt.list_kind,
            "apiVersion": rt.api_version(version),
            "metadata": {"resourceVersion": str(self.store.rv)},
            "items": deleted,
        }
