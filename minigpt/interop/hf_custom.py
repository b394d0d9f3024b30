"""A minigpt model that no transformers class computes, as a Hugging Face folder with modeling code of its
own.

The technique switches (value embeddings, the smear, the residual scalars, the backout, ReLU² with QK-norm,
norms without a gain, ...) make models that no class of transformers computes (interop/architecture.py). For
a rotary, pre-norm model `scripts/export.py format=hf` then writes (hf_export.py), beside the weights under
minigpt's own names,

    configuration_minigpt.py   MiniGPTConfig (config.json's keys: the sizes and switches)
    modeling_minigpt.py        MiniGPTForCausalLM: minigpt's forward pass written out again with torch alone

from `hf_remote/`, and config.json's `auto_map` points transformers at them: `AutoModelForCausalLM.
from_pretrained(folder, trust_remote_code=True)` loads the model, and `generate` runs it (without a KV cache:
each step recomputes the sequence, which these small models afford; the folder's generation_config.json says
use_cache=false). Positional encodings other than rotary,
post-norm blocks and the ablations are refused, naming the key.
"""

from __future__ import annotations

from pathlib import Path

import torch

from minigpt.errors import UserError
from minigpt.interop.architecture import refuse_ablations
from minigpt.model.config import ModelConfig
from minigpt.model.ffn import ffn_hidden_size
from minigpt.model.gpt import GPT

REMOTE = Path(__file__).parent / "hf_remote"
CODE_FILES = ("configuration_minigpt.py", "modeling_minigpt.py")
AUTO_MAP = {"AutoConfig": "configuration_minigpt.MiniGPTConfig",
            "AutoModelForCausalLM": "modeling_minigpt.MiniGPTForCausalLM"}
SWITCHES = ("qk_norm", "value_embeds", "value_embed_every", "smear", "bigram_embed", "embed_norm",
            "residual_scalars", "backout", "logit_softcap", "norm", "norm_eps", "norm_gain", "activation",
            "bias", "rope_base", "n_layer", "n_head", "n_embd", "block_size", "vocab_size", "qk_scale",
            "ve_gate_max", "ve_gate_channels", "smear_gate_channels")


def custom_config(cfg: ModelConfig, eot_id: int) -> dict:
    """config.json for the modeling code of `hf_remote/`; UserError naming what it does not compute."""
    refuse_ablations(cfg, "Hugging Face")
    if cfg.pos_encoding != "rope":
        raise UserError(f"model.pos_encoding={cfg.pos_encoding} has no Hugging Face equivalent in minigpt's "
                        "own modeling code, which computes rotary models (model.pos_encoding=rope)")
    if cfg.norm_placement != "pre":
        raise UserError(f"model.norm_placement={cfg.norm_placement} has no Hugging Face equivalent: "
                        "minigpt's own modeling code computes pre-norm blocks (model.norm_placement=pre)")
    return {
        "model_type": "minigpt", "architectures": ["MiniGPTForCausalLM"], "auto_map": AUTO_MAP,
        **{key: getattr(cfg, key) for key in SWITCHES}, "n_kv_head": cfg.kv_heads,
        "ffn_hidden": ffn_hidden_size(cfg), "tie_word_embeddings": cfg.tie_weights, "use_cache": False,
        "bos_token_id": eot_id, "eos_token_id": eot_id, "torch_dtype": "float32",
    }


def custom_hf_files(model: GPT, eot_id: int) -> tuple[dict, dict[str, torch.Tensor], dict[str, str]]:
    """(config.json dict, weights under minigpt's names, {file name: source}) of `model`'s folder."""
    config = custom_config(model.config, eot_id)
    weights = dict(model.state_dict())
    if model.config.tie_weights:
        del weights["lm_head.weight"]  # safetensors refuses shared storage; transformers re-ties it from wte
    return config, weights, {name: (REMOTE / name).read_text() for name in CODE_FILES}
