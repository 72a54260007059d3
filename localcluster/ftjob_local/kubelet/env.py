"""A container's environment: host basics, envFrom, env (valueFrom), $(VAR) expansion, mount-path rewriting."""

from __future__ import annotations

import base64
import json
import math
import os
import sys
from pathlib import Path

from ftjob_trainer.contract import ENV_TERMINATION_LOG
from kubernetes.utils.quantity import parse_quantity

from ..client import Obj
from .container import DEFAULT_TERMINATION_PATH, ENV_MOUNTS, ConfigError, Ctr, expand, rewrite_paths
from .pod import PodBase

# PYTHONPATH too: containers run ftjob's own Python, so they import the same ftjob as the node agent (a source
# checkout run with PYTHONPATH gets its own trainer in the pods, not whichever one the interpreter has installed).
_HOST_ENV = ("HOME", "LANG", "LC_ALL", "TMPDIR", "TZ", "USER", "LOGNAME", "PYTHONPATH")


class PodEnvironment(PodBase):
    def _resource(self, c: Ctr, ref: Obj) -> str:
        res = c.spec.get("resources") or {}
        kind, _, resource = ref["resource"].partition(".")
        value = (res.get(kind) or {}).get(resource)
        if value is None:
            node = self.k.nodes.get("", self.node) or {}
            value = ((node.get("status") or {}).get("allocatable") or {}).get(resource, "0")
        q = parse_quantity(value) / parse_quantity(ref.get("divisor", "1") or "1")
        return str(math.ceil(q) if resource == "cpu" else int(q.to_integral_value(rounding="ROUND_CEILING")))

    def _key_ref(self, kind: str, ref: Obj) -> str | None:
        plural = "secrets" if kind == "secret" else "configmaps"
        obj = self.k.kube.get(f"/api/v1/namespaces/{self.ns}/{plural}/{ref.get('name')}")
        data = (obj or {}).get("data") or {}
        if obj is None or ref["key"] not in data:
            if ref.get("optional"):
                return None
            what = "secret" if kind == "secret" else "configmap"
            missing = (
                f'{what} "{ref.get("name")}" not found'
                if obj is None
                else f"couldn't find key {ref['key']} in {what.capitalize()} {self.ns}/{ref.get('name')}"
            )
            raise ConfigError("CreateContainerConfigError", missing)
        value = data[ref["key"]]
        return base64.b64decode(value).decode(errors="replace") if kind == "secret" else value

    def _environment(self, c: Ctr) -> dict[str, str]:
        env = {k: os.environ[k] for k in _HOST_ENV if k in os.environ}
        env["PATH"] = os.pathsep.join(
            [str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")]
        )
        env["HOSTNAME"] = self.name
        for src in c.spec.get("envFrom") or []:
            kind = "secret" if "secretRef" in src else "configmap"
            ref = src.get("secretRef") or src.get("configMapRef") or {}
            obj = self.k.kube.get(
                f"/api/v1/namespaces/{self.ns}/{'secrets' if kind == 'secret' else 'configmaps'}"
                f"/{ref.get('name')}"
            )
            if obj is None:
                if ref.get("optional"):
                    continue
                raise ConfigError("CreateContainerConfigError", f'{kind} "{ref.get("name")}" not found')
            for k, val in (obj.get("data") or {}).items():
                env[src.get("prefix", "") + k] = (
                    base64.b64decode(val).decode(errors="replace") if kind == "secret" else val
                )
        for e in c.spec.get("env") or []:
            if "valueFrom" in e:
                vf = e["valueFrom"]
                if "fieldRef" in vf:
                    value = self._field(vf["fieldRef"]["fieldPath"])
                elif "resourceFieldRef" in vf:
                    value = self._resource(c, vf["resourceFieldRef"])
                elif "secretKeyRef" in vf:
                    value = self._key_ref("secret", vf["secretKeyRef"])
                elif "configMapKeyRef" in vf:
                    value = self._key_ref("configmap", vf["configMapKeyRef"])
                else:
                    raise ConfigError(
                        "CreateContainerConfigError", f"env {e['name']}: unsupported valueFrom {vf}"
                    )
                if value is None:
                    continue
            else:
                value = expand(e.get("value", ""), env)
            env[e["name"]] = rewrite_paths(value, self._mounts_for(c))
        env["PATH"] = (
            str(Path(sys.executable).parent) + os.pathsep + env["PATH"]
            if not env["PATH"].startswith(str(Path(sys.executable).parent) + os.pathsep)
            else env["PATH"]
        )
        env[ENV_TERMINATION_LOG] = str(c.term_file)
        env[ENV_MOUNTS] = json.dumps(dict(self._mounts_for(c)))
        return env

    def _mounts_for(self, c: Ctr) -> list[tuple[str, str]]:
        own = {vm["mountPath"] for vm in c.spec.get("volumeMounts") or []}
        mounts = [m for m in self.mounts if m[0] in own]
        mounts.append((c.spec.get("terminationMessagePath") or DEFAULT_TERMINATION_PATH, str(c.term_file)))
        return sorted(mounts, key=lambda p: -len(p[0]))
