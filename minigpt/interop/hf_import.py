"""A Hugging Face folder (one an export wrote, or any GPT-2 / Llama / Qwen3 / Arcee one) -> a new minigpt
checkpoint folder that generate.py and trainer.init_from read: the weights, meta.json and a tokenizer, no
optimizer state.

The folder is read and checked whole before anything is written (hf_files.py, hf_gpt2.py, hf_llama.py,
hf_tokenizer.py), so a malformed one is refused in one line; the checkpoint is written atomically
(checkpoint/format.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from minigpt.checkpoint.format import save_checkpoint
from minigpt.data.config import TokenizerConfig
from minigpt.data.tokenizers import Tokenizer, build_tokenizer, load_tokenizer
from minigpt.errors import UserError, unwritable_path_message
from minigpt.interop.hf_files import CONFIG, read_hf_config
from minigpt.interop.hf_gpt2 import load_hf_gpt2
from minigpt.interop.hf_llama import load_hf_llama
from minigpt.interop.hf_tokenizer import TOKENIZER_JSON, tokenizer_from_hf
from minigpt.interop.staging import ELSEWHERE, parent_folders
from minigpt.model.gpt import GPT

# config.json's model_type -> its reader
LOADERS = {"gpt2": load_hf_gpt2, "llama": load_hf_llama, "qwen3": load_hf_llama, "arcee": load_hf_llama}


def load_hf_model(folder: str | Path) -> GPT:
    """A minigpt GPT (float32, CPU, eval mode) with the weights of a GPT-2, Llama, Qwen3 or Arcee folder."""
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
    try:
        with parent_folders(out):
            return save_checkpoint(out, model, {"step": 0}, meta, tokenizer, elsewhere=ELSEWHERE)
    except OSError as e:  # the folders above `out` could not be made
        raise UserError(f"nothing imported: {unwritable_path_message(e, ELSEWHERE)}") from None
