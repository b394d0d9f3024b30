"""An interactive session: one growing conversation whose KV cache is kept between turns.

Each turn appends the user's tokens to the history and feeds only those (plus the model's last
sampled token, which had not been fed yet) through the model: everything earlier is already in
the cache. The reply is then decoded token by token as in `sampling/decode.py`, through the same
decode step (the model's own, or the one the generate command hands in).

The context follows the same window rule as the generator (`sampling/sequences.py`): the window length is a
function of the history length alone. Feeding k tokens normally grows the window by k; when the
rule says otherwise the window has filled up, and the cache is rebuilt from the most recent
tokens (a re-prefill, reported through `on_rebuild`). So a session's reply is exactly what a fresh
generation from the whole history as one prompt would produce.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch

from minigpt.sampling.decode import DecodeFn, own_step, prefill_windows
from minigpt.sampling.next_token import sample
from minigpt.sampling.params import SamplingParams
from minigpt.sampling.sequences import StopFn, default_keep, window_length


class Session:
    """history: every token seen or sampled so far; the cache holds its last `width` tokens."""

    def __init__(
        self,
        model: torch.nn.Module,
        params: SamplingParams,
        generator: torch.Generator,
        *,
        stop_ids: Sequence[int] = (),
        stop_fn: StopFn | None = None,
        keep: int | None = None,
        on_rebuild: Callable[[int], None] | None = None,
        step: DecodeFn | None = None,
    ):
        self.model, self.params, self.generator = model, params, generator
        self.step = own_step(model) if step is None else step  # the forward of each turn's new tokens
        self.block_size = model.config.block_size
        self.keep = default_keep(self.block_size) if keep is None else keep
        self.stop_ids = frozenset(stop_ids)
        self.stop_fn = stop_fn
        self.on_rebuild = on_rebuild  # called with the rebuilt window's length
        self.cache = model.new_kv_cache(1, max_len=self.block_size)
        self.history: list[int] = []
        self.pending = 0  # trailing history tokens not fed yet (the last sampled one)
        self.width = 0  # history tokens in the cache
        self.prefilled_tokens = 0  # tokens run through the model so far, rebuilds included
        self.rebuilds = 0
        self.last_prefill = 0  # tokens the latest turn's prefill ran (new tokens only, unless it rebuilt)

    @torch.no_grad()
    def _feed(self, new: list[int]) -> torch.Tensor:
        """Append `new` to the history and run every unfed token; return the next-token logits (1, V)."""
        self.history.extend(new)
        n_feed = self.pending + len(new)
        self.pending = 0
        width = window_length(len(self.history), self.block_size, self.keep)
        if width == self.width + n_feed:  # the window just grows: feed only the new tokens
            new = self.history[len(self.history) - n_feed :]
            idx = torch.tensor([new], device=self.cache.device)  # (1, T)
            logits = self.step(idx, self.cache)[:, -1]  # (1, V)
            self.prefilled_tokens += n_feed
        else:  # the window is full: rebuild the cache from the most recent `width` tokens
            logits = prefill_windows(self.model, self.cache, [self.history[len(self.history) - width :]])
            self.prefilled_tokens += width
            self.rebuilds += 1
            if self.on_rebuild is not None:
                self.on_rebuild(width)
        self.width = width
        return logits

    def turn(self, prompt_ids: Sequence[int], max_new_tokens: int) -> Iterator[int]:
        """Append the user's tokens, then yield the reply's tokens one by one (stop token excluded)."""
        if not prompt_ids:
            raise ValueError("a turn needs at least one token")
        if max_new_tokens <= 0:
            self.history.extend(prompt_ids)  # nothing to generate: the tokens wait for the next turn
            self.pending += len(prompt_ids)
            return
        before = self.prefilled_tokens
        logits = self._feed(list(prompt_ids))
        self.last_prefill = self.prefilled_tokens - before
        reply: list[int] = []
        for i in range(max_new_tokens):
            token = sample(logits, self.params, self.generator).item()  # the step's one host sync
            self.history.append(token)
            self.pending = 1
            if token in self.stop_ids:
                return
            reply.append(token)
            yield token
            if (self.stop_fn is not None and self.stop_fn(0, reply)) or i == max_new_tokens - 1:
                return
            logits = self._feed([])
