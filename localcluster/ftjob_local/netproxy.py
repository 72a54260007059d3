"""Service proxy: listens on every Service's clusterIP:port (loopback addresses from 127.96.0.0/16) and forwards
each TCP connection to a ready endpoint pod's podIP:targetPort, as kube-proxy does (round robin over ready pods).

It also serves the pod IP of every pod that declares containerPorts: it listens on podIP:containerPort and forwards
to the address the pod's processes bind (objects.own_ip), so a connection straight to a pod passes here too. On both
paths it enforces NetworkPolicy ingress rules, as a CNI would: when a policy isolates the target pod, the pod that
opened the connection is found from /proc (peers.py) and the policies decide (netpolicy.py); a refused connection
is closed at once (a CNI drops its packets: the client times out instead). docs/INTERFACES.md says what it cannot
see.

`python -m ftjob_local.netproxy --kubeconfig K --state-dir DIR` runs it in a process of its own (the local cluster's
kube-proxy), so that restarting the kubelet or the API server cuts no connection a pod holds through a Service
(torchrun's rendezvous store client does not reconnect). While the API server is away it keeps forwarding with
what it last saw; it writes DIR/proxy/ready once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import signal
import threading
from pathlib import Path

from . import netpolicy, peers
from .client import Informer, Kube, Obj, key_of
from .labelindex import LabelIndex, SelectorIndex
from .objects import is_terminal, meta, own_ip, pod_ready, published_ports

log = logging.getLogger(__name__)
RESYNC_SECONDS = 3.0


def selector_matches(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def resolve_target_port(pod: Obj, target) -> int | None:
    if isinstance(target, int) or (isinstance(target, str) and target.isdigit()):
        return int(target)
    for c in (pod.get("spec") or {}).get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("name") == target:
                return int(p["containerPort"])
    return None


def endpoints(service: Obj, port: Obj, pods: list[Obj]) -> list[tuple[str, int]]:
    """Ready pods selected by the service, as (podIP, targetPort)."""
    return [(ip, tp) for _, ip, tp in endpoint_pods(service, port, pods)]


def endpoint_pods(service: Obj, port: Obj, pods: list[Obj]) -> list[tuple[Obj, str, int]]:
    """Ready pods selected by the service, as (pod, podIP, targetPort), ordered by address."""
    ns = meta(service).get("namespace", "default")
    selector = (service.get("spec") or {}).get("selector") or {}
    target = port.get("targetPort", port.get("port"))
    out = []
    for pod in pods:
        m = meta(pod)
        ip = (pod.get("status") or {}).get("podIP")
        if m.get("namespace", "default") != ns or m.get("deletionTimestamp") or not ip or not pod_ready(pod):
            continue
        if not selector_matches(selector, m.get("labels") or {}):
            continue
        tp = resolve_target_port(pod, target)
        if tp:
            out.append((pod, ip, tp))
    return sorted(out, key=lambda e: (e[1], e[2]))


class ServiceProxy:
    """Listeners follow the objects: an event re-derives only what the pod or Service that changed claims (its
    (ip, port) keys), and a connection reads its endpoints and policies from indexes (labelindex.py), so the cost
    of either does not grow with the number of other jobs."""

    def __init__(self, services: Informer, pods: Informer, policies: Informer, namespaces: Informer):
        self.services, self.pods, self.policies, self.namespaces = services, pods, policies, namespaces
        self.loop = asyncio.new_event_loop()
        # (ip, port) -> (server, owner): owner ("service", ns, name, port name) or ("pod", ns, name, port)
        self._servers: dict[tuple[str, int], tuple[asyncio.AbstractServer, tuple]] = {}
        self._connections: set[asyncio.Task] = set()  # open connections' handlers: stop() ends them
        self._stopped = False
        self._rr = itertools.count()
        self._thread = threading.Thread(target=self.loop.run_forever, name="service-proxy", daemon=True)
        self.pod_index, self.policy_index = LabelIndex(), SelectorIndex()
        self._claims: dict[tuple[str, int], dict[tuple, None]] = {}  # (ip, port) -> owners claiming it
        self._claimed: dict[tuple[str, str, str], dict[tuple[str, int], tuple]] = {}  # object -> its claims
        self._dirty: set[tuple[str, str, str]] = set()  # ("pod" | "service" | "policy", ns, name)
        self._recheck: set[tuple[str, int]] = set()
        self.claims_derived = 0  # objects whose claims were re-derived: what the tests bound
        for which, informer in (("service", services), ("pod", pods), ("policy", policies)):
            informer.listeners.append(
                lambda _kind, obj, w=which: self.loop.call_soon_threadsafe(self._mark, w, key_of(obj))
            )
        self._sync_pending = False
        self._failed: set[tuple[str, int]] = set()
        self._peers = peers.PeerFinder()

    def start(self) -> ServiceProxy:
        self._thread.start()
        for which, informer in (("pod", self.pods), ("service", self.services), ("policy", self.policies)):
            for obj in informer.items():
                self.loop.call_soon_threadsafe(self._mark, which, key_of(obj))
        self.loop.call_soon_threadsafe(self._resync)
        return self

    def _resync(self) -> None:
        # Retries listeners that could not bind (an address still held by a process of another local cluster).
        if self._failed:
            self._recheck |= self._failed
            self._schedule_sync()
        self.loop.call_later(RESYNC_SECONDS, self._resync)

    def stop(self) -> None:
        async def close():
            for server, _ in self._servers.values():
                server.close()
            self._servers.clear()
            # a server's close leaves its open connections' handlers pending: end them while the loop runs, so
            # none is left to close its sockets from the garbage collector after the loop closed
            for task in self._connections:
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)

        if self._stopped:  # once: a second call could reach the loop after its stop and wait for nothing
            return
        self._stopped = True
        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(close(), self.loop).result(5)
            self.loop.call_soon_threadsafe(self.loop.stop)

    def _mark(self, which: str, key: tuple[str, str]) -> None:
        self._dirty.add((which, *key))
        self._schedule_sync()

    def _schedule_sync(self) -> None:
        if not self._sync_pending:
            self._sync_pending = True
            self.loop.create_task(self._sync())

    def _pod_claims(self, pod: Obj | None) -> dict[tuple[str, int], tuple]:
        ip = ((pod or {}).get("status") or {}).get("podIP") or ""
        if pod is None or is_terminal(pod) or own_ip(pod, ip) == ip:
            return {}
        m, out = meta(pod), {}
        for port in published_ports(pod):
            owner = ("pod", m.get("namespace", "default"), m["name"], port)
            # Only once ready: a container that listens on 0.0.0.0 (against the local cluster's rule) has
            # bound the port by then and keeps it, instead of losing the race to this proxy.
            if pod_ready(pod) or self._servers.get((ip, port), (None, None))[1] == owner:
                out[(ip, port)] = owner
        return out

    @staticmethod
    def _service_claims(svc: Obj | None) -> dict[tuple[str, int], tuple]:
        spec = (svc or {}).get("spec") or {}
        ip = spec.get("clusterIP")
        if svc is None or not ip or ip == "None":
            return {}
        m = meta(svc)
        return {
            (ip, int(p["port"])): ("service", m.get("namespace", "default"), m["name"], p.get("name") or "")
            for p in spec.get("ports") or []
            if p.get("protocol", "TCP") == "TCP"
        }

    def _rederive(self, which: str, ns: str, name: str) -> set[tuple[str, int]]:
        """Brings the indexes and claims of one object up to date with the cache; returns the keys it touched."""
        self.claims_derived += 1
        if which == "policy":
            policy = self.policies.get(ns, name)
            selector = ((policy or {}).get("spec") or {}).get("podSelector") or {}
            self.policy_index.put((ns, name), policy, selector.get("matchLabels"))
            return set()
        if which == "pod":
            obj = self.pods.get(ns, name)
            self.pod_index.put((ns, name), obj)
            claims = self._pod_claims(obj)
        else:
            claims = self._service_claims(self.services.get(ns, name))
        old = self._claimed.pop((which, ns, name), {})
        for key, owner in old.items():
            owners = self._claims.get(key, {})
            owners.pop(owner, None)
            if not owners:
                self._claims.pop(key, None)
        for key, owner in claims.items():
            self._claims.setdefault(key, {})[owner] = None
        if claims:
            self._claimed[(which, ns, name)] = claims
        return set(old) | set(claims)

    def _owner(self, key: tuple[str, int]) -> tuple | None:
        """Who gets (ip, port): a Service before a pod (a Service's address is never a pod's), else the newest."""
        owners = list(self._claims.get(key) or ())
        services = [o for o in owners if o[0] == "service"]
        return (services or owners or [None])[-1]

    async def _sync(self) -> None:
        try:
            while self._dirty or self._recheck:
                dirty, self._dirty = self._dirty, set()
                touched, self._recheck = self._recheck, set()
                for which, ns, name in sorted(dirty):  # "pod" before "service"
                    touched |= self._rederive(which, ns, name)
                for key in sorted(touched):
                    await self._apply(key, self._owner(key))
        finally:
            self._sync_pending = False

    async def _apply(self, key: tuple[str, int], owner: tuple | None) -> None:
        current = self._servers.get(key)
        if current is not None and current[1] != owner:
            self._servers.pop(key)[0].close()
        if owner is None:
            self._failed.discard(key)
            return
        if key in self._servers:
            return
        ip, port = key
        try:
            server = await asyncio.start_server(
                lambda r, w, o=owner: self._handle(r, w, o), host=ip, port=port, reuse_address=True
            )
        except OSError as e:
            if key not in self._failed:
                log.warning("%s %s/%s: cannot listen on %s:%d: %s (retrying)", *owner[:3], ip, port, e)
            self._failed.add(key)
            return
        self._failed.discard(key)
        if self._owner(key) != owner:  # the claims changed while this listener was being opened
            server.close()
            self._recheck.add(key)
            return
        self._servers[key] = (server, owner)

    def listening(self) -> list[tuple[str, int]]:
        return sorted(self._servers)

    def _target(self, owner: tuple) -> tuple[Obj, str, int] | None:
        """The pod a connection to this listener goes to, with its pod IP and port; None: nowhere (refused)."""
        kind, ns, name, port_key = owner
        if kind == "pod":
            pod = self.pods.get(ns, name)
            ip = ((pod or {}).get("status") or {}).get("podIP")
            return (pod, ip, port_key) if pod and ip and not is_terminal(pod) else None
        svc = self.services.get(ns, name)
        ports = ((svc or {}).get("spec") or {}).get("ports") or []
        port = next((p for p in ports if (p.get("name") or "") == port_key), None)
        selected = self.pod_index.select(ns, (svc.get("spec") or {}).get("selector") or {}) if svc else []
        eps = endpoint_pods(svc, port, selected) if svc and port else []
        return eps[next(self._rr) % len(eps)] if eps else None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, owner: tuple) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        try:
            await self._serve(reader, writer, owner)
        finally:
            self._connections.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, owner: tuple) -> None:
        target = self._target(owner)
        upstream = None
        if target is not None:
            pod, ip, tport = target
            if not await self._admitted(writer, pod, tport, owner):
                writer.close()
                return
            ip = own_ip(pod, ip)  # where the pod's processes listen
            try:
                upstream = await asyncio.wait_for(asyncio.open_connection(ip, tport), 5)
            except (OSError, asyncio.TimeoutError) as e:
                log.info("%s %s/%s: endpoint %s:%d refused: %s", *owner[:3], ip, tport, e)
        if upstream is None:  # no ready endpoint: refuse, as a cluster would
            writer.close()
            return
        up_reader, up_writer = upstream
        writers = (writer, up_writer)
        try:
            await asyncio.gather(_pipe(reader, up_writer, writers), _pipe(up_reader, writer, writers))
        finally:
            for w in writers:
                w.close()

    async def _admitted(self, writer: asyncio.StreamWriter, target: Obj, port: int, owner) -> bool:
        """Whether the NetworkPolicies of target's namespace admit this connection (netpolicy.py)."""
        ns = meta(target).get("namespace", "default")
        policies = self.policy_index.candidates(ns, meta(target).get("labels") or {})
        if not netpolicy.isolating(target, policies):
            return True  # the common case costs no look-up in /proc
        peer, sockname = writer.get_extra_info("peername"), writer.get_extra_info("sockname")
        marker = await self.loop.run_in_executor(None, self._peers.marker, peer[:2], sockname[:2])
        source = self._source_pod(marker) if marker else None
        namespace_labels = {meta(n)["name"]: meta(n).get("labels") or {} for n in self.namespaces.items()}
        verdict = netpolicy.ingress_verdict(target, port, source, policies, namespace_labels)
        if not verdict.allowed:
            who = f"pod {meta(source).get('namespace')}/{meta(source).get('name')}" if source else "the node"
            log.info(
                "%s %s/%s: refused a connection from %s to pod %s/%s port %d: %s",
                *owner[:3],
                who,
                ns,
                meta(target).get("name"),
                port,
                verdict.reason,
            )
        return verdict.allowed

    def _source_pod(self, marker: str) -> Obj:
        """The pod a container marker names; a process of a pod the API server no longer has is a pod without
        labels or namespace (only a rule open to every source admits it)."""
        uid = peers.pod_uid(marker)
        pod = self.pod_index.by_uid(uid)
        if pod is not None:
            return pod
        return {"metadata": {"name": f"(uid {uid})", "namespace": "", "uid": uid, "labels": {}}}


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, both) -> None:
    """Copies one direction; EOF is passed on as a half-close, an error closes both sides."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        for w in both:
            w.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ftjob_local.netproxy", description=__doc__)
    p.add_argument("--kubeconfig", required=True, help="kubeconfig of the API server")
    p.add_argument("--state-dir", required=True, type=Path, help="cluster state folder")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    kube = Kube(args.kubeconfig)
    services = Informer(kube, "/api/v1/services", "services").start()
    pods = Informer(kube, "/api/v1/pods", "pods").start()
    policies = Informer(kube, "/apis/networking.k8s.io/v1/networkpolicies", "networkpolicies").start()
    namespaces = Informer(kube, "/api/v1/namespaces", "namespaces").start()
    for inf in (services, pods, policies, namespaces):
        if not inf.synced.wait(30):
            raise SystemExit(f"could not list {inf.name} from the API server within 30s")
    proxy = ServiceProxy(services, pods, policies, namespaces).start()
    ready = args.state_dir / "proxy" / "ready"
    ready.parent.mkdir(parents=True, exist_ok=True)
    ready.write_text(json.dumps({"pid": os.getpid()}))
    try:
        stop.wait()
    finally:
        ready.unlink(missing_ok=True)
        proxy.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
