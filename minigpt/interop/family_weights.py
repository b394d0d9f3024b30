"""A model's weights under the names of its outside family (interop/architecture.py): what a Hugging Face
folder and a GGUF file are both written from (llama.cpp's converter maps these same names to its own).

gpt2   minigpt's own names, which are GPT-2's, in nn.Linear's (out, in) layout; a model built with
       model.bias=false gets a zero bias wherever GPT-2 has one (the same function)
llama  the names of LlamaForCausalLM (and Qwen3ForCausalLM, ArceeForCausalLM), the fused projections split:

    transformer.wte                  model.embed_tokens
    h.{i}.ln_1 / ln_2                model.layers.{i}.input_layernorm / post_attention_layernorm
    h.{i}.attn.c_attn  (fused)       self_attn.q_proj | k_proj | v_proj    rows H·D | H_kv·D | H_kv·D
    h.{i}.attn.q_norm / k_norm       self_attn.q_norm / k_norm             (qk_norm: Qwen3 only)
    h.{i}.attn.c_proj                self_attn.o_proj
    h.{i}.mlp.c_fc     (fused)       mlp.gate_proj | up_proj               rows hidden | hidden
                                     mlp.up_proj                           (relu2: Arcee, no gate)
    h.{i}.mlp.c_proj                 mlp.down_proj
    transformer.ln_f / lm_head       model.norm / lm_head  (no lm_head when tied)
"""

from __future__ import annotations

import torch

from minigpt.errors import UserError
from minigpt.interop.architecture import ROPE_FAMILIES, architecture_of
from minigpt.model.config import ModelConfig
from minigpt.model.ffn import ffn_hidden_size
from minigpt.model.gpt import GPT


def gpt2_weights(model: GPT) -> dict[str, torch.Tensor]:
    """The model's weights under its own (GPT-2) names, plus a zero bias for every linear layer and
    LayerNorm that has none (model.bias=false): GPT2LMHeadModel and llama.cpp's gpt2 expect them all."""
    sd = {name: t.detach() for name, t in model.state_dict().items()}
    for name, module in model.named_modules():
        # GPT-2's head has no bias either
        biased = isinstance(module, (torch.nn.Linear, torch.nn.LayerNorm)) and name != "lm_head"
        if biased and module.bias is None:
            sd[f"{name}.bias"] = torch.zeros(module.weight.shape[0], dtype=module.weight.dtype)
    return sd


def llama_table(cfg: ModelConfig) -> list[tuple[str, tuple[str, ...]]]:
    """(minigpt name, Llama names) of every tensor; with several Llama names the minigpt tensor is their rows
    stacked in that order (the fused projections)."""
    kinds = ("weight", "bias") if cfg.bias else ("weight",)
    up = ("up_proj",) if cfg.activation == "relu2" else ("gate_proj", "up_proj")  # arcee has no gate
    table = [("transformer.wte.weight", ("model.embed_tokens.weight",))]
    for i in range(cfg.n_layer):
        ours, theirs = f"transformer.h.{i}.", f"model.layers.{i}."
        table += [(ours + "ln_1.weight", (theirs + "input_layernorm.weight",)),
                  (ours + "ln_2.weight", (theirs + "post_attention_layernorm.weight",))]
        if cfg.qk_norm:
            table += [(f"{ours}attn.{n}_norm.weight", (f"{theirs}self_attn.{n}_norm.weight",)) for n in "qk"]
        for kind in kinds:
            table += [
                (f"{ours}attn.c_attn.{kind}", tuple(f"{theirs}self_attn.{p}_proj.{kind}" for p in "qkv")),
                (f"{ours}attn.c_proj.{kind}", (f"{theirs}self_attn.o_proj.{kind}",)),
                (f"{ours}mlp.c_fc.{kind}", tuple(f"{theirs}mlp.{p}.{kind}" for p in up)),
                (f"{ours}mlp.c_proj.{kind}", (f"{theirs}mlp.down_proj.{kind}",)),
            ]
    table.append(("transformer.ln_f.weight", ("model.norm.weight",)))
    if not cfg.tie_weights:  # tied: HF ties lm_head to embed_tokens itself (safetensors refuses shared data)
        table.append(("lm_head.weight", ("lm_head.weight",)))
    return table


def _split_sizes(cfg: ModelConfig, name: str) -> list[int]:
    """Rows of each part of a fused matrix: q | k | v, or gate | up (SiLU(gate) ⊙ up, ffn.py)."""
    if ".attn.c_attn." in name:
        return [cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim]
    return [ffn_hidden_size(cfg)] * 2


def llama_weights(model: GPT) -> dict[str, torch.Tensor]:
    """The weights of a llama-, qwen3- or arcee-family model under Llama's names, the fused matrices split; no
    lm_head when tied. UserError for a model of no such family."""
    cfg = model.config
    family = architecture_of(cfg)
    if family not in ROPE_FAMILIES:
        raise UserError(f"model.pos_encoding={cfg.pos_encoding} cannot be written as Llama "
                        "(it needs model.pos_encoding=rope)")
    sd = model.state_dict()
    out = {}
    for ours, theirs in llama_table(cfg):
        pieces = sd[ours].detach().split(_split_sizes(cfg, ours)) if len(theirs) > 1 else (sd[ours].detach(),)
        out.update({name: piece.clone() for name, piece in zip(theirs, pieces, strict=True)})
    return out
