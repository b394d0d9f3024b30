"""Hugging Face model folders <-> minigpt checkpoint folders, for both families (interop/architecture.py).

    export_hf   checkpoint -> config.json, model.safetensors, generation_config.json, tokenizer.json (+ its
                config): `AutoModelForCausalLM` / `AutoTokenizer.from_pretrained(folder)` load it with no
                custom code, as GPT2LMHeadModel, LlamaForCausalLM or Qwen3ForCausalLM
    import_hf   such a folder (ours, or any GPT-2 / Llama / Qwen3 one) -> a checkpoint that generate.py and
                trainer.init_from read; it holds the weights, meta.json and a tokenizer, no optimizer state

Everything is converted and checked in memory first, so a refused model writes nothing; the folder is written
under a temporary name and renamed when complete (hf_files.staged_output).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from minigpt.checkpoint.format import save_checkpoint
from minigpt.checkpoint.load import read_checkpoint
from minigpt.data.config import TokenizerConfig
from minigpt.data.tokenizers import Tokenizer, build_tokenizer, load_tokenizer
from minigpt.errors import UserError
from minigpt.interop.architecture import GPT2, architecture_of
from minigpt.interop.hf_files import (
    CONFIG,
    GENERATION_CONFIG,
    WEIGHTS,
    read_hf_config,
    staged_output,
    write_json,
    write_weights,
)
from minigpt.interop.hf_gpt2 import hf_config_from_model, hf_state_dict, load_hf_gpt2
from minigpt.interop.hf_llama import hf_llama_config, hf_llama_state_dict, load_hf_llama
from minigpt.interop.hf_tokenizer import TOKENIZER_JSON, hf_tokenizer, save_hf_tokenizer, tokenizer_from_hf
from minigpt.model.gpt import GPT

LOADERS = {"gpt2": load_hf_gpt2, "llama": load_hf_llama, "qwen3": load_hf_llama}  # config.json's model_type


def hf_files(model: GPT, eot_id: int) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json dict, weights under HF names) for `model`; UserError naming the feature HF lacks."""
    if architecture_of(model.config) == GPT2:
        config, weights = hf_config_from_model(model.config, eot_id), hf_state_dict(model)
        if model.config.tie_weights:
            del weights["lm_head.weight"]  # safetensors refuses shared storage; HF re-ties it from wte
        return config, weights
    return hf_llama_config(model.config, eot_id), hf_llama_state_dict(model)


def export_hf(checkpoint: str | Path, out: str | Path) -> Path:
    """Write the checkpoint (or run folder) as a new HF folder `out`; returns it."""
    model, tokenizer, _ = read_checkpoint(checkpoint)
    config, weights = hf_files(model, tokenizer.eot_id)
    fast = hf_tokenizer(tokenizer)  # converted before anything is written
    eot = tokenizer.eot_id
    generation = {"bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot}  # a document ends at EOT
    with staged_output(Path(out), folder=True) as tmp:
        write_json(tmp / CONFIG, config)
        write_weights(tmp / WEIGHTS, weights)
        write_json(tmp / GENERATION_CONFIG, generation)
        save_hf_tokenizer(fast, tmp, model_max_length=model.config.block_size)
    return Path(out).expanduser()


def load_hf_model(folder: str | Path) -> GPT:
    """A minigpt GPT (float32, CPU, eval mode) with the weights of a GPT-2, Llama or Qwen3 HF folder."""
    folder = Path(folder).expanduser()
    model_type = read_hf_config(folder).get("model_type", "gpt2")
    if model_type not in LOADERS:
        raise UserError(f"{folder / CONFIG} has model_type={model_type!r}; minigpt reads "
                        f"{' and '.join(LOADERS)}")
    return LOADERS[model_type](folder)


def import_tokenizer(folder: Path, tokenizer_dir: str | Path | None, model_type: str) -> Tokenizer:
    """The tokenizer of an import: the folder given, else the HF folder's tokenizer.json, else (a GPT-2 folder
    without one, like the original `gpt2` upload) tiktoken's gpt2 encoding."""
    if tokenizer_dir is not None:
        return load_tokenizer(Path(tokenizer_dir).expanduser())
    if (folder / TOKENIZER_JSON).is_file() or model_type != "gpt2":
        return tokenizer_from_hf(folder)
    try:
        return build_tokenizer(TokenizerConfig(kind="gpt2"))
    except UserError as e:  # offline without tiktoken's cached file
        raise UserError(f"{e}; or pass a minigpt tokenizer folder (tokenizer_dir=DIR)") from None


def import_hf(source: str | Path, out: str | Path, tokenizer_dir: str | Path | None = None) -> Path:
    """HF folder -> a new minigpt checkpoint folder `out` (weights, meta.json, tokenizer/); returns it."""
    source, out = Path(source).expanduser(), Path(out).expanduser()
    if out.exists():
        raise UserError(f"{out} already exists; choose a new checkpoint folder (nothing was overwritten)")
    model = load_hf_model(source)
    tokenizer = import_tokenizer(source, tokenizer_dir, read_hf_config(source).get("model_type", "gpt2"))
    if tokenizer.vocab_size > model.config.vocab_size:
        raise UserError(
            f"tokenizer {tokenizer.name} has {tokenizer.vocab_size} tokens but the model only "
            f"{model.config.vocab_size}; pass the tokenizer the weights were trained with"
        )
    model_config = dataclasses.asdict(model.config)
    meta = {
        "model_config": model_config,
        "config": {"model": model_config, "tokenizer": {"kind": tokenizer.kind}},
        "step": 0, "tokens_seen": 0, "imported_from": str(source.resolve()),
    }
    return save_checkpoint(out, model, {"step": 0}, meta, tokenizer)
