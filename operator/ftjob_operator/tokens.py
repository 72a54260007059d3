"""The job's control-API token, derived rather than read back: HMAC-SHA256(key, "<namespace>/<name>/<uid>").

The operator writes the token into the job's Secret `<job>-token` (create only: the coordinator and the workers get it
through a secretKeyRef, which the kubelet resolves) and computes it again whenever it calls the coordinator. So it
never reads a Secret, in any namespace: the chart grants `create` on secrets and no get, list or watch. The key is
the environment variable FTJOB_TOKEN_KEY (the chart fills it from its Secret `<release>-token-key` through a
secretKeyRef, so the operator does not read that one either; `ftjob local up` keeps one in its state folder).

Without a key (an operator run by hand with an administrator's kubeconfig) the operator falls back to a random token
per job that it reads back from the Secret (a watch-fed cache of the jobs' Secrets, informer.py), which needs
`list` and `watch` on secrets.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping

TOKEN_KEY_ENV = "FTJOB_TOKEN_KEY"
MIN_KEY_BYTES = 16


class TokenKeyError(ValueError):
    """The key in FTJOB_TOKEN_KEY is unusable; the message says what to set."""


def key_from_env(environ: Mapping[str, str] = os.environ) -> bytes | None:
    """The derivation key, or None when FTJOB_TOKEN_KEY is unset or empty."""
    value = environ.get(TOKEN_KEY_ENV, "").strip()
    if not value:
        return None
    if len(value.encode()) < MIN_KEY_BYTES:
        raise TokenKeyError(
            f"{TOKEN_KEY_ENV} is {len(value.encode())} bytes; use at least {MIN_KEY_BYTES} random bytes "
            "(the chart generates 48 characters)"
        )
    return value.encode()


def derive(key: bytes, namespace: str, name: str, uid: str) -> str:
    """The token of one job: 64 hex characters, a new one for a new job of the same name (the uid differs)."""
    if not uid:
        raise ValueError(f"job {namespace}/{name} has no uid: its token cannot be derived")
    return hmac.new(key, f"{namespace}/{name}/{uid}".encode(), hashlib.sha256).hexdigest()
