"""Readiness and liveness probes (httpGet, tcpSocket, exec) of running containers."""

from __future__ import annotations

import signal
import socket
import subprocess
import urllib.request

from ..client import Obj
from ..objects import post_event
from .container import Ctr, expand, rewrite_paths
from .processes import PodProcesses


class PodProbes(PodProcesses):
    def _run_probe(self, c: Ctr, probe: Obj) -> bool:
        timeout = float(probe.get("timeoutSeconds", 1))
        try:
            if "httpGet" in probe:
                h = probe["httpGet"]
                port = self._port(c, h.get("port"))
                host = h.get("host") or self.own_ip  # as from inside the pod
                url = f"{h.get('scheme', 'HTTP').lower()}://{host}:{port}{h.get('path', '/')}"
                req = urllib.request.Request(
                    url, headers={x["name"]: x["value"] for x in h.get("httpHeaders") or []}
                )
                with urllib.request.urlopen(req, timeout=timeout) as resp:
                    return 200 <= resp.status < 400
            if "tcpSocket" in probe:
                t = probe["tcpSocket"]
                with socket.create_connection(
                    (t.get("host") or self.own_ip, self._port(c, t.get("port"))), timeout
                ):
                    return True
            if "exec" in probe:
                argv = [
                    rewrite_paths(expand(x, c.env), self._mounts_for(c))
                    for x in probe["exec"].get("command") or []
                ]
                return (
                    subprocess.run(
                        argv,
                        env=c.env,
                        cwd=c.cwd or None,
                        timeout=timeout,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    ).returncode
                    == 0
                )
        except Exception:
            return False
        return True

    def _port(self, c: Ctr, port) -> int:
        if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
            return int(port)
        for p in c.spec.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        raise ValueError(f"unknown named port {port}")

    def _probe(self, now: float) -> None:
        for c in self.ctrs:
            if c.proc is None:
                continue
            for kind in ("readinessProbe", "livenessProbe"):
                probe = c.spec.get(kind)
                if not probe:
                    if kind == "readinessProbe":
                        c.ready = True
                    continue
                due = c.probe_next.get(kind, c.started_mono + float(probe.get("initialDelaySeconds", 0)))
                if now < due:
                    continue
                c.probe_next[kind] = now + float(probe.get("periodSeconds", 10))
                if self._run_probe(c, probe):
                    c.probe_ok[kind] = c.probe_ok.get(kind, 0) + 1
                    c.probe_fail[kind] = 0
                    if kind == "readinessProbe" and c.probe_ok[kind] >= int(probe.get("successThreshold", 1)):
                        c.ready = True
                else:
                    c.probe_fail[kind] = c.probe_fail.get(kind, 0) + 1
                    c.probe_ok[kind] = 0
                    if c.probe_fail[kind] >= int(probe.get("failureThreshold", 3)):
                        if kind == "readinessProbe":
                            c.ready = False
                        else:
                            post_event(
                                self.k.kube,
                                self.pod,
                                "Unhealthy",
                                f"Liveness probe failed; restarting container {c.name}",
                                type_="Warning",
                                host=self.node,
                            )
                            c.probe_fail[kind] = 0
                            self._signal(c, signal.SIGKILL)
