"""GPT-2 in the Hugging Face format: config.json and weights <-> a minigpt `GPT` (the name-by-name mapping).

minigpt uses GPT-2's parameter names, so the mapping is a name-by-name copy with three wrinkles:

- HF's attention and MLP layers are `Conv1D`, which stores its weight as (in, out) — the transpose
  of `nn.Linear`'s (out, in). The four such matrices per block are transposed on the way in and out.
- A bare `GPT2Model` checkpoint (like the original `gpt2` upload) has no `transformer.` prefix and no
  `lm_head`; the head is the token embedding (tied weights).
- GPT-2 always has biases: a model built with model.bias=false is written with zero biases (the same
  function).

HF's causal-mask buffers (`attn.bias`, `attn.masked_bias`) of older checkpoints are not weights and
are dropped. GPT-2's activation `gelu_new` is the tanh approximation of GELU: `gelu_tanh` here.
"""

from __future__ import annotations

from pathlib import Path

import torch

from minigpt.errors import UserError
from minigpt.interop.architecture import GPT2, architecture_of
from minigpt.interop.family_weights import gpt2_weights
from minigpt.interop.hf_files import (
    CONFIG,
    config_number,
    load_converted_weights,
    read_hf_config,
    read_hf_weights,
)
from minigpt.model.config import ModelConfig
from minigpt.model.ffn import ffn_hidden_size
from minigpt.model.gpt import GPT

CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
MASK_BUFFERS = (".attn.bias", ".attn.masked_bias")  # the dot: c_attn.bias is a real weight
HF_TO_MINIGPT_ACTIVATION = {
    "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"
}
MINIGPT_TO_HF_ACTIVATION = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
# GPT-2 variants minigpt's blocks do not compute; each one would change the numbers silently
UNSUPPORTED_FLAGS = {"scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
                     "add_cross_attention": False, "scale_attn_weights": True}


# ---------------------------------------------------------------------------------------------------- configs


def config_from_hf(hf: dict, file: str | Path = CONFIG) -> ModelConfig:
    """A gpt2-family ModelConfig sized from a Hugging Face `config.json` dict (read from `file`, named in
    every refusal)."""
    if hf.get("model_type", "gpt2") != "gpt2":
        raise UserError(f"{file} has model_type={hf.get('model_type')!r}; only model_type gpt2 loads")
    for key, needed in UNSUPPORTED_FLAGS.items():
        if hf.get(key, needed) != needed:
            raise UserError(f"{file} sets {key}={hf[key]}; minigpt supports only {key}={needed}")
    act = hf.get("activation_function", "gelu_new")
    if act not in HF_TO_MINIGPT_ACTIVATION:
        raise UserError(
            f"{file} has activation_function={act!r}; supported: {', '.join(HF_TO_MINIGPT_ACTIVATION)}"
        )

    def number(key: str, default: float, whole: bool = True) -> int | float:
        return config_number(hf, key, default, whole, file)

    n_embd = number("n_embd", 768)
    n_inner = number("n_inner", 4 * n_embd) if hf.get("n_inner") is not None else 4 * n_embd  # null: 4·C
    cfg = ModelConfig(
        n_layer=number("n_layer", 12), n_head=number("n_head", 12), n_kv_head=None, n_embd=n_embd,
        block_size=number("n_positions", 1024), vocab_size=number("vocab_size", 50257),
        pos_encoding="learned", norm="layernorm", norm_placement="pre",
        norm_eps=number("layer_norm_epsilon", 1e-5, whole=False), activation=HF_TO_MINIGPT_ACTIVATION[act],
        ffn_mult=n_inner / n_embd, bias=True, tie_weights=bool(hf.get("tie_word_embeddings", True)),
        dropout=0.0, attn_dropout=0.0,  # inference; a fine-tuning run sets its own (training/start.py)
    )
    if ffn_hidden_size(cfg) != n_inner:
        raise UserError(f"{file} has n_inner={n_inner}; minigpt needs a multiple of 8 (GPT-2: 4·n_embd)")
    return cfg


def hf_config_from_model(cfg: ModelConfig, eot_id: int | None = None) -> dict:
    """The Hugging Face `config.json` dict of a gpt2-family ModelConfig; UserError names what is not."""
    if architecture_of(cfg) != GPT2:
        raise UserError(f"model.pos_encoding={cfg.pos_encoding} cannot be exported as GPT-2 "
                        "(it needs model.pos_encoding=learned)")
    hf = {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
        "vocab_size": cfg.vocab_size, "n_positions": cfg.block_size, "n_embd": cfg.n_embd,
        "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_inner": ffn_hidden_size(cfg),
        "activation_function": MINIGPT_TO_HF_ACTIVATION[cfg.activation], "layer_norm_epsilon": cfg.norm_eps,
        "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout, "attn_pdrop": cfg.attn_dropout,
        "tie_word_embeddings": cfg.tie_weights,
    }
    if eot_id is not None:  # HF's default (50256) is only right for the GPT-2 tokenizer
        hf["bos_token_id"] = hf["eos_token_id"] = eot_id
    return hf


# ---------------------------------------------------------------------------------------------------- weights


def _is_conv1d(name: str) -> bool:
    return name.endswith(CONV1D_WEIGHTS)


def hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """minigpt weights under HF GPT2LMHeadModel's names and layouts (Conv1D matrices transposed).

    Load it with `GPT2LMHeadModel(GPT2Config(**hf_config_from_model(model.config))).load_state_dict(sd)`
    to give the Hugging Face model exactly this model's weights (bench.py compares the two this way).
    """
    hf_config_from_model(model.config)  # fail early on a config GPT-2 cannot express
    return {name: t.t().contiguous() if _is_conv1d(name) else t.clone()  # (in, out) for Conv1D
            for name, t in gpt2_weights(model).items()}


def minigpt_state_dict(hf_sd: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """HF GPT-2 tensors (with or without the `transformer.` prefix) -> minigpt names and layouts."""
    out = {}
    for name, tensor in hf_sd.items():
        if name.endswith(MASK_BUFFERS):
            continue
        if name != "lm_head.weight" and not name.startswith("transformer."):
            name = "transformer." + name  # a bare GPT2Model checkpoint
        out[name] = tensor.t() if _is_conv1d(name) else tensor  # Conv1D (in, out) -> Linear (out, in)
    if "lm_head.weight" not in out:
        if not cfg.tie_weights:
            raise UserError("the weights lack lm_head.weight but config.json sets tie_word_embeddings=false")
        out["lm_head.weight"] = out["transformer.wte.weight"]
    return out


def load_hf_gpt2(folder: str | Path) -> GPT:
    """A minigpt GPT (float32, CPU, eval mode) holding the GPT-2 weights of a local HF folder."""
    folder = Path(folder).expanduser()
    cfg = config_from_hf(read_hf_config(folder), folder / CONFIG)
    return load_converted_weights(GPT(cfg), minigpt_state_dict(read_hf_weights(folder), cfg), "GPT-2", folder)
