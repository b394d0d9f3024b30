"""What the decoding loops share: the window each row sees, when a row stops, and what each new token yields.

The cached loop (`decode.py`) and its naive reference (`naive.py`) both run on these, so they see the same
context, stop at the same tokens and hand back the same `Sampled` records.

**The sliding window.** A model trained on `block_size` tokens has no positions beyond that, so a longer
sequence is generated from its most recent tokens only. Rebuilding the context every step would throw the
KV cache away; instead the cache fills up to `block_size` slots and, when the next token would not fit, it
is rebuilt ("re-prefilled") from the last `keep` tokens, which then grow again to `block_size`. Window
positions restart at 0 on each rebuild, so this works the same for learned, sinusoidal and rotary
positions. The window length is a function of the sequence length n alone:

    n <= block_size:  w(n) = n
    n >  block_size:  w(n) = keep + (n - block_size - 1) mod (block_size - keep + 1)

so the window climbs keep, keep + 1, ..., block_size and drops back to keep. Because it depends only on n,
the cached generator, the naive reference and an interactive session that feeds a whole turn at once all
see exactly the same context for every token, and a long prompt is cut the same way wherever it comes
from. keep = block_size is a pure sliding window (a rebuild every step); the default keep = block_size // 2
rebuilds once every block_size // 2 + 1 tokens.

**Stopping.** A row is done at an end-of-text token, a stop string, or its token budget. Rows of a batch
finish at different tokens; a finished row keeps being fed its sampled tokens (the batch decodes in
lockstep) but nothing more is recorded for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from minigpt.errors import UserError


def default_keep(block_size: int, keep_ratio: float = 0.5) -> int:
    """Tokens kept on a rebuild: `keep_ratio` of the context, at least 1."""
    if not 0.0 < keep_ratio <= 1.0:
        raise UserError(f"window_keep_ratio={keep_ratio} must be in (0, 1]")
    return max(1, int(block_size * keep_ratio))


def window_length(n: int, block_size: int, keep: int) -> int:
    """How many of the last tokens of an n-token sequence the model sees when predicting token n."""
    if not 1 <= keep <= block_size:
        raise ValueError(f"keep={keep} must be in [1, block_size={block_size}]")
    if n <= block_size:
        return n
    return keep + (n - block_size - 1) % (block_size - keep + 1)


# ----------------------------------------------------------------------------------------- stopping


# A stop test: (row, that row's generated ids so far) -> stop now?
StopFn = Callable[[int, list[int]], bool]


class Rows:
    """Full sequences (prompt + everything fed), generated outputs and done flags, one per row."""

    def __init__(
        self, prompts: Sequence[Sequence[int]], stop_ids: Iterable[int] = (), stop_fn: StopFn | None = None
    ):
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token (start an unconditional sample from eot)")
        self.seqs = [list(p) for p in prompts]
        self.out: list[list[int]] = [[] for _ in prompts]
        self.done = [False] * len(prompts)
        self.stop_ids = frozenset(stop_ids)
        self.stop_fn = stop_fn

    def record(self, tokens: list[int]) -> list[int | None]:
        """Append one sampled token per row; return what each row emits (None: finished or a stop token)."""
        emitted: list[int | None] = []
        for b, t in enumerate(tokens):
            self.seqs[b].append(t)
            if self.done[b] or t in self.stop_ids:
                self.done[b] = True
                emitted.append(None)
                continue
            self.out[b].append(t)
            emitted.append(t)
            if self.stop_fn is not None and self.stop_fn(b, self.out[b]):
                self.done[b] = True
        return emitted

    @property
    def all_done(self) -> bool:
        return all(self.done)


class StopStrings:
    """A stop test on decoded text: a row stops once its generated text contains any of `strings`.

    The token that completes a stop string stays in the ids (it may carry text before the stop
    string too); `cut` removes the stop string and anything after it from the final text.
    """

    def __init__(self, strings: Sequence[str], decode: Callable[[list[int]], str]):
        self.strings = [s for s in strings if s]
        self.decode = decode
        self.max_len = max((len(s) for s in self.strings), default=0)
        # A stop string is completed by the newest token, so only a tail of the ids needs decoding:
        # a character is at most 4 UTF-8 bytes and a token at least one byte.
        self.tail = 4 * self.max_len + 1

    def __bool__(self) -> bool:
        return bool(self.strings)

    def __call__(self, row: int, ids: list[int]) -> bool:
        text = self.decode(ids[-self.tail :])
        return any(s in text for s in self.strings)

    def cut(self, text: str) -> str:
        """`text` up to the first stop string it contains."""
        ends = [i for i in (text.find(s) for s in self.strings) if i >= 0]
        return text[: min(ends)] if ends else text

    def holdback(self) -> int:
        """Characters a streamer must hold back: they may be the start of a stop string."""
        return max(self.max_len - 1, 0)


# ------------------------------------------------------------------------------------ sampled tokens


@dataclass
class Sampled:
    """One new token per row: what each row emitted (None once finished) and the logits it was drawn from."""

    emitted: list[int | None]
    done: list[bool]
    logits: torch.Tensor  # (B, V) the last position's logits the tokens were sampled from


@dataclass
class GenerationStats:
    """Counts and seconds for the summary line; the loop fills them as it runs."""

    batch_size: int = 0
    prompt_tokens: int = 0  # summed over rows
    new_tokens: int = 0  # emitted tokens, summed over rows (stop tokens excluded)
    prefill_s: float = 0.0  # the first forward and the first sampled token
    decode_s: float = 0.0  # everything after it, rebuilds included
    decoded_per_row: int = 0  # tokens per row decoded after the first (one decode step each, without a draft)
    reprefills: int = 0  # cache rebuilds after the window filled up
    drafted: int = 0  # speculative decoding: tokens the draft proposed
    accepted: int = 0  # ... and the model accepted
    rounds: int = 0  # ... in this many forwards of the model, each emitting accepted + 1 tokens
    compile_s: float = 0.0  # compiling the decode steps (compile=true), done before the prompt's prefill

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decoded_per_row * self.batch_size / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def summary(self) -> str:
        speculative = ""
        if self.rounds:
            speculative = (f" | drafts accepted: {self.acceptance_rate:.0%} of {self.drafted}, "
                           f"{(self.accepted + self.rounds) / self.rounds:.2f} tokens per forward")
        return (
            f"prompt tokens: {self.prompt_tokens} | new tokens: {self.new_tokens} | "
            f"prefill: {self.prefill_s * 1e3:.1f} ms | decode: {self.decode_tokens_per_s:.1f} tokens/s"
            + (f" | window rebuilds: {self.reprefills}" if self.reprefills else "") + speculative
            + (f" | compiled in {self.compile_s:.1f} s" if self.compile_s else "")
        )


@dataclass
class GenerationResult:
    tokens: list[list[int]]  # per row: the generated ids, stop token excluded
    stats: GenerationStats
    logits: list[torch.Tensor] = field(default_factory=list)  # per new token (B, V), when asked for
