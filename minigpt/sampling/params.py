"""The sampling knobs as one small value, and their validation (no torch: config schemas use this module)."""

from __future__ import annotations

from dataclasses import dataclass

from minigpt.errors import UserError


@dataclass(frozen=True)
class SamplingParams:
    """How to pick a token from logits (`next_token.py`). Defaults: plain sampling at T = 1, no filters."""

    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    # Sample only ids below this: a model's vocabulary may be padded past the tokenizer's (e.g.
    # 50257 -> 50304 for faster matmuls), and those extra ids decode to nothing.
    vocab_size: int | None = None

    def __post_init__(self) -> None:
        validate_sampling(self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def validate_sampling(temperature: float, top_k: int, top_p: float) -> None:
    """Raise a `UserError` for a knob outside its range (names use the YAML keys of generate.yaml)."""
    if not temperature >= 0.0:  # also rejects NaN
        raise UserError(f"temperature={temperature} must be >= 0 (0 means greedy decoding)")
    if top_k < 0:
        raise UserError(f"top_k={top_k} must be >= 0 (0 turns the top-k filter off)")
    if not 0.0 < top_p <= 1.0:
        raise UserError(f"top_p={top_p} must be in (0, 1] (1 turns the nucleus filter off)")
