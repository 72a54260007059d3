"""Which container opened a local TCP connection, read from /proc without root (stdlib only).

The service proxy uses it to know the pod behind a connection it accepted, so it can apply NetworkPolicies
(netpolicy.py). Every process of the local cluster runs as the same user on the same loopback interface, so the
source address says nothing (a client's connection to a Service's 127.96.x.y comes from 127.0.0.1). Instead:
1. the client's end is the socket whose local address is the accepted connection's peer and whose remote address
   is the proxy's listening address: the kernel's sock_diag netlink answers with its inode for exactly that pair
   (reading /proc/net/tcp, the fallback, formats every socket of the machine: milliseconds on a busy one);
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
_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, _NLMSG_ERROR = 4, 20, 1, 2
_NO_COOKIE = 0xFFFFFFFF
_INODE_OFFSET = 16 + 4 + 48 + 16  # nlmsghdr, inet_diag_msg's family..retrans, its sockid, expires..uid


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


def netlink_inode(local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """The inode of the TCP socket with these ends, asked of the kernel (sock_diag, no root needed); None when there
    is none. OSError where netlink sock_diag is not available."""
    sockid = (
        struct.pack("!HH", local[1], remote[1])
        + socket.inet_aton(local[0])
        + bytes(12)
        + socket.inet_aton(remote[0])
        + bytes(12)
        + struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE)
    )
    request = struct.pack("=BBBBI", socket.AF_INET, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    header = struct.pack("=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(2)
        nl.sendto(header + request, (0, 0))
        reply = nl.recv(8192)
    (kind,) = struct.unpack_from("=H", reply, 4)
    if kind == _NLMSG_ERROR:
        (errno,) = struct.unpack_from("=i", reply, 16)
        if errno in (0, -2):  # ENOENT: no such socket (closed already)
            return None
        raise OSError(-errno, os.strerror(-errno))
    if kind != _SOCK_DIAG_BY_FAMILY or len(reply) < _INODE_OFFSET + 4:
        raise OSError(f"unexpected sock_diag reply (type {kind}, {len(reply)} bytes)")
    (inode,) = struct.unpack_from("=I", reply, _INODE_OFFSET)
    return inode or None


def _inode(local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    try:
        return netlink_inode(local, remote)
    except OSError:
        try:
            return socket_inode((PROC / "net" / "tcp").read_text(), local, remote)
        except OSError:
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
    is fixed at exec), so a look-up costs one sock_diag query and the fd links of container processes, the last
    one found first (a client opens many connections). A socket no remembered process holds (a container started
    since, or the node's) costs one fresh scan of every process."""

    def __init__(self) -> None:
        self._markers: dict[str, str | None] = {}  # pid -> its marker, None for a process of the node
        self._lock = threading.Lock()  # the proxy looks up from several threads
        self._last = ""  # the pid found last

    def marker(self, peer: tuple[str, int], sockname: tuple[str, int]) -> str | None:
        """The container marker of the process that holds the client end of the connection peer -> sockname (as the
        accepting side sees it), or None when no container process holds it (the node, or the socket closed)."""
        inode = _inode(peer, sockname)
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
        if self._last in self._markers:
            pids = [self._last, *pids]
        for pid in pids:
            if self._markers.get(pid) and _holds(pid, link):
                # read again: the pid may belong to another process than the one remembered
                self._markers[pid] = _marker(pid)
                if self._markers[pid]:
                    self._last = pid
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
