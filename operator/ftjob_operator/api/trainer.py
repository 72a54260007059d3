"""`spec.trainer`: the built-in trainer's settings (model, steps, batch, data, extra flags)."""

from __future__ import annotations

from pydantic import Field

from .base import MAX_SAFE_INT, MAX_STEPS, Model, cel_list, cel_rules
from .reserved import RESERVED_TRAINER_FLAGS

# The trainer's built-in presets (ftjob_trainer.models.PRESETS; a test keeps the two equal) and `hf:<repo or path>`.
MODEL_PRESETS = ("tiny", "125m", "1b")
MODEL_PATTERN = rf"^({'|'.join(MODEL_PRESETS)}|hf:[^\s].*)$"


class TrainerSpec(Model):
    """Settings of the built-in trainer (ftjob_trainer.train), passed as FTJOB_* environment."""

    model: str = Field(
        "tiny",
        max_length=4096,
        pattern=MODEL_PATTERN,
        description="model is the built-in preset ("
        + ", ".join(MODEL_PRESETS)
        + ") or hf:PATH, a transformers "
        "causal LM's directory or config.json inside the pod (mount it with podTemplate.volumes; the image needs "
        "ftjob[hf]).",
    )
    steps: int = Field(
        100,
        ge=1,
        le=MAX_STEPS,
        description="steps is the optimizer steps of the whole job (resumes continue to it).",
    )
    global_batch_size: int = Field(
        8, ge=1, le=1 << 24, description="globalBatchSize is samples per optimizer step over all ranks."
    )
    seq_len: int = Field(128, ge=2, le=1 << 24, description="seqLen is tokens per sample.")
    learning_rate: float | None = Field(
        None, gt=0, le=10, description="learningRate is the peak AdamW learning rate."
    )
    seed: int | None = Field(
        None, ge=0, le=MAX_SAFE_INT, description="seed seeds model init and the synthetic data."
    )
    data: str | None = Field(
        None, description="data is 'synthetic' or a path (inside the pod) to a .txt or .bin token file."
    )
    flags: dict[str, str] | None = Field(
        None,
        description='flags sets more trainer flags by name, e.g. {"warmup-steps": "5"} (passed as '
        "FTJOB_WARMUP_STEPS).",
        json_schema_extra={
            "maxProperties": 64,
            **cel_rules(
                (
                    "self.all(k, k.matches('^[a-z][a-z0-9-]*$'))",
                    "spec.trainer.flags keys must look like a flag name without dashes, e.g. warmup-steps",
                ),
                (
                    f"self.all(k, !(k in {cel_list(RESERVED_TRAINER_FLAGS)}))",
                    "spec.trainer.flags must not set flags derived from spec.checkpoint/preemption: "
                    + ", ".join(sorted(RESERVED_TRAINER_FLAGS)),
                ),
            ),
        },
    )
