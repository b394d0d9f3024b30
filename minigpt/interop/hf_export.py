"""A minigpt model as a Hugging Face folder: config.json, model.safetensors, generation_config.json and
tokenizer.json (+ its config). `AutoModelForCausalLM` / `AutoTokenizer.from_pretrained(folder)` load it with
no custom code, as GPT2LMHeadModel, LlamaForCausalLM or Qwen3ForCausalLM (interop/architecture.py).

Everything is converted and checked in memory first, so a refused model writes nothing; the folder is written
under a temporary name and renamed when complete (staging.py).
"""

from __future__ import annotations

from pathlib import Path

import torch

from minigpt.data.tokenizers import Tokenizer
from minigpt.interop.architecture import GPT2, architecture_of
from minigpt.interop.family_weights import llama_weights
from minigpt.interop.fast_tokenizer import fast_tokenizer
from minigpt.interop.hf_files import CONFIG, GENERATION_CONFIG, WEIGHTS, write_json, write_weights
from minigpt.interop.hf_gpt2 import hf_config_from_model, hf_state_dict
from minigpt.interop.hf_llama import hf_llama_config
from minigpt.interop.hf_tokenizer import save_hf_tokenizer
from minigpt.interop.staging import staged_output
from minigpt.model.gpt import GPT


def hf_files(model: GPT, eot_id: int) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json dict, weights under HF names) for `model`; UserError naming the feature HF lacks."""
    if architecture_of(model.config) == GPT2:
        config, weights = hf_config_from_model(model.config, eot_id), hf_state_dict(model)
        if model.config.tie_weights:
            del weights["lm_head.weight"]  # safetensors refuses shared storage; HF re-ties it from wte
        return config, weights
    return hf_llama_config(model.config, eot_id), llama_weights(model)


def export_hf(model: GPT, tokenizer: Tokenizer, out: str | Path) -> Path:
    """Write `model` and its tokenizer as a new HF folder `out`; returns it."""
    config, weights = hf_files(model, tokenizer.eot_id)
    fast = fast_tokenizer(tokenizer)  # converted before anything is written
    eot = tokenizer.eot_id
    generation = {"bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot}  # a document ends at EOT
    with staged_output(Path(out), folder=True) as tmp:
        write_json(tmp / CONFIG, config)
        write_weights(tmp / WEIGHTS, weights)
        write_json(tmp / GENERATION_CONFIG, generation)
        save_hf_tokenizer(fast, tmp, model_max_length=model.config.block_size)
    return Path(out).expanduser()
