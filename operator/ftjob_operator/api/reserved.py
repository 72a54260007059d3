"""What ftjob sets in every pod it renders, so a spec may not set it: env names, volumes, mount paths, trainer flags.

render.py renders with these names; checks.py refuses a spec that takes one of them.
"""

from __future__ import annotations

from ftjob_trainer import contract

CHECKPOINT_VOLUME = "ftjob-checkpoints"
SHM_VOLUME = "ftjob-dshm"
SHM_PATH = "/dev/shm"
RESERVED_VOLUMES = frozenset({CHECKPOINT_VOLUME, SHM_VOLUME})

ENV_COORDINATOR_ADDR = "FTJOB_COORDINATOR_ADDR"
ENV_DISABLE_SHARED_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
ENV_MEMORY_CHECKPOINT_DIR = "FTJOB_MEMORY_CHECKPOINT_DIR"  # the trainer's --memory-checkpoint-dir
# Env names the operator sets on workers: the pod template may not override them.
RESERVED_ENV = frozenset(
    {
        "POD_IP",
        "POD_NAME",
        "NODE_NAME",
        ENV_COORDINATOR_ADDR,
        contract.ENV_COORDINATOR_URL,
        contract.ENV_TOKEN,
        contract.ENV_JOB_NAME,
        contract.ENV_NAMESPACE,
        "FTJOB_CHECKPOINT_DIR",
        "FTJOB_CHECKPOINT_EVERY",
        "FTJOB_KEEP_LAST",
        ENV_MEMORY_CHECKPOINT_DIR,
        contract.ENV_SAVE_DEADLINE,
        ENV_DISABLE_SHARED_STORE,
    }
)

# Trainer flags the operator derives from spec.checkpoint and spec.preemption.
RESERVED_TRAINER_FLAGS = frozenset(
    {
        "checkpoint-dir",
        "checkpoint-every",
        "keep-last",
        "save-deadline-seconds",
        "coordinator-url",
        "memory-checkpoint-dir",
    }
)
