"""The model's configuration: one dataclass, validated before any tensor is allocated."""

from __future__ import annotations

from dataclasses import dataclass

from minigpt.errors import UserError

POS_ENCODINGS = ("sinusoidal", "learned", "rope")
NORMS = ("layernorm", "rmsnorm")
NORM_PLACEMENTS = ("pre", "post")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swiglu")
ATTENTION_BACKENDS = ("math", "sdpa", "online")


@dataclass
class ModelConfig:
    """Every architectural choice of a GPT-style decoder. YAML: `configs/model/*.yaml`."""

    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int | None = None  # None: same as n_head (plain multi-head attention); fewer: GQA
    n_embd: int = 128
    block_size: int = 128  # the longest context the model is trained on
    vocab_size: int | None = None  # None: taken from the tokenizer at build time
    pos_encoding: str = "learned"
    norm: str = "layernorm"
    norm_placement: str = "pre"
    norm_eps: float = 1e-5
    activation: str = "gelu"
    ffn_mult: float = 4.0  # hidden width of the FFN = ffn_mult * n_embd (swiglu: 2/3 of that, rounded)
    attention: str = "sdpa"
    online_block_size: int = 64  # key/value block length of the `online` attention backend
    dropout: float = 0.0  # after embedding+PE, after W_O, after the FFN down projection
    attn_dropout: float = 0.0  # on the attention probabilities; off by default
    bias: bool = True
    tie_weights: bool = True
    rope_base: float = 10000.0

    def __post_init__(self) -> None:
        self.validate()

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head if self.n_kv_head is not None else self.n_head

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


def _check_choice(field: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise UserError(f"model.{field}={value!r} is not one of: {', '.join(allowed)}")
