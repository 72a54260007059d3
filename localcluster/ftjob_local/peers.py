"""Which container opened a local TCP connection, read from /proc without root (stdlib only).

The service proxy uses it to know the pod behind a connection it accepted, so it can apply NetworkPolicies
(netpolicy.py). Every process of the local cluster runs as the same user on the same loopback interface, so the
source address says nothing (a client's connection to a Service's 127.96.x.y comes from 127.0.0.1). Instead:
1. /proc/net/tcp lists every IPv4 socket with its inode: the client's end is the socket whose local address is the
   accepted connection's peer and whose remote address is the proxy's listening address;
2. the process holding that inode has a link `socket:[inode]` in /proc/<pid>/fd; only processes carrying the
   kubelet's container marker (procs.MARKER_ENV, inherited by everything a container starts) are searched, so a
   connection no container process holds is the node's (kubelet probes, the operator run by hand, a shell);
3. the marker (`<pod uid>/<container>/<random>`) names the pod by uid.
Limits (docs/INTERFACES.md): the marker is an environment variable, so a process that starts a program with an
empty environment is seen as the node; IPv4 only (the local cluster's addresses all are).
"""

from __future__ import annotations

import os
import socket
import struct
import threading
from pathlib import Path

from .procs import MARKER_ENV

PROC = Path("/proc")
_ESTABLISHED = "01"


def _address(hex_addr: str) -> tuple[str, int]:
    """An IPv4 `ADDR:PORT` of /proc/net/tcp: the address is the network-order word printed as a native integer."""
    ip_hex, port_hex = hex_addr.split(":")
    return socket.inet_ntoa(struct.pack("=I", int(ip_hex, 16))), int(port_hex, 16)


def socket_inode(tcp_table: str, local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """The inode of the established socket with these ends, from the text of /proc/net/tcp."""
    for line in tcp_table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != _ESTABLISHED:
            continue
        try:
            if _address(fields[1]) == local and _address(fields[2]) == remote:
                return int(fields[9]) or None
        except ValueError:
            continue
    return None


def _marker(pid: str) -> str | None:
    try:
        environ = (PROC / pid / "environ").read_bytes()
    except OSError:
        return None
    prefix = MARKER_ENV.encode() + b"="
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode(errors="replace")
    return None


def _holds(pid: str, link: str) -> bool:
    try:
        with os.scandir(PROC / pid / "fd") as fds:
            for fd in fds:
                try:
                    if os.readlink(fd.path) == link:
                        return True
                except OSError:
                    continue
    except OSError:
        pass
    return False


class PeerFinder:
    """Finds the container marker behind a connection; remembers which processes carry one (a process's environment
    is fixed at exec), so a look-up reads only /proc/net/tcp and the fd links of container processes. A socket no
    remembered process holds (a container started since, or the node's) costs one fresh scan of every process."""

    def __init__(self) -> None:
        self._markers: dict[str, str | None] = {}  # pid -> its marker, None for a process of the node
        self._lock = threading.Lock()  # the proxy looks up from several threads

    def marker(self, peer: tuple[str, int], sockname: tuple[str, int]) -> str | None:
        """The container marker of the process that holds the client end of the connection peer -> sockname (as the
        accepting side sees it), or None when no container process holds it (the node, or the socket closed)."""
        try:
            table = (PROC / "net" / "tcp").read_text()
        except OSError:
            return None
        inode = socket_inode(table, peer, sockname)
        if inode is None:
            return None
        link = f"socket:[{inode}]"
        with self._lock:
            found = self._holder(self._refresh(), link)
            if (
                found is None
            ):  # missed: a pid reused since it was remembered; forget everything, look once more
                self._markers.clear()
                found = self._holder(self._refresh(), link)
            return found

    def _holder(self, pids: list[str], link: str) -> str | None:
        for pid in pids:
            if self._markers.get(pid) and _holds(pid, link):
                # read again: the pid may belong to another process than the one remembered
                self._markers[pid] = _marker(pid)
                if self._markers[pid]:
                    return self._markers[pid]
        return None

    def _refresh(self) -> list[str]:
        me = str(os.getpid())
        pids = [e.name for e in os.scandir(PROC) if e.name.isdigit() and e.name != me]
        for pid in pids:
            if pid not in self._markers:
                self._markers[pid] = _marker(pid)
        for gone in set(self._markers) - set(pids):
            del self._markers[gone]
        return pids


def container_marker(peer: tuple[str, int], sockname: tuple[str, int]) -> str | None:
    """PeerFinder.marker without a cache."""
    return PeerFinder().marker(peer, sockname)


def pod_uid(marker: str) -> str:
    """The pod uid a container marker names (`<pod uid>/<container>/<random>`)."""
    return marker.split("/", 1)[0]
