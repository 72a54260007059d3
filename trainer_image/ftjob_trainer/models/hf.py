"""`--model hf:PATH`: a Hugging Face `transformers` causal LM as a trainer model.

PATH is a model directory (config.json, optionally *.safetensors weights and tokenizer files) or a config.json.
The wrapper gives the trainer what a built-in model has: forward(tokens) -> logits, vocab_size, the decoder layers
FSDP2 shards one by one, and training FLOPs per token. Without weights the model is initialised from the config
by transformers' own init under the trainer's seed (build_model seeds every rank alike, so every rank builds the
same model); with weights, they are loaded. transformers is the optional extra `ftjob[hf]`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ftjob_trainer.config import ConfigError, hf_model_dir

log = logging.getLogger(__name__)
INSTALL_HINT = "pip install 'ftjob[hf]' (or: pip install transformers safetensors)"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def import_transformers():
    try:
        import transformers
    except ImportError as e:
        raise ConfigError(f"--model hf:... needs the transformers package ({e}): {INSTALL_HINT}") from e
    return transformers


def has_weights(model_dir: Path) -> bool:
    return any(model_dir.glob("*.safetensors"))


def build(path: str, device: torch.device) -> HFCausalLM:
    """The wrapped model on `device` (meta: no storage, a checkpoint will fill it). Weights from the directory's
    safetensors if it has them (not on meta), else transformers' init from the config under the current seed."""
    transformers = import_transformers()
    model_dir = hf_model_dir(path)
    config_file = Path(path) if Path(path).is_file() else model_dir / "config.json"
    config = transformers.AutoConfig.from_pretrained(str(config_file))
    if has_weights(model_dir) and device.type != "meta":
        # loaded on the CPU in fp32 (FSDP2 casts to bf16 for compute on CUDA), then moved
        hf_model = transformers.AutoModelForCausalLM.from_pretrained(
            str(model_dir), config=config, dtype=torch.float32, local_files_only=True
        ).to(device)
        log.info("hf model %s: weights loaded from %s", type(hf_model).__name__, model_dir)
    else:
        with device:
            hf_model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        log.info("hf model %s: initialised from %s", type(hf_model).__name__, config_file)
    hf_model.train()  # from_pretrained returns it in eval mode (dropout off)
    return HFCausalLM(hf_model, text_encoder(model_dir, transformers))


def text_encoder(model_dir: Path, transformers) -> Callable[[str], list[int]] | None:
    """The directory's tokenizer as text -> token ids, for --data FILE.txt; None when it has none."""
    if not any((model_dir / name).exists() for name in TOKENIZER_FILES):
        return None
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    return lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]


class HFCausalLM(nn.Module):
    """A transformers causal LM with the trainer's model interface. Its state-dict keys are the model's own
    under `hf.`."""

    def __init__(self, hf_model: nn.Module, encode_text: Callable[[str], list[int]] | None = None):
        super().__init__()
        self.hf = hf_model
        self.encode_text = encode_text
        output = hf_model.get_output_embeddings()
        self.vocab_size = (
            int(output.weight.shape[0]) if output is not None else int(hf_model.config.vocab_size)
        )
        cfg = hf_model.config
        # dropout draws random numbers in forward: activation checkpointing must replay the same ones
        self.stochastic_forward = any(
            isinstance(v, float) and v > 0 and (k.endswith("dropout") or k.endswith("pdrop"))
            for k, v in cfg.to_dict().items()
        ) or any(isinstance(m, nn.Dropout) and m.p > 0 for m in hf_model.modules())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out = self.hf(input_ids=tokens, use_cache=False)
        return out.logits if hasattr(out, "logits") else out[0]

    def shard_units(self) -> list[nn.Module]:
        """The decoder layers: the model's own `_no_split_modules` classes (what accelerate's FSDP wrapping uses),
        else the ModuleList of num_hidden_layers entries."""
        names = set(getattr(self.hf, "_no_split_modules", None) or ())
        units: list[nn.Module] = []
        inside: set[int] = set()
        for module in self.hf.modules():
            if id(module) in inside:
                continue
            if type(module).__name__ in names:
                units.append(module)
                inside.update(id(m) for m in module.modules())
        if units:
            return units
        n = getattr(self.hf.config, "num_hidden_layers", None)
        for module in self.hf.modules():
            if isinstance(module, nn.ModuleList) and len(module) == n:
                return list(module)
        log.warning("no decoder layers found in %s: FSDP2 shards the whole model as one unit", type(self.hf))
        return []

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, as for the built-in models (PaLM appendix B): 6 x the parameters that
        multiply (embedding lookups excluded; a tied output layer counted once as a matmul) + attention scores."""
        cfg = self.hf.config
        total = sum(p.numel() for p in self.parameters())
        lookups = sum(m.weight.numel() for m in self.hf.modules() if isinstance(m, nn.Embedding))
        output = self.hf.get_output_embeddings()
        tied = output is not None and any(
            output.weight is m.weight for m in self.hf.modules() if isinstance(m, nn.Embedding)
        )
        matmul = total - lookups + (output.weight.numel() if tied else 0)
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        return 6 * matmul + 12 * cfg.num_hidden_layers * heads * head_dim * seq_len
