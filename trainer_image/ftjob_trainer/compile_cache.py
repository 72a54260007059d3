"""torch.compile's caches next to the checkpoints, so that a restarted or replaced worker does not compile from
scratch (the bench: +10.9 s for a new pod's --compile start on the H200 machine).

Inductor keeps its FX-graph, AOTAutograd and Triton kernel caches under TORCHINDUCTOR_CACHE_DIR (read when it first
compiles; default /tmp/torchinductor_<user>, which a new pod does not have). Entries are keyed by the graph, torch
version and device, and written atomically (tmp + rename), so every rank and every pod of a job can share one
folder on the checkpoint volume. A TORCHINDUCTOR_CACHE_DIR the user set wins. Torch-free.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

ENV_CACHE_DIR = "TORCHINDUCTOR_CACHE_DIR"
CACHE_DIR_NAME = "compile-cache"  # under --checkpoint-dir; checkpoint listing ignores it (not step-*)


def use_checkpoint_volume(checkpoint_dir: str | None) -> str | None:
    """Point inductor's caches at <checkpoint_dir>/compile-cache unless the user chose a folder. Call it before
    anything compiles. Returns the folder in use (None: inductor's default)."""
    if os.environ.get(ENV_CACHE_DIR):
        return os.environ[ENV_CACHE_DIR]
    if not checkpoint_dir or "://" in checkpoint_dir:  # an object store URL: inductor needs a folder
        return None
    path = os.path.join(checkpoint_dir, CACHE_DIR_NAME)
    try:
        os.makedirs(path, exist_ok=True)
    except (
        OSError
    ) as e:  # a read-only or missing volume must not stop training: compile without the shared cache
        log.warning("compile cache %s unusable (%s); inductor keeps its default folder", path, e)
        return None
    os.environ[ENV_CACHE_DIR] = path
    return path
