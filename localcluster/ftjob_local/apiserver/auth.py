"""Authentication and RBAC authorization.

Who is asking:
- no credentials: the local administrator (the kubeconfig `ftjob local up` writes), allowed everything;
- `Authorization: Bearer <token>`: a ServiceAccount token, issued by this server (a Secret of type
  `kubernetes.io/service-account-token` gets `data.token` filled in, and `POST serviceaccounts/<sa>/token`, i.e.
  `kubectl create token <sa>`, returns one). Tokens are HMAC-signed with a key in the state dir;
- `Impersonate-User` / `Impersonate-Group` headers from the administrator (`kubectl --as=system:serviceaccount:NS:SA`).

Every request by a ServiceAccount or an impersonated user is authorized with Kubernetes RBAC over the stored Roles,
ClusterRoles, RoleBindings and ClusterRoleBindings, so an operator's chart RBAC can be tested for real.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError, forbidden
from .resources import SA_KEY

RBAC = "rbac.authorization.k8s.io"


@dataclass
class User:
    name: str
    groups: list[str] = field(default_factory=list)

    @classmethod
    def service_account(cls, ns: str, sa: str) -> User:
        return cls(
            f"system:serviceaccount:{ns}:{sa}",
            ["system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"],
        )

    @classmethod
    def named(cls, name: str, groups: list[str]) -> User:
        if name.startswith("system:serviceaccount:") and name.count(":") == 3:
            _, _, ns, sa = name.split(":")
            base = cls.service_account(ns, sa)
            return cls(base.name, base.groups + [g for g in groups if g not in base.groups])
        return cls(name, list(groups) + ["system:authenticated"])


class Tokens:
    """ServiceAccount tokens: `ftjob.<payload>.<hmac>`; the signing key lives in DIR/auth.key."""

    def __init__(self, state_dir: str):
        path = os.path.join(state_dir, "auth.key")
        if not os.path.exists(path):
            fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(32))
            os.replace(path + ".tmp", path)
        with open(path, "rb") as f:
            self.key = f.read()

    def _sign(self, payload: str) -> str:
        return (
            base64.urlsafe_b64encode(hmac.new(self.key, payload.encode(), hashlib.sha256).digest())
            .decode()
            .rstrip("=")
        )

    def issue(self, ns: str, sa: str, uid: str, expires_in: int | None = None) -> str:
        claims = {"ns": ns, "sa": sa, "uid": uid, "n": secrets.token_hex(4)}
        if expires_in:
            claims["exp"] = int(time.time()) + int(expires_in)
        payload = (
            base64.urlsafe_b64encode(json.dumps(claims, separators=(",", ":")).encode()).decode().rstrip("=")
        )
        return f"ftjob.{payload}.{self._sign(payload)}"

    def verify(self, token: str) -> dict[str, Any] | None:
        parts = token.split(".")
        if len(parts) != 3 or parts[0] != "ftjob" or not hmac.compare_digest(parts[2], self._sign(parts[1])):
            return None
        try:
            claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        except ValueError:
            return None
        if claims.get("exp") and claims["exp"] < time.time():
            return None
        return claims


def unauthorized() -> ApiError:
    return ApiError(
        401,
        "Unauthorized",
        "Unauthorized: the bearer token is invalid, expired, or its ServiceAccount no longer exists",
    )


def authenticate(headers: Any, tokens: Tokens, store: Any) -> User | None:
    """Who asks (see the module docstring): None is the local administrator, who sent no credentials."""
    header = headers.get("Authorization", "")
    if header.lower().startswith("bearer "):
        claims = tokens.verify(header[7:].strip())
        if claims is None:
            raise unauthorized()
        sa = store.get(SA_KEY, claims["ns"], claims["sa"])
        if sa is None or sa["metadata"]["uid"] != claims.get("uid"):
            raise unauthorized()
        if headers.get("Impersonate-User"):
            raise forbidden(
                f'users "{headers["Impersonate-User"]}" is forbidden: ServiceAccounts '
                "may not impersonate on the local API server"
            )
        return User.service_account(claims["ns"], claims["sa"])
    if headers.get("Impersonate-User"):
        return User.named(headers["Impersonate-User"], headers.getall("Impersonate-Group", []))
    return None


# What Kubernetes' bootstrap policy (system:basic-user) grants every authenticated user.
DEFAULT_RULES = [
    {
        "apiGroups": ["authorization.k8s.io"],
        "verbs": ["create"],
        "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
    },
    {"apiGroups": ["authentication.k8s.io"], "verbs": ["create"], "resources": ["selfsubjectreviews"]},
]


def _matches(values: list[str], value: str) -> bool:
    return "*" in values or value in values


def _rule_allows(rule: dict[str, Any], verb: str, group: str, resource: str, name: str | None) -> bool:
    if not _matches(rule.get("verbs") or [], verb):
        return False
    if not _matches(rule.get("apiGroups") or [], group):
        return False
    resources = rule.get("resources") or []
    base, _, sub = resource.partition("/")
    if not (
        "*" in resources
        or resource in resources
        or (sub and f"*/{sub}" in resources)
        or (not sub and base in resources)
    ):
        return False
    names = rule.get("resourceNames") or []
    return not names or (name is not None and name in names)


def _subject_matches(subject: dict[str, Any], user: User, binding_ns: str) -> bool:
    kind = subject.get("kind")
    if kind == "ServiceAccount":
        ns = subject.get("namespace") or binding_ns
        return user.name == f"system:serviceaccount:{ns}:{subject.get('name')}"
    if kind == "User":
        return user.name == subject.get("name")
    if kind == "Group":
        return subject.get("name") in user.groups
    return False


def rbac_allows(
    store: Any, user: User, verb: str, group: str, resource: str, ns: str, name: str | None
) -> bool:
    """Kubernetes RBAC: allowed when any binding that names the user grants a matching rule."""
    if "system:masters" in user.groups:
        return True
    if any(_rule_allows(rule, verb, group, resource, name) for rule in DEFAULT_RULES):
        return True

    def rules_of(ref: dict[str, Any], binding_ns: str) -> list[dict[str, Any]]:
        if ref.get("kind") == "ClusterRole":
            role = store.get((RBAC, "clusterroles"), "", ref.get("name", ""))
        else:
            role = store.get((RBAC, "roles"), binding_ns, ref.get("name", ""))
        return (role or {}).get("rules") or []

    bindings = [(b, "") for b in store.list((RBAC, "clusterrolebindings"))]
    if ns:
        bindings += [(b, ns) for b in store.list((RBAC, "rolebindings"), ns)]
    for binding, binding_ns in bindings:
        if not any(_subject_matches(s, user, binding_ns) for s in binding.get("subjects") or []):
            continue
        for rule in rules_of(binding.get("roleRef") or {}, binding_ns):
            if _rule_allows(rule, verb, group, resource, name):
                return True
    return False


def forbidden_message(user: User, verb: str, group: str, resource: str, ns: str, name: str | None) -> str:
    base, _, sub = resource.partition("/")
    what = f'{base} "{name}"' if name else base
    scope = f'in the namespace "{ns}"' if ns else "at the cluster scope"
    sub_text = f' subresource "{sub}"' if sub else ""
    return (
        f'{what} is forbidden: User "{user.name}" cannot {verb} resource "{base}"{sub_text} in API group '
        f'"{group}" {scope}'
    )


def access_review(store: Any, plural: str, kind: str, user: User | None, body: Any) -> dict[str, Any]:
    """A SelfSubjectAccessReview or SubjectAccessReview answered (never stored)."""
    spec = (body or {}).get("spec") or {}
    if plural == "subjectaccessreviews":
        user = User.named(spec.get("user", ""), spec.get("groups") or [])
    attrs = spec.get("resourceAttributes") or {}
    if attrs:
        resource = attrs.get("resource", "") + (
            f"/{attrs['subresource']}" if attrs.get("subresource") else ""
        )
        allowed = user is None or rbac_allows(
            store,
            user,
            attrs.get("verb", ""),
            attrs.get("group", ""),
            resource,
            attrs.get("namespace", ""),
            attrs.get("name") or None,
        )
    else:  # non-resource URLs (discovery, /version, /healthz) are open to every authenticated user
        allowed = True
    out = dict(body or {})
    out.update(apiVersion="authorization.k8s.io/v1", kind=kind)
    out["status"] = {"allowed": allowed, **({"reason": "RBAC: allowed"} if allowed else {})}
    return out
