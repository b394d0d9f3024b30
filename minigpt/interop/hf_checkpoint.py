"""Hugging Face GPT-2 folders as minigpt checkpoints, and back (the weight mapping is interop/hf_gpt2.py).

An imported checkpoint holds the weights, meta.json and a tokenizer, and no optimizer state.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from minigpt.checkpoint.format import save_checkpoint
from minigpt.checkpoint.load import read_checkpoint
from minigpt.data.config import TokenizerConfig
from minigpt.data.tokenizers import build_tokenizer, load_tokenizer
from minigpt.errors import UserError
from minigpt.interop.hf_gpt2 import export_hf_gpt2, load_hf_gpt2


def import_to_checkpoint(
    hf_folder: str | Path, out: str | Path, tokenizer_dir: str | Path | None = None
) -> Path:
    """HF GPT-2 folder -> a minigpt checkpoint folder (weights, meta.json, tokenizer/) that generate.py reads.

    The tokenizer is a minigpt tokenizer folder when given, else tiktoken's `gpt2` encoding (from its
    cache, or the network once). The checkpoint holds no optimizer state: it is for inference.
    """
    out = Path(out).expanduser()
    if out.exists():
        raise UserError(f"{out} already exists; choose a new checkpoint folder (nothing was overwritten)")
    model = load_hf_gpt2(hf_folder)
    if tokenizer_dir is not None:
        tokenizer = load_tokenizer(Path(tokenizer_dir))
    else:
        try:
            tokenizer = build_tokenizer(TokenizerConfig(kind="gpt2"))
        except UserError as e:  # offline without tiktoken's cached file
            raise UserError(f"{e}; or pass a minigpt tokenizer folder (--tokenizer DIR)") from None
    if tokenizer.vocab_size > model.config.vocab_size:
        raise UserError(
            f"tokenizer {tokenizer.name} has {tokenizer.vocab_size} tokens but the model only "
            f"{model.config.vocab_size}; pass the tokenizer the weights were trained with"
        )
    model_config = dataclasses.asdict(model.config)
    meta = {
        "model_config": model_config,
        "config": {"model": model_config, "tokenizer": {"kind": tokenizer.kind}},
        "step": 0, "tokens_seen": 0, "imported_from": str(Path(hf_folder).resolve()),
    }
    return save_checkpoint(out, model, {"step": 0}, meta, tokenizer)


def export_checkpoint(checkpoint: str | Path, out: str | Path) -> Path:
    """A minigpt checkpoint (or run folder) -> a HF GPT-2 folder (config.json + model.safetensors)."""
    model, tokenizer, _ = read_checkpoint(checkpoint)
    return export_hf_gpt2(model, out, eot_id=tokenizer.eot_id)
