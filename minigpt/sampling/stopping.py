"""When a row of a batch is done: an end-of-text token, a stop string, or the token budget.

`Rows` is the per-row bookkeeping the cached loop and the naive reference share, so both apply the
same stopping rules. Rows of a batch finish at different steps; a finished row keeps being fed its
sampled tokens (the batch decodes in lockstep) but nothing more is recorded for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

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
