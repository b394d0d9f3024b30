"""Which outside architecture a minigpt model is, or the one feature that makes it none.

Every inference stack runs two families of decoder blocks, and minigpt's switches can build either, the
second also in the variant Qwen3 made common:

    gpt2   learned positions, pre-norm LayerNorm, a plain MLP (GELU or ReLU), multi-head attention, biases
           -> transformers' GPT2LMHeadModel, llama.cpp's `gpt2` graph
    llama  rotary positions in the rotate-half layout, pre-norm RMSNorm, a SwiGLU MLP, grouped-query
           attention, optional biases -> transformers' LlamaForCausalLM, llama.cpp's `llama` graph
    qwen3  llama with every head's queries and keys RMS-normalised (a learned gain per channel) before the
           rotation (model.qk_norm=true), no biases -> transformers' Qwen3ForCausalLM, llama.cpp's `qwen3`

Anything else computes numbers no class of theirs computes, so it is refused, naming the feature: a file
that loads but gives other logits would be worse than no file. `gpt2` with model.bias=false is exported
with zero biases, which is the same function.
"""

from __future__ import annotations

from minigpt.errors import UserError
from minigpt.model.config import ModelConfig

GPT2, LLAMA, QWEN3 = "gpt2", "llama", "qwen3"
ARCHITECTURES = (GPT2, LLAMA, QWEN3)
ROPE_FAMILIES = (LLAMA, QWEN3)  # the same block and names; qwen3 adds the query and key norms
# what each family needs of the features that tell them apart; the positions choose the family
FAMILY_NEEDS = {
    GPT2: {"norm": ("layernorm",), "activation": ("gelu_tanh", "gelu", "relu")},
    LLAMA: {"norm": ("rmsnorm",), "activation": ("swiglu",)},
    QWEN3: {"norm": ("rmsnorm",), "activation": ("swiglu",), "bias": (False,)},
}
FAMILY_CLASS = {GPT2: "GPT2LMHeadModel", LLAMA: "LlamaForCausalLM", QWEN3: "Qwen3ForCausalLM"}


def architecture_of(cfg: ModelConfig, target: str = "Hugging Face") -> str:
    """`gpt2`, `llama` or `qwen3`: the family `cfg` computes exactly; else a UserError naming the feature and
    `target` (the format being written, for the message)."""
    refuse_ablations(cfg, target)
    _refuse_techniques(cfg, target)
    if cfg.norm_placement != "pre":
        raise UserError(
            f"model.norm_placement={cfg.norm_placement} has no {target} equivalent: GPT-2 and Llama blocks "
            "are pre-norm (model.norm_placement=pre)"
        )
    if cfg.pos_encoding == "learned":
        family = GPT2
    elif cfg.pos_encoding == "rope":
        family = QWEN3 if cfg.qk_norm else LLAMA
    else:
        raise UserError(
            f"model.pos_encoding={cfg.pos_encoding} has no {target} equivalent: GPT-2 learns its positions "
            "(learned), Llama rotates queries and keys (rope)"
        )
    if family == GPT2 and cfg.qk_norm:
        raise UserError(f"model.qk_norm=true with model.pos_encoding=learned has no {target} equivalent: "
                        "GPT-2 does not normalise queries and keys (Qwen3 does, with pos_encoding=rope)")
    for key, allowed in FAMILY_NEEDS[family].items():
        value = getattr(cfg, key)
        if value not in allowed:
            named = f"model.pos_encoding={cfg.pos_encoding}"
            named += " and model.qk_norm=true" if cfg.qk_norm else ""
            raise UserError(
                f"model.{key}={_text(value)} with {named} has no {target} equivalent: "
                f"{FAMILY_CLASS[family]} needs model.{key}={' or '.join(_text(a) for a in allowed)}"
            )
    if family == GPT2 and cfg.kv_heads != cfg.n_head:
        raise UserError(
            f"model.n_kv_head={cfg.n_kv_head} has no {target} equivalent with learned positions: GPT-2 has "
            "no grouped-query attention (model.n_kv_head=null)"
        )
    return family


def refuse_ablations(cfg: ModelConfig, target: str) -> None:
    """The ablation switches (model/config.py) remove a piece every real architecture has."""
    removed = [
        ("causal", cfg.causal, True, "it was trained without the causal mask"),
        ("attn_scale", cfg.attn_scale, "sqrt", "its attention scores are not divided by sqrt(head size)"),
        ("residual", cfg.residual, True, "its blocks have no skip path"),
        ("final_norm", cfg.final_norm, True, "it has no final norm before the head"),
    ]
    for key, value, normal, what in removed:
        if value != normal:
            raise UserError(f"model.{key}={_text(value)} is an ablation with no {target} equivalent ({what})")


def _refuse_techniques(cfg: ModelConfig, target: str) -> None:
    """The technique switches (model/config.py) that add a piece no family has; model.zero_init_proj only
    changes the initialisation, ReLU² is refused by the family's activation, and QK-norm makes a rope model
    the qwen3 family."""
    added = [
        ("value_embeds", cfg.value_embeds, False, "its attention values add per-layer token tables"),
        ("smear", cfg.smear, False, "it mixes the previous token's embedding into each token's"),
        ("bigram_embed", cfg.bigram_embed, 0, "it adds a hashed (previous, current) token-pair table"),
        ("logit_softcap", cfg.logit_softcap, 0.0, "its logits are soft-capped"),
        ("norm_gain", cfg.norm_gain, True, "its norms have no learned gain"),
        ("embed_norm", cfg.embed_norm, False, "its token embedding is normalised"),
        ("residual_scalars", cfg.residual_scalars, False, "its blocks read learned mixes of the stream and "
                                                          "the embedding"),
        ("backout", cfg.backout, False, "its head subtracts part of the middle of the stack"),
        ("qk_scale", cfg.qk_scale, 1.0, "its normalised queries and keys are scaled"),
    ]
    for key, value, plain, what in added:
        if value != plain:
            raise UserError(f"model.{key}={_text(value)} has no {target} equivalent ({what}); a model "
                            f"trained with model.{key}={_text(plain)} exports")


def _text(value: object) -> str:
    """A config value as a command line writes it (true, not True)."""
    return str(value).lower() if isinstance(value, bool) else str(value)
