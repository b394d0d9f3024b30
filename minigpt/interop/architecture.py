"""Which outside architecture a minigpt model is, or the one feature that makes it none.

Every inference stack runs two families of decoder blocks, and minigpt's switches can build either:

    gpt2   learned positions, pre-norm LayerNorm, a plain MLP (GELU or ReLU), multi-head attention, biases
           -> transformers' GPT2LMHeadModel, llama.cpp's `gpt2` graph
    llama  rotary positions in the rotate-half layout, pre-norm RMSNorm, a SwiGLU MLP, grouped-query
           attention, optional biases -> transformers' LlamaForCausalLM, llama.cpp's `llama` graph

Anything else computes numbers no class of theirs computes, so it is refused, naming the feature: a file
that loads but gives other logits would be worse than no file. `gpt2` with model.bias=false is exported
with zero biases, which is the same function.
"""

from __future__ import annotations

from minigpt.errors import UserError
from minigpt.model.config import ModelConfig

GPT2, LLAMA = "gpt2", "llama"
ARCHITECTURES = (GPT2, LLAMA)
# what each family needs of the features that tell them apart; the positions choose the family
FAMILY_NEEDS = {
    GPT2: {"norm": ("layernorm",), "activation": ("gelu_tanh", "gelu", "relu")},
    LLAMA: {"norm": ("rmsnorm",), "activation": ("swiglu",)},
}
FAMILY_CLASS = {GPT2: "GPT2LMHeadModel", LLAMA: "LlamaForCausalLM"}


def architecture_of(cfg: ModelConfig, target: str = "Hugging Face") -> str:
    """`gpt2` or `llama`: the family `cfg` computes exactly; else a UserError naming the feature and `target`
    (the format being written, for the message)."""
    _refuse_ablations(cfg, target)
    if cfg.norm_placement != "pre":
        raise UserError(
            f"model.norm_placement={cfg.norm_placement} has no {target} equivalent: GPT-2 and Llama blocks "
            "are pre-norm (model.norm_placement=pre)"
        )
    if cfg.pos_encoding == "learned":
        family = GPT2
    elif cfg.pos_encoding == "rope":
        family = LLAMA
    else:
        raise UserError(
            f"model.pos_encoding={cfg.pos_encoding} has no {target} equivalent: GPT-2 learns its positions "
            "(learned), Llama rotates queries and keys (rope)"
        )
    for key, allowed in FAMILY_NEEDS[family].items():
        value = getattr(cfg, key)
        if value not in allowed:
            raise UserError(
                f"model.{key}={value} with model.pos_encoding={cfg.pos_encoding} has no {target} equivalent: "
                f"{FAMILY_CLASS[family]} needs model.{key}={' or '.join(allowed)}"
            )
    if family == GPT2 and cfg.kv_heads != cfg.n_head:
        raise UserError(
            f"model.n_kv_head={cfg.n_kv_head} has no {target} equivalent with learned positions: GPT-2 has "
            "no grouped-query attention (model.n_kv_head=null)"
        )
    return family


def _refuse_ablations(cfg: ModelConfig, target: str) -> None:
    """The ablation switches (model/config.py) remove a piece every real architecture has."""
    removed = [
        ("causal", cfg.causal, True, "it was trained without the causal mask"),
        ("attn_scale", cfg.attn_scale, "sqrt", "its attention scores are not divided by sqrt(head size)"),
        ("residual", cfg.residual, True, "its blocks have no skip path"),
        ("final_norm", cfg.final_norm, True, "it has no final norm before the head"),
    ]
    for key, value, normal, what in removed:
        if value != normal:
            value_text = str(value).lower() if isinstance(value, bool) else value
            raise UserError(f"model.{key}={value_text} is an ablation with no {target} equivalent ({what})")
