"""A pod's volumes as local folders: emptyDir, PVC, hostPath, secret/configMap/downwardAPI files."""

from __future__ import annotations

import base64
from pathlib import Path

from ..client import Obj
from .pod import PodBase


class PodVolumes(PodBase):
    def _prepare_volumes(self) -> tuple[list[tuple[str, str]], list[str]]:
        notes: list[str] = []
        backing: dict[str, Path] = {}
        for v in (self.pod.get("spec") or {}).get("volumes") or []:
            name = v["name"]
            vdir = self.dir / "volumes" / name
            if "emptyDir" in v:
                vdir.mkdir(parents=True, exist_ok=True)
                backing[name] = vdir
            elif "persistentVolumeClaim" in v:
                p = self.k.state_dir / "pvcs" / self.ns / v["persistentVolumeClaim"]["claimName"]
                p.mkdir(parents=True, exist_ok=True)
                backing[name] = p
            elif "hostPath" in v:
                p = Path(v["hostPath"]["path"])
                if v["hostPath"].get("type") in ("DirectoryOrCreate",) and not p.exists():
                    p.mkdir(parents=True, exist_ok=True)
                backing[name] = p
            elif "secret" in v or "configMap" in v:
                vdir.mkdir(parents=True, exist_ok=True)
                self._write_key_files(v, vdir, notes)
                backing[name] = vdir
            elif "downwardAPI" in v:
                vdir.mkdir(parents=True, exist_ok=True)
                for item in v["downwardAPI"].get("items") or []:
                    if "fieldRef" in item:
                        (vdir / item["path"]).parent.mkdir(parents=True, exist_ok=True)
                        (vdir / item["path"]).write_text(self._field(item["fieldRef"]["fieldPath"]))
                backing[name] = vdir
            else:
                vdir.mkdir(parents=True, exist_ok=True)
                backing[name] = vdir
                kinds = [k for k in v if k != "name"]
                notes.append(
                    f"Volume {name} ({', '.join(kinds)}) is not emulated: it is an empty folder {vdir}."
                )
        mounts: list[tuple[str, str]] = []
        for c in self.inits + self.ctrs:
            for vm in c.spec.get("volumeMounts") or []:
                if vm.get("name") not in backing:
                    continue
                target = backing[vm["name"]] / vm["subPath"] if vm.get("subPath") else backing[vm["name"]]
                if vm.get("subPath"):
                    target.mkdir(parents=True, exist_ok=True)
                pair = (vm["mountPath"], str(target))
                if pair not in mounts:
                    mounts.append(pair)
        mounts.sort(key=lambda p: -len(p[0]))
        return mounts, notes

    def _write_key_files(self, v: Obj, vdir: Path, notes: list[str]) -> None:
        src = v.get("secret") or v.get("configMap")
        is_secret = "secret" in v
        name = src.get("secretName") if is_secret else src.get("name")
        obj = self.k.kube.get(
            f"/api/v1/namespaces/{self.ns}/{'secrets' if is_secret else 'configmaps'}/{name}"
        )
        if obj is None:
            if not src.get("optional"):
                notes.append(
                    f"{'Secret' if is_secret else 'ConfigMap'} {name} of volume {v['name']} not found."
                )
            return
        data = (
            {k: base64.b64decode(val) for k, val in (obj.get("data") or {}).items()}
            if is_secret
            else {
                **{k: val.encode() for k, val in (obj.get("data") or {}).items()},
                **{k: base64.b64decode(val) for k, val in (obj.get("binaryData") or {}).items()},
            }
        )
        items = src.get("items") or [{"key": k, "path": k} for k in data]
        for item in items:
            if item["key"] in data:
                f = vdir / item["path"]
                f.parent.mkdir(parents=True, exist_ok=True)
                f.write_bytes(data[item["key"]])
