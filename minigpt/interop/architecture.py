"""Which outside architecture a minigpt model is, or the one feature that makes it none.

Every inference stack runs two families of decoder blocks, and minigpt's switches can build either, the
second also in two variants (Qwen3's query and key norms, Arcee's ReLU² MLP):

    gpt2   learned positions, pre-norm LayerNorm, a plain MLP (GELU or ReLU), multi-head attention, biases
           -> transformers' GPT2LMHeadModel, llama.cpp's `gpt2` graph
    llama  rotary positions in the rotate-half layout, pre-norm RMSNorm, a SwiGLU MLP, grouped-query
           attention, optional biases -> transformers' LlamaForCausalLM, llama.cpp's `llama` graph
    qwen3  llama with every head's queries and keys RMS-normalised (a learned gain per channel) before the
           rotation (model.qk_norm=true), no biases -> transformers' Qwen3ForCausalLM, llama.cpp's `qwen3`
    arcee  llama with a two-matrix ReLU² MLP, down(relu(up x)²) (model.activation=relu2), no biases
           -> transformers' ArceeForCausalLM, llama.cpp's `arcee`

Anything else computes numbers no class of theirs computes, so it is refused, naming the feature: a file
that loads but gives other logits would be worse than no file (the Hugging Face export then writes minigpt's
own modeling code: hf_custom.py). `gpt2` with model.bias=false is exported with zero biases, which is the
same function.
"""

from __future__ import annotations

from minigpt.errors import UserError
from minigpt.model.config import ModelConfig

GPT2, LLAMA, QWEN3, ARCEE = "gpt2", "llama", "qwen3", "arcee"
ARCHITECTURES = (GPT2, LLAMA, QWEN3, ARCEE)
ROPE_FAMILIES = (LLAMA, QWEN3, ARCEE)  # Llama's block and names; qwen3 adds q/k norms, arcee has no gate
# what each family needs of the features that tell them apart; the positions choose the family
FAMILY_NEEDS = {
    GPT2: {"norm": ("layernorm",), "activation": ("gelu_tanh", "gelu", "relu")},
    LLAMA: {"norm": ("rmsnorm",), "activation": ("swiglu",)},
    QWEN3: {"norm": ("rmsnorm",), "activation": ("swiglu",), "bias": (False,)},
    ARCEE: {"norm": ("rmsnorm",), "activation": ("relu2",), "bias": (False,)},
}
FAMILY_CLASS = {GPT2: "GPT2LMHeadModel", LLAMA: "LlamaForCausalLM", QWEN3: "Qwen3ForCausalLM",
                ARCEE: "ArceeForCausalLM"}


def architecture_of(cfg: ModelConfig, target: str = "Hugging Face") -> str:
    """`gpt2`, `llama`, `qwen3` or `arcee`: the family `cfg` computes exactly; else a UserError naming the
    feature and `target` (the format being written, for the message)."""
    refuse_ablations(cfg, target)
    _refuse_techniques(cfg, target)
    if cfg.norm_placement != "pre":
        raise UserError(
            f"model.norm_placement={cfg.norm_placement} has no {target} equivalent: GPT-2 and Llama blocks "
            "are pre-norm (model.norm_placement=pre)"
        )
    family = _family_by_positions(cfg)
    if family is None:
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


def _family_by_positions(cfg: ModelConfig) -> str | None:
    """The family a model's positions (and QK-norm, ReLU²) point to; None for positions no family has."""
    if cfg.pos_encoding == "learned":
        return GPT2
    if cfg.pos_encoding == "rope":
        return QWEN3 if cfg.qk_norm else ARCEE if cfg.activation == "relu2" else LLAMA
    return None


def technique_switches(cfg: ModelConfig) -> list[str]:
    """`model.key=value` of every technique switch of `cfg` that adds a piece no family has."""
    return [f"model.{key}={_text(value)}" for key, value, plain, _ in _techniques(cfg) if value != plain]


def features_without_family(cfg: ModelConfig) -> list[str]:
    """Every `model.key=value` that keeps a model with no ablation out of the families: the technique
    switches and what its positions' family needs otherwise (its norm, activation, biases), for a line that
    names them all."""
    named = technique_switches(cfg)
    family = _family_by_positions(cfg)
    for key, allowed in FAMILY_NEEDS[family].items() if family else ():
        if getattr(cfg, key) not in allowed:  # with qk_norm, qwen3's needs: ReLU² alone travels (arcee)
            named.append(f"model.{key}={_text(getattr(cfg, key))}" + (" with model.qk_norm=true"
                                                                      if family == QWEN3 else ""))
    return named


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
    for key, value, plain, what in _techniques(cfg):
        if value != plain:
            raise UserError(f"model.{key}={_text(value)} has no {target} equivalent ({what}); a model "
                            f"trained with model.{key}={_text(plain)} exports")


def _techniques(cfg: ModelConfig) -> list[tuple[str, object, object, str]]:
    """(key, value, the value of a model without it, what it adds) of the technique switches (model/config.py)
    that add a piece no family has; model.zero_init_proj and model.init only change the initialisation,
    ReLU² is a family's activation, and QK-norm makes a rope model the qwen3 family."""
    return [
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


def _text(value: object) -> str:
    """A config value as a command line writes it (true, not True)."""
    return str(value).lower() if isinstance(value, bool) else str(value)
