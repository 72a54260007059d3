"""The Pod Security Standards "restricted" profile (Kubernetes v1.32 rules), as a check over a pod spec.

Written from the rules the profile lists (baseline + restricted), so the chart's operator pod, and any other pod
spec, can be checked without a cluster. Returns one readable violation per broken rule; [] means the spec passes.
"""

from __future__ import annotations

from typing import Any

ALLOWED_VOLUME_TYPES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
ALLOWED_SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
ALLOWED_SECCOMP = frozenset({"RuntimeDefault", "Localhost"})
ALLOWED_APPARMOR = frozenset({"RuntimeDefault", "Localhost"})
VOLUME_SOURCE_KEYS_IGNORED = frozenset({"name"})


def _containers(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(field) or []:
            out.append((f"{field}[{c.get('name', '?')}]", c))
    return out


def _check_selinux(where: str, opts: dict[str, Any] | None, out: list[str]) -> None:
    if not opts:
        return
    if opts.get("type", "") not in ALLOWED_SELINUX_TYPES:
        out.append(f"{where}.seLinuxOptions.type {opts['type']!r} is not allowed")
    for key in ("user", "role"):
        if opts.get(key):
            out.append(f"{where}.seLinuxOptions.{key} must not be set")


def _check_apparmor(where: str, profile: dict[str, Any] | None, out: list[str]) -> None:
    if profile and profile.get("type") not in ALLOWED_APPARMOR:
        out.append(
            f"{where}.appArmorProfile.type must be RuntimeDefault or Localhost, not {profile.get('type')!r}"
        )


def restricted_violations(pod_spec: dict[str, Any]) -> list[str]:
    """Every rule of the restricted profile the pod spec breaks."""
    out: list[str] = []
    psc = pod_spec.get("securityContext") or {}

    # Baseline: host namespaces, host paths, host ports, privileged, capabilities, /proc, sysctls, SELinux, AppArmor.
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(key):
            out.append(f"spec.{key} must be false")
    if (psc.get("windowsOptions") or {}).get("hostProcess"):
        out.append("spec.securityContext.windowsOptions.hostProcess must not be true")
    for vol in pod_spec.get("volumes") or []:
        kinds = set(vol) - VOLUME_SOURCE_KEYS_IGNORED
        bad = kinds - ALLOWED_VOLUME_TYPES
        if bad:
            out.append(
                f"volume {vol.get('name')!r} uses {sorted(bad)}; restricted allows only {sorted(ALLOWED_VOLUME_TYPES)}"
            )
    for sysctl in psc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            out.append(f"sysctl {sysctl.get('name')!r} is not in the safe set")
    _check_selinux("spec.securityContext", psc.get("seLinuxOptions"), out)
    _check_apparmor("spec.securityContext", psc.get("appArmorProfile"), out)

    pod_non_root = psc.get("runAsNonRoot") is True
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    if pod_seccomp is not None and pod_seccomp not in ALLOWED_SECCOMP:
        out.append(
            f"spec.securityContext.seccompProfile.type must be RuntimeDefault or Localhost, not {pod_seccomp!r}"
        )
    if psc.get("runAsUser") == 0:
        out.append("spec.securityContext.runAsUser must not be 0")

    containers = _containers(pod_spec)
    if not containers:
        out.append("the pod has no containers")
    for where, c in containers:
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"{where}.securityContext.privileged must be false")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            out.append(f"{where}.securityContext.windowsOptions.hostProcess must not be true")
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                out.append(
                    f"{where} port {port.get('name', port.get('containerPort'))} must not set hostPort"
                )
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{where}.securityContext.procMount must be Default")
        _check_selinux(f"{where}.securityContext", sc.get("seLinuxOptions"), out)
        _check_apparmor(f"{where}.securityContext", sc.get("appArmorProfile"), out)

        caps = sc.get("capabilities") or {}
        added = set(caps.get("add") or []) - {"NET_BIND_SERVICE"}
        if added:
            out.append(f"{where} adds capabilities {sorted(added)}; restricted allows only NET_BIND_SERVICE")
        # Restricted from here on.
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{where}.securityContext.capabilities.drop must include ALL")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{where}.securityContext.allowPrivilegeEscalation must be false")
        non_root = sc.get("runAsNonRoot")
        if non_root is False or (non_root is None and not pod_non_root):
            out.append(f"{where}: runAsNonRoot must be true (on the pod or the container)")
        if sc.get("runAsUser") == 0:
            out.append(f"{where}.securityContext.runAsUser must not be 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type")
        if seccomp is not None and seccomp not in ALLOWED_SECCOMP:
            out.append(
                f"{where}.securityContext.seccompProfile.type must be RuntimeDefault or Localhost, not {seccomp!r}"
            )
        if seccomp is None and pod_seccomp is None:
            out.append(
                f"{where}: seccompProfile must be RuntimeDefault or Localhost (on the pod or the container)"
            )
    return out
