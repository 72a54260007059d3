"""`--model hf:PATH`: transformers causal LMs (a Llama-family and a GPT-2-family config of a few million
parameters, written here: offline) train under the real torchrun with gloo, stop on SIGTERM, resume exactly; and
in a world of one: decoder layers as FSDP2 units, seeded init, safetensors weights, FLOPs, the seed's guard in
every offload mode, activation checkpointing with dropout, the tokenizer for --data."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
import transformers
from ftjob_trainer.checkpoint import Checkpointer, needs_manual_param_reload
from ftjob_trainer.config import ConfigError, ModelConfig, OptimizerConfig, ParallelConfig, parse_args
from ftjob_trainer.data import TokenFileSource
from ftjob_trainer.engine import Engine, build_model, on_meta_device, state_sha256
from ftjob_trainer.models.hf import HFCausalLM, text_encoder
from trainer_testlib import HF_CONFIGS, finish, log_of, read_json, report_step, wait_for, write_hf_config

CPU = torch.device("cpu")
FAMILIES = sorted(HF_CONFIGS)
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)


def hf_cfg(folder, **kw) -> ModelConfig:
    return ModelConfig(name=f"hf:{folder}", **kw)


def make_engine(cfg: ModelConfig, *, seed=0, on_meta=False, **flags) -> Engine:
    return Engine(
        build_model(cfg, CPU, seed=seed, on_meta=on_meta),
        device=CPU,
        model_cfg=cfg,
        opt_cfg=OptimizerConfig(),
        par_cfg=ParallelConfig(**flags),
        total_steps=10,
    )


def one_step(engine: Engine, seed: int = 1) -> float:
    tokens = torch.randint(0, engine.vocab_size, (2, 17), generator=torch.Generator().manual_seed(seed))
    return float(engine.train_step([(tokens[:, :-1], tokens[:, 1:])]))


# --- configuration -------------------------------------------------------------------------------------------------


def test_the_flag_takes_a_directory_or_a_config_json_and_says_what_is_wrong(tmp_path):
    folder = write_hf_config(tmp_path / "m", "llama")
    assert hf_cfg(folder).hf_path == str(folder)
    assert (
        parse_args(["--model", f"hf:{folder}/config.json"], env={}).model.hf_path == f"{folder}/config.json"
    )
    assert ModelConfig(name="tiny").hf_path is None
    for bad in (tmp_path / "missing", tmp_path):  # no such path; a folder without config.json
        with pytest.raises(ConfigError, match="config.json"):
            hf_cfg(bad)


# --- the model, in a world of one ----------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_decoder_layers_are_the_units_and_logits_flops_vocab_come_from_the_config(tmp_path, family):
    model = build_model(hf_cfg(write_hf_config(tmp_path / family, family)), CPU, seed=0)
    assert isinstance(model, HFCausalLM) and model.vocab_size == 4096
    units = model.shard_units()
    assert len(units) == 4 and len({type(u) for u in units}) == 1
    assert type(units[0]).__name__ in {"LlamaDecoderLayer", "GPT2Block"}
    logits = model(torch.zeros(2, 9, dtype=torch.long))
    assert isinstance(logits, torch.Tensor) and logits.shape == (2, 9, 4096)
    d, layers, vocab, seq = 128, 4, 4096, 64
    embeddings = vocab * d + (256 * d if family == "gpt2" else 0)  # GPT-2 adds learned positions
    output = vocab * d  # tied (GPT-2) or not (Llama), the output layer is one matmul per token
    total = sum(p.numel() for p in model.parameters())
    assert total > 1_000_000
    expected = 6 * (total - embeddings + (output if family == "gpt2" else 0)) + 12 * layers * d * seq
    assert model.flops_per_token(seq) == expected


@pytest.mark.parametrize("family", FAMILIES)
def test_init_is_seeded_identically_and_weights_in_the_folder_are_loaded(tmp_path, family):
    folder = write_hf_config(tmp_path / family, family)
    a, b, c = (build_model(hf_cfg(folder), CPU, seed=s) for s in (0, 0, 1))
    assert all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )
    assert not torch.equal(a.hf.get_input_embeddings().weight, c.hf.get_input_embeddings().weight)
    c.hf.save_pretrained(folder)  # the folder now holds safetensors weights: they win over the seed
    assert list(folder.glob("*.safetensors"))
    loaded = build_model(hf_cfg(folder), CPU, seed=0)
    assert loaded.training, "from_pretrained returns eval mode; the trainer trains"
    assert loaded.state_dict().keys() == c.state_dict().keys()
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in c.state_dict().items())


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "flags",
    [{}, {"cpu_offload": True}, {"param_offload": True}],
    ids=["plain", "cpu-offload", "param-offload"],
)
def test_save_and_load_in_every_offload_mode_keep_the_state(world_of_one, tmp_path, family, flags):
    """The seed's guard is the engine's, whatever the model: moves by hand only for param_offload."""
    cfg = hf_cfg(write_hf_config(tmp_path / family, family))
    engine = make_engine(cfg, **flags)
    assert needs_manual_param_reload(engine) is bool(flags.get("param_offload"))
    one_step(engine)
    saved = state_sha256(*engine.full_state())
    ckpt = tmp_path / "ckpt"
    Checkpointer(str(ckpt), keep_last=2, engine=engine, rank=0, world_size=1).save(
        1, {"scheduler": engine.scheduler.state_dict()}
    )
    fresh = make_engine(cfg, seed=7, on_meta=True, **flags)  # another init: the checkpoint must overwrite all
    loaded = Checkpointer(str(ckpt), keep_last=2, engine=fresh, rank=0, world_size=1).load_latest()
    assert loaded.step == 1 and state_sha256(*fresh.full_state()) == saved
    losses = []
    for e in (fresh, engine):
        torch.manual_seed(3)  # GPT-2's dropout draws from the process's one generator
        losses.append(one_step(e, 2))
    assert losses[0] == losses[1]


def test_llama_keeps_its_rotary_buffers_so_it_is_built_on_the_device_when_a_checkpoint_follows(tmp_path):
    """Llama's rotary tables are non-persistent buffers the wrapper cannot recompute: build_model falls back to
    the device; GPT-2 has none and is built on meta."""
    llama = build_model(hf_cfg(write_hf_config(tmp_path / "l", "llama")), CPU, seed=0, on_meta=True)
    gpt2 = build_model(hf_cfg(write_hf_config(tmp_path / "g", "gpt2")), CPU, seed=0, on_meta=True)
    assert not on_meta_device(llama) and on_meta_device(gpt2)


def test_activation_checkpointing_replays_dropout_exactly(world_of_one, tmp_path):
    """GPT-2's dropout draws random numbers in forward: the recompute must draw the same ones, or the gradients
    are of another forward. One step with and without checkpointing lands in the same state."""
    folder = write_hf_config(tmp_path / "g", "gpt2")
    states = []
    for ac in (False, True):
        engine = make_engine(hf_cfg(folder, activation_checkpointing=ac))
        assert engine.model.stochastic_forward
        torch.manual_seed(5)
        one_step(engine)
        states.append(state_sha256(*engine.full_state()))
    assert states[0] == states[1]


def test_a_tokenizer_in_the_folder_tokenizes_text_data(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder = write_hf_config(tmp_path / "l", "llama")
    words = {"[UNK]": 0, "the": 1, "cat": 2, "sat": 3}
    tok = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    assert text_encoder(tmp_path, transformers) is None  # no tokenizer files there
    encode = text_encoder(folder, transformers)
    text = tmp_path / "d.txt"
    text.write_text("the cat sat " * 4)
    source = TokenFileSource(str(text), seq_len=3, vocab_size=4096, encode_text=encode)
    assert source.tokens.tolist() == [1, 2, 3] * 4
    assert build_model(hf_cfg(folder), CPU, seed=0).encode_text("cat sat") == [2, 3]


# --- under torchrun: SIGTERM mid-run, resume, the same state as an uninterrupted run -------------------------------

STEPS = 10
HF_RUN = ["--seq-len", "32", "--global-batch-size", "4", "--log-every", "1", "--warmup-steps", "2"]


def run_to_end(procs, tmp, name, args):
    p = procs.torchrun([*args, "--report", str(tmp / f"{name}.json")], name=name, env=OFFLINE)
    assert finish(p, timeout=300) == 0, log_of(p)[-4000:]
    return read_json(tmp / f"{name}.json")


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_sigterm_then_resume_ends_in_the_state_of_an_uninterrupted_run(procs, tmp_path, family):
    model = ["--model", f"hf:{write_hf_config(tmp_path / family, family)}", *HF_RUN, "--steps", str(STEPS)]
    baseline = run_to_end(procs, tmp_path, "base", model)
    extra = [*model, "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "3"]
    report = tmp_path / "first.json"
    p = procs.torchrun(
        [*extra, "--report", str(report)],
        name="first",
        env={**OFFLINE, "FTJOB_TERMINATION_LOG": str(tmp_path / "first.term")},
    )
    wait_for(lambda: report_step(report) >= 5, timeout=300, proc=p, what="step 5")
    os.killpg(p.pid, signal.SIGTERM)  # what the kubelet does: the agent forwards it to its workers
    finish(p)
    first = read_json(report)
    assert first["exit_code"] == 75 and first["reason"] == "preempted", log_of(p)[-3000:]
    assert first["preemption_saves"] == 1 and 0 < first["step"] < STEPS
    second = run_to_end(procs, tmp_path, "second", extra)
    assert second["resumed_from_step"] == first["step"] and second["first_step"] == first["step"] + 1
    assert second["step"] == STEPS and second["world_size"] == 2
    assert second["state_sha256"] == baseline["state_sha256"]
    assert second["loss"] == baseline["loss"]
