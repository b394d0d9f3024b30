"""What the decoding loops hand back: one `Step` per sampled token, counts and timings, collected results.

Shared by the KV-cached loop (`decode.py`) and its naive reference (`naive.py`), which must yield the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Step:
    """One decoding step: what each row emitted (None once finished) and the logits it came from."""

    emitted: list[int | None]
    done: list[bool]
    logits: torch.Tensor  # (B, V) the last position's logits the tokens were sampled from


@dataclass
class GenerationStats:
    """Counts and timings for the summary line; the loop fills them as it runs."""

    batch_size: int = 0
    prompt_tokens: int = 0  # summed over rows
    new_tokens: int = 0  # emitted tokens, summed over rows (stop tokens excluded)
    prefill_s: float = 0.0  # the first forward and the first sampled token
    decode_s: float = 0.0  # everything after it, rebuilds included
    decode_steps: int = 0  # decode forwards (rebuilds count as one)
    reprefills: int = 0  # cache rebuilds after the window filled up

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_steps * self.batch_size / self.decode_s if self.decode_s > 0 else 0.0

    def summary(self) -> str:
        return (
            f"prompt tokens: {self.prompt_tokens} | new tokens: {self.new_tokens} | "
            f"prefill: {self.prefill_s * 1e3:.1f} ms | decode: {self.decode_tokens_per_s:.1f} tokens/s"
            + (f" | window rebuilds: {self.reprefills}" if self.reprefills else "")
        )


@dataclass
class GenerationResult:
    tokens: list[list[int]]  # per row: the generated ids, stop token excluded
    stats: GenerationStats
    logits: list[torch.Tensor] = field(default_factory=list)  # per step (B, V), when asked for
