"""Llama, Qwen3 and Arcee in the Hugging Face format: config.json and weights <-> a minigpt `GPT` with a
Llama-style block.

A Llama block is minigpt's block with pos_encoding=rope, norm=rmsnorm, activation=swiglu, and the weights
are a copy under other names, the two fused projections split (the table: interop/family_weights.py).

A Qwen3 block is the Llama block with model.qk_norm=true: both normalise each head's D query and key
channels with an RMSNorm of the model's eps before the rotation (attention.py), and Qwen3 has no biases.
An Arcee block is the Llama block with model.activation=relu2: a two-matrix MLP, down(relu(up x)²), which
transformers calls hidden_act="relu2"; it has no biases either.

Both rotate q and k with dimension j paired with j + D/2 (the rotate-half layout), so no permutation is
needed here (GGUF needs one: gguf_export.py). RMSNorm is the same formula and eps; the rope base is
`rope_theta`; biases, when the model has them, are HF's `attention_bias` and `mlp_bias`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from minigpt.errors import UserError
from minigpt.interop.architecture import ARCEE, FAMILY_CLASS, QWEN3, ROPE_FAMILIES, architecture_of
from minigpt.interop.family_weights import llama_table, llama_weights
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

INV_FREQ = ".rotary_emb.inv_freq"  # a buffer some older checkpoints saved: recomputed, not a weight
HIDDEN_ACT = {"silu": "swiglu", "relu2": "relu2"}  # config.json's hidden_act -> model.activation


# ---------------------------------------------------------------------------------------------------- configs


def hf_llama_config(cfg: ModelConfig, eot_id: int | None = None) -> dict:
    """LlamaForCausalLM's (or, with qk_norm, Qwen3ForCausalLM's; with relu2, ArceeForCausalLM's) config.json
    dict for a ModelConfig of those families; UserError names what is not."""
    family = architecture_of(cfg)
    if family not in ROPE_FAMILIES:
        raise UserError(f"model.pos_encoding={cfg.pos_encoding} cannot be exported as Llama "
                        "(it needs model.pos_encoding=rope)")
    hf = {
        "model_type": family, "architectures": [FAMILY_CLASS[family]],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd, "intermediate_size": ffn_hidden_size(cfg),
        "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
        "hidden_act": "relu2" if family == ARCEE else "silu",
        "max_position_embeddings": cfg.block_size, "rms_norm_eps": cfg.norm_eps,
        # rope_theta is read by every transformers release; rope_parameters is the newer releases' own key
        "rope_theta": cfg.rope_base, "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_base},
        "attention_bias": cfg.bias, "mlp_bias": cfg.bias, "attention_dropout": cfg.attn_dropout,
        "tie_word_embeddings": cfg.tie_weights,
    }
    if family == QWEN3:  # every layer attends to the whole context, as minigpt's do
        del hf["mlp_bias"]  # Qwen3's MLP has no biases (refused above unless model.bias=false)
        hf |= {"use_sliding_window": False, "sliding_window": None, "max_window_layers": cfg.n_layer,
               "layer_types": ["full_attention"] * cfg.n_layer}
    if eot_id is not None:
        hf["bos_token_id"] = hf["eos_token_id"] = eot_id
    return hf


def config_from_hf_llama(hf: dict, file: str | Path = CONFIG) -> ModelConfig:
    """A llama-, qwen3- or arcee-family ModelConfig sized from a LlamaForCausalLM, Qwen3ForCausalLM or
    ArceeForCausalLM config.json dict (read from `file`, named in every refusal); UserError for a variant
    minigpt's block does not compute (rope scaling, another activation, a head size that is not C/H, a sliding
    window) or a missing size."""
    qwen3, arcee = hf.get("model_type") == QWEN3, hf.get("model_type") == ARCEE
    if qwen3 and (hf.get("use_sliding_window") or hf.get("attention_bias")):
        raise UserError(f"{file} is a Qwen3 with a sliding window or attention biases; minigpt's qwen3 "
                        "attends to the whole context and has no biases")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope = rope if isinstance(rope, dict) else {"rope_type": rope}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise UserError(f"{file} uses rope_type={rope_type!r}; minigpt's rope is the unscaled default")
    act = hf.get("hidden_act", "relu2" if arcee else "silu")
    if act != ("relu2" if arcee else "silu"):
        raise UserError(f"{file} has hidden_act={act!r}; minigpt's {'ReLU² MLP' if arcee else 'SwiGLU'} "
                        f"uses {'relu2' if arcee else 'silu'}")
    if bool(hf.get("attention_bias", False)) != bool(hf.get("mlp_bias", False)):
        raise UserError(f"{file} sets attention_bias and mlp_bias apart; minigpt has one model.bias")

    def number(key: str, default: float | None = None, whole: bool = True) -> int | float:
        return config_number(hf, key, default, whole, file)

    n_embd, n_head = number("hidden_size"), number("num_attention_heads")
    if hf.get("head_dim") not in (None, n_embd // n_head):
        raise UserError(f"{file} has head_dim={hf['head_dim']}; minigpt's head size is "
                        f"hidden_size/num_attention_heads = {n_embd // n_head}")
    intermediate = number("intermediate_size")
    cfg = ModelConfig(
        n_layer=number("num_hidden_layers"), n_head=n_head,
        n_kv_head=number("num_key_value_heads", n_head) if hf.get("num_key_value_heads") else n_head,
        n_embd=n_embd, block_size=number("max_position_embeddings", 2048), vocab_size=number("vocab_size"),
        pos_encoding="rope", rope_base=config_number({**hf, **rope}, "rope_theta", 10000.0, False, file),
        norm="rmsnorm", norm_placement="pre", norm_eps=number("rms_norm_eps", 1e-6, whole=False),
        activation=HIDDEN_ACT[act],
        ffn_mult=(1.0 if arcee else 1.5) * intermediate / n_embd,  # swiglu's hidden is 2/3 of ffn_mult·C
        bias=bool(hf.get("attention_bias", False)), tie_weights=bool(hf.get("tie_word_embeddings", False)),
        dropout=0.0, attn_dropout=0.0, qk_norm=qwen3,
    )
    if ffn_hidden_size(cfg) != intermediate:
        raise UserError(f"{file} has intermediate_size={intermediate}; minigpt needs a multiple of 8")
    return cfg


# ---------------------------------------------------------------------------------------------------- weights


def minigpt_state_dict_from_llama(hf_sd: dict[str, torch.Tensor], cfg: ModelConfig,
                                  folder: Path) -> dict[str, torch.Tensor]:
    """LlamaForCausalLM (or Qwen3ForCausalLM, ArceeForCausalLM) tensors (those of `folder`) -> minigpt names,
    the q/k/v and gate/up matrices stacked back."""
    table = llama_table(cfg)
    used = {name for _, theirs in table for name in theirs}
    missing = sorted(used - set(hf_sd))
    unexpected = sorted(n for n in set(hf_sd) - used if not n.endswith(INV_FREQ) and n != "lm_head.weight")
    if missing or unexpected:
        raise UserError(f"the {_family_name(cfg)} weights in {folder} do not match its "
                        f"{CONFIG}: missing {missing[:3]}, unexpected {unexpected[:3]}")
    out = {ours: torch.cat([hf_sd[name] for name in theirs], dim=0) for ours, theirs in table}
    if cfg.tie_weights:  # transformers ties the head to the embedding whatever the file holds
        out["lm_head.weight"] = out["transformer.wte.weight"]
    return out


def load_hf_llama(folder: str | Path) -> GPT:
    """A minigpt GPT (float32, CPU, eval mode) holding the weights of a local LlamaForCausalLM,
    Qwen3ForCausalLM or ArceeForCausalLM folder."""
    folder = Path(folder).expanduser()
    cfg = config_from_hf_llama(read_hf_config(folder), folder / CONFIG)
    weights = read_hf_weights(folder)
    family = _family_name(cfg)
    with torch.device("meta"):  # the shapes config.json implies, under Llama's names, in no memory
        expected = llama_weights(GPT(cfg))
    for name, want in expected.items():  # in the model's order, before the fused matrices are stacked back
        if name in weights and weights[name].shape != want.shape:
            raise UserError(f"the {family} weights in {folder} do not match its {CONFIG}: {name} has shape "
                            f"{tuple(weights[name].shape)} where it needs {tuple(want.shape)}")
    stacked = minigpt_state_dict_from_llama(weights, cfg, folder)
    return load_converted_weights(GPT(cfg), stacked, family, folder)


def _family_name(cfg: ModelConfig) -> str:
    return "Qwen3" if cfg.qk_norm else "Arcee" if cfg.activation == "relu2" else "Llama"
