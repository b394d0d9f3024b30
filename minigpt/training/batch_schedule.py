"""The shape of each step's batch: batch-size warmup and sequence-length warmup, both off by default.

**Batch-size warmup** (`trainer.batch_warmup_steps=W`, `trainer.batch_warmup_start=b0`): step s (0-based)
draws

    b(s) = b0 + floor((B - b0) · s / W)   sequences per micro-batch for s < W,   B = trainer.batch_size after,

so the first steps take more updates out of fewer tokens. Early in training the gradient's direction is
clear from a few sequences (the critical batch size grows as the loss falls: McCandlish et al., 2018), so
those steps lose little to their noise; GPT-3 grew its batch over its first billions of tokens. A step of b
sequences is b/B of a full step's tokens and FLOPs: compare such a run with others at a budget of tokens or
FLOPs (`trainer.max_tokens`, `trainer.max_flops`), not of steps, which it would end short of.

**Sequence-length warmup** (`trainer.seq_len_warmup_steps=W`, `trainer.seq_len_warmup_start=t0`): each
T-token window the loader draws (T = model.block_size) is cut into T/t windows of

    t(s) = t0 · 2^floor(log2(T / t0) · s / W)   tokens for s < W,   T after,

the context doubling at evenly spaced steps (16, 32, 64, then 128 for t0 = 16, T = 128). A step trains on
the same tokens either way, only each target sees at most t(s) - 1 tokens before it: a young model cannot
use long contexts yet, and short windows put more of its targets near the start of a window, where there is
little to attend to (Li et al., 2022, "The stability-efficiency dilemma"). T / t0 must be a power of two,
so every length divides T and no token is dropped. The FLOPs count stays the full context's (attention is a
few percent of it here).

Both are pure functions of the step number, which every checkpoint saves: a resumed run continues the exact
same sequence of shapes (the loader's own replay uses `sequences` too, data/loader.py).
"""

from __future__ import annotations

import torch

from minigpt.training.config import TrainerConfig


class BatchSchedule:
    """Sequences per micro-batch and context length of every step, and the tokens each step trains on."""

    def __init__(self, tc: TrainerConfig, block_size: int, grad_accum_steps: int, world_size: int) -> None:
        self.batch_size, self.block_size = tc.batch_size, block_size
        self.batch_steps, self.batch_start = tc.batch_warmup_steps, tc.batch_warmup_start
        self.seq_steps, self.seq_start = tc.seq_len_warmup_steps, tc.seq_len_warmup_start
        self.micro_per_step = grad_accum_steps * world_size  # micro-batches of one step, all ranks

    def describe(self) -> str | None:
        """The log line of the warmups that are on, or None."""
        parts = []
        if self.batch_steps:
            parts.append(f"batch-size warmup from {self.batch_start} to {self.batch_size} sequences over "
                         f"{self.batch_steps} steps")
        if self.seq_steps:
            parts.append(f"sequence-length warmup from {self.seq_start} to {self.block_size} tokens over "
                         f"{self.seq_steps} steps")
        return "; ".join(parts) or None

    def sequences(self, step: int) -> int:
        """b(step): sequences per micro-batch (see the module docstring)."""
        if step >= self.batch_steps:
            return self.batch_size
        return self.batch_start + (self.batch_size - self.batch_start) * step // self.batch_steps

    def seq_len(self, step: int) -> int:
        """t(step): the context length the step trains with (see the module docstring)."""
        if step >= self.seq_steps:
            return self.block_size
        k = (self.block_size // self.seq_start).bit_length() - 1  # log2(T / t0), a whole number
        return self.seq_start * 2 ** (k * step // self.seq_steps)

    def tokens(self, step: int) -> int:
        """Tokens step `step` trains on, over every micro-batch and rank."""
        return self.sequences(step) * self.block_size * self.micro_per_step

    def warmup_tokens(self) -> tuple[int, ...]:
        """The tokens of each step of the batch-size warmup (empty without one): what `Budget` needs to
        tell the step a token budget ends at."""
        return tuple(self.tokens(s) for s in range(self.batch_steps))

    def cut(self, x: torch.Tensor, y: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets (b, T) -> (b · T / t, t) each, t = seq_len(step): every window cut into
        consecutive pieces, each target still the token after its input."""
        t = self.seq_len(step)
        if t == x.shape[1]:
            return x, y
        return x.reshape(-1, t), y.reshape(-1, t)  # (b · T / t, t): row-major, so pieces stay in order
