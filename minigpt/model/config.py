"""The model's configuration: one dataclass, validated before any tensor is allocated.

Besides the architectural choices it holds the *ablation switches*: each removes one piece the
design defends (the causal mask, the 1/√D scale, the positional encoding, the residual path,
the final norm), each is off by default (the field's default keeps the piece), and each is named for
what it removes. `model.norm=batchnorm` is one too: it swaps the per-token norm for the per-channel one a
transformer avoids. They exist so that a run can show what breaks (configs/experiment/ablation/, `make
ablation`); `ablation_warnings` says in words what a model built with them gave up.

Beside them stand the *technique switches*: pieces that record-setting small-GPT training runs add (QK-norm,
ReLU², zero-initialised projections, value embeddings, the previous-token smear, a hashed bigram embedding,
logit soft-capping). Each is off by default until measurements show it wins at this codebase's scale
(docs/tricks.md has the table), and each keeps the cached and uncached decoders in agreement.
"""

from __future__ import annotations

from dataclasses import dataclass

from minigpt.errors import UserError

# none and integer are ablations: no position at all, or the raw index added to every channel
POS_ENCODINGS = ("sinusoidal", "learned", "rope", "none", "integer")
ABLATION_POS_ENCODINGS = ("none", "integer")
NORMS = ("layernorm", "rmsnorm", "batchnorm")  # batchnorm is an ablation: statistics over the batch
NORM_PLACEMENTS = ("pre", "post")
ACTIVATIONS = ("relu", "relu2", "gelu", "gelu_tanh", "swiglu")
ATTENTION_BACKENDS = ("math", "sdpa", "online")
ATTN_SCALES = ("sqrt", "none")  # scores = q·kᵀ/√D | q·kᵀ (an ablation)
DEFAULT_ROPE_BASE = 10000.0


@dataclass
class ModelConfig:
    """Every architectural choice of a GPT-style decoder. YAML: `configs/model/*.yaml`.

    The defaults are the default run's model (`configs/model/demo.yaml`): the Llama-style block (rotary
    positions, RMSNorm, SwiGLU, one key/value head for three query heads, untied head, no biases), 4 layers
    x 96 wide. GPT-2's block is `configs/model/tiny.yaml`.
    """

    n_layer: int = 4
    n_head: int = 3
    n_kv_head: int | None = 1  # None: same as n_head (plain multi-head attention); fewer: GQA
    n_embd: int = 96
    block_size: int = 128  # the longest context the model is trained on
    vocab_size: int | None = None  # None: taken from the tokenizer at build time
    pos_encoding: str = "rope"
    norm: str = "rmsnorm"
    norm_placement: str = "pre"
    norm_eps: float = 1e-5
    activation: str = "swiglu"
    ffn_mult: float = 4.0  # hidden width of the FFN = ffn_mult * n_embd (swiglu: 2/3 of that, rounded)
    attention: str = "sdpa"
    online_block_size: int = 64  # key/value block length of the `online` attention backend
    dropout: float = 0.0  # after embedding+PE, after W_O, after the FFN down projection
    attn_dropout: float = 0.0  # on the attention probabilities; off by default
    bias: bool = False
    tie_weights: bool = False
    rope_base: float = DEFAULT_ROPE_BASE
    # ablation switches: the defaults keep each piece; see the module docstring and ablation_warnings
    causal: bool = True  # false: no causal mask in training mode (eval and sampling stay causal)
    attn_scale: str = "sqrt"  # none: raw q·kᵀ scores, no 1/√D
    residual: bool = True  # false: blocks drop their skip path, x = Sublayer(...) instead of x + ...
    final_norm: bool = True  # false: pre-norm models feed the raw residual stream to the head (no ln_f)
    # technique switches: off by default; see the module docstring and docs/tricks.md
    qk_norm: bool = False  # RMS-normalise every head's queries and keys (learned gains) before the scores
    zero_init_proj: bool = False  # W_O and the FFN down projection start at zero: blocks start as identity
    value_embeds: bool = False  # each layer adds a token-indexed table to its values, through a learned gate
    smear: bool = False  # mix the previous token's embedding into each token's, through a learned gate
    bigram_embed: int = 0  # rows of a hashed (previous, current) token-pair table added to the embeddings
    logit_softcap: float = 0.0  # logits = cap * tanh(logits / cap); 0: off

    def __post_init__(self) -> None:
        self.validate()

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head if self.n_kv_head is not None else self.n_head

    @property
    def reads_previous_token(self) -> bool:
        """Whether a token's embedding also reads the token before it (smear, the bigram table)."""
        return self.smear or bool(self.bigram_embed)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def validate(self) -> None:
        """Raise a `UserError` naming the first invalid field and what is allowed."""
        for name in ("n_layer", "n_head", "n_embd", "block_size", "online_block_size"):
            if getattr(self, name) < 1:
                raise UserError(f"model.{name}={getattr(self, name)} must be at least 1")
        _check_choice("pos_encoding", self.pos_encoding, POS_ENCODINGS)
        _check_choice("norm", self.norm, NORMS)
        _check_choice("norm_placement", self.norm_placement, NORM_PLACEMENTS)
        _check_choice("activation", self.activation, ACTIVATIONS)
        _check_choice("attention", self.attention, ATTENTION_BACKENDS)
        _check_choice("attn_scale", self.attn_scale, ATTN_SCALES)
        if self.n_embd % self.n_head:
            lo = self.n_embd - self.n_embd % self.n_head
            raise UserError(
                f"model.n_embd={self.n_embd} must be divisible by model.n_head={self.n_head} "
                f"(try {lo} or {lo + self.n_head})"
            )
        if self.n_kv_head is not None and (self.n_kv_head < 1 or self.n_head % self.n_kv_head):
            raise UserError(
                f"model.n_kv_head={self.n_kv_head} must divide model.n_head={self.n_head} "
                "(or be null for plain multi-head attention)"
            )
        if self.pos_encoding == "rope" and self.head_dim % 2:
            raise UserError(
                f"model.pos_encoding=rope needs an even head size, got n_embd/n_head={self.head_dim}"
            )
        if self.pos_encoding == "sinusoidal" and self.n_embd % 2:
            raise UserError(f"model.pos_encoding=sinusoidal needs an even model.n_embd, got {self.n_embd}")
        for name in ("dropout", "attn_dropout"):
            p = getattr(self, name)
            if not 0.0 <= p < 1.0:
                raise UserError(f"model.{name}={p} must be in [0, 1)")
        if self.ffn_mult <= 0:
            raise UserError(f"model.ffn_mult={self.ffn_mult} must be positive")
        if self.vocab_size is not None and self.vocab_size < 2:
            raise UserError(
                f"model.vocab_size={self.vocab_size} must be at least 2 (or null: from the tokenizer)"
            )
        if self.rope_base <= 1:
            raise UserError(f"model.rope_base={self.rope_base} must be greater than 1 (10000 is usual)")
        if self.norm_eps <= 0:
            raise UserError(f"model.norm_eps={self.norm_eps} must be positive")
        if self.bigram_embed < 0:
            raise UserError(f"model.bigram_embed={self.bigram_embed} must be >= 0 (table rows; 0: off)")
        if self.logit_softcap < 0:
            raise UserError(f"model.logit_softcap={self.logit_softcap} must be >= 0 (0: off; e.g. 15 or 30)")
        self._validate_ablations()

    def _validate_ablations(self) -> None:
        """Refuse switch combinations that would silently mean nothing."""
        if self.pos_encoding in ABLATION_POS_ENCODINGS and self.rope_base != DEFAULT_ROPE_BASE:
            raise UserError(
                f"model.rope_base={self.rope_base} has no effect with model.pos_encoding={self.pos_encoding} "
                "(it sets rotary frequencies: use pos_encoding=rope, or leave rope_base at "
                f"{DEFAULT_ROPE_BASE:g})"
            )
        if not self.final_norm and self.norm_placement == "post":
            raise UserError(
                "model.final_norm=false only applies to model.norm_placement=pre "
                "(post-norm blocks end in a norm of their own and have no final norm to remove)"
            )


def ablation_warnings(cfg: ModelConfig) -> list[str]:
    """One sentence per ablation switch that is on: what the model lacks and what to expect from it.

    Empty for every normal model. build_model logs them, joined on one line, whenever a model is built,
    so a run or a loaded checkpoint with an ablation is never mistaken for a normal one.
    """
    lines = []
    if not cfg.causal:
        lines.append(
            "model.causal=false: trained without the causal mask, so each position could see the next token "
            "and learned to copy it; evaluation and sampling are causal (a decoder cannot see tokens it has "
            "not produced yet), so expect a much higher val loss and poor samples"
        )
    if cfg.attn_scale == "none":
        lines.append(
            "model.attn_scale=none: attention scores are not divided by "
            f"sqrt(head size) = {cfg.head_dim ** 0.5:g}, so they grow with the head size and the softmax "
            "saturates towards one-hot rows, whose gradients vanish"
        )
    if cfg.pos_encoding == "integer":
        erased = cfg.norm == "layernorm" and cfg.norm_placement == "pre"
        lines.append(
            "model.pos_encoding=integer adds the raw position index (0 .. block_size-1) to every embedding "
            "channel: it dwarfs the token embeddings (~0.02), and a weight reading it gets gradients that "
            "grow with the position; an ablation, never a real choice"
            + ("; here pre-norm LayerNorm subtracts it as each token's mean, so the model gets no order "
               "from it at all" if erased else "")
        )
    if cfg.pos_encoding == "none":
        lines.append(
            "model.pos_encoding=none: no positional encoding; only the causal mask tells positions apart, "
            "and without it attention is blind to word order"
        )
    if not cfg.residual:
        lines.append(
            "model.residual=false: the blocks have no skip path, so every layer must carry the whole signal "
            "and gradients reach early layers only through every later sublayer"
        )
    if not cfg.final_norm:
        lines.append("model.final_norm=false: the raw residual stream, whose scale grows with depth, "
                     "goes straight to the output head")
    if cfg.norm == "batchnorm":
        lines.append(
            "model.norm=batchnorm normalises each channel over the batch's tokens: in training a token's "
            "output depends on the other sequences of its batch and on its own future (the batch mean "
            "includes later tokens), and in eval on running averages of the training batches instead"
        )
    return lines


def _check_choice(field: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise UserError(f"model.{field}={value!r} is not one of: {', '.join(allowed)}")
