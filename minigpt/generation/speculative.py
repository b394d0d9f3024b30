"""Speculative decoding: a small draft model proposes tokens, the model checks all of them in one forward.

A decode step of a memory-bound model costs the time to read its weights, and scoring a few tokens in one
forward reads them once, as scoring one does. So a cheap draft proposes k = `num_draft_tokens` tokens and
the model scores them together. One round, after the n tokens seen so far:

    1. the draft proposes d_1 .. d_k, each drawn from its own distribution q_i given what precedes it
    2. one forward of the model over [token n-1, d_1, ..., d_k] gives p_0 .. p_k, p_i its distribution for
       the token after d_1 .. d_i
    3. in order, d_i is accepted with probability min(1, p_{i-1}(d_i) / q_i(d_i)); at the first rejection a
       token is drawn from the residual max(0, p_{i-1} - q_i) (renormalised) and the round ends; if all k are
       accepted, a bonus token is drawn from p_k

Each emitted token is then distributed exactly as the model's own sample (Leviathan et al. 2023; Chen et
al. 2023): the acceptance keeps min(p, q) of every token's mass and the residual supplies p - min(p, q).
p and q are the distributions `sample` draws from (temperature, top-k, top-p: `probabilities`); at T = 0
they are one-hot, a draft is accepted exactly when it is the model's argmax, and the output is the model's
greedy output token for token. A round emits between 1 and k + 1 tokens for one forward of the model.

Both models follow the window rule of `sampling/sequences.py` with their own context: the model's windows
are exactly the ones plain decoding gives each token (so a round verifies only as many drafts as fit before
its window would be rebuilt), the draft's only affect how often it is right. One prompt at a time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import torch

from minigpt.sampling.decode import DecodeFn, own_step
from minigpt.sampling.next_token import draw, probabilities, sample
from minigpt.sampling.params import SamplingParams
from minigpt.sampling.sequences import GenerationStats, Rows, Sampled, StopFn, default_keep, window_length


class Context:
    """One model's KV cache over a growing sequence: it holds the K/V of seq[start:fed], and what is scored
    next sees exactly its window (`window_length`), rebuilt from the sequence when the window moves on."""

    def __init__(self, model: torch.nn.Module, step: DecodeFn, keep: int | None = None):
        self.model, self.step = model, step
        self.block_size = model.config.block_size
        self.keep = default_keep(self.block_size) if keep is None else keep
        self.cache = model.new_kv_cache(1, max_len=self.block_size, device=next(model.parameters()).device)
        self.start = self.fed = 0
        self.rebuilds = 0

    def room(self, n: int) -> int:
        """How many tokens from token n on can be scored in one forward: while the window grows by one."""
        return self.block_size - window_length(n, self.block_size, self.keep) + 1

    @torch.no_grad()
    def logits(self, seq: Sequence[int], n: int, count: int) -> torch.Tensor:
        """The logits (count, V) predicting tokens n .. n + count - 1 of `seq`, each from its window of what
        precedes it. Needs count <= room(n) (all count windows must be one growing window)."""
        width = window_length(n, self.block_size, self.keep)
        if n - self.start != width:  # the window moved on: rebuild the cache from it
            self.cache.reset()
            self.start = self.fed = n - width
            self.rebuilds += 1
        if self.fed < n - 1:  # catch up on all but the last known token, projecting no logits
            idx = torch.tensor([seq[self.fed : n - 1]], device=self.cache.device)  # (1, T)
            self.model(idx, kv_cache=self.cache, last_only=True)
            self.fed = n - 1
        idx = torch.tensor([seq[n - 1 : n + count - 1]], device=self.cache.device)  # (1, count)
        self.fed = n + count - 1
        return self.step(idx, self.cache)[0]  # (count, V)

    def keep_first(self, n: int) -> None:
        """Forget every token from token n on (rejected drafts); their slots are overwritten later."""
        if n < self.start:  # the window moved past n during the round: nothing cached is kept
            self.cache.reset()
            self.start = self.fed = n
        elif n < self.fed:
            self.cache.rewind(self.cache.length - (self.fed - n))
            self.fed = n


def accept_or_resample(p: torch.Tensor, q: torch.Tensor, drafts: list[int],
                       generator: torch.Generator) -> tuple[int, int]:
    """The acceptance rule for one round: p (k+1, V) the model's and q (k, V) the draft's distributions,
    `drafts` the k proposed ids. Returns (accepted, token): the first `accepted` drafts stand, and `token`
    follows them (drawn from the residual at the first rejection, else the bonus from p[k])."""
    u = torch.rand(len(drafts), generator=generator, device=p.device)  # (k,)
    for i, d in enumerate(drafts):
        if u[i] * q[i, d] >= p[i, d]:  # rejected: u >= p/q, with no division by a zero q
            residual = (p[i] - q[i]).clamp(min=0)  # (V,)
            return i, int(draw(residual[None], torch.rand(1, 1, generator=generator, device=p.device)))
    return len(drafts), int(draw(p[-1:], torch.rand(1, 1, generator=generator, device=p.device)))


@torch.no_grad()
def speculative_stream_tokens(
    model: torch.nn.Module,
    draft: torch.nn.Module,
    prompt: Sequence[int],
    *,
    max_new_tokens: int,
    params: SamplingParams,
    generator: torch.Generator,
    num_draft_tokens: int,
    stop_ids: Sequence[int] = (),
    stop_fn: StopFn | None = None,
    keep: int | None = None,
    stats: GenerationStats | None = None,
    step: DecodeFn | None = None,
    draft_step: DecodeFn | None = None,
) -> Iterator[Sampled]:
    """Generate up to `max_new_tokens` after `prompt` with `draft` proposing `num_draft_tokens` per round;
    yields one Sampled per token, as `stream_tokens` does for a batch of one (its logits: the model's)."""
    if params.vocab_size is None and model.config.vocab_size != draft.config.vocab_size:
        raise ValueError("the draft and the model have different vocabularies; give params.vocab_size")
    rows = Rows([prompt], stop_ids, stop_fn)
    stats = stats if stats is not None else GenerationStats()
    stats.batch_size, stats.prompt_tokens = 1, len(prompt)
    target = Context(model, step or own_step(model), keep)
    proposer = Context(draft, draft_step or own_step(draft))
    generated = 0
    while generated < max_new_tokens and not rows.all_done:
        start, seq, n = time.perf_counter(), rows.seqs[0], len(rows.seqs[0])
        k = min(num_draft_tokens, target.room(n) - 1, max_new_tokens - generated - 1)
        drafts, q = [], []
        for i in range(k):
            logits = proposer.logits(seq + drafts, n + i, 1)  # (1, V)
            q.append(probabilities(logits, params)[0])
            drafts.append(int(sample(logits, params, generator)))
        p_logits = target.logits(seq + drafts, n, k + 1)  # (k+1, V)
        p = probabilities(p_logits, params)  # (k+1, V)
        accepted, token = accept_or_resample(p, torch.stack(q) if q else p[:0], drafts, generator)
        target.keep_first(n + accepted)
        proposer.keep_first(n + accepted)
        stats.rounds += 1
        stats.drafted += k
        stats.accepted += accepted
        emitted = drafts[:accepted] + [token]
        elapsed = time.perf_counter() - start
        if generated == 0:
            stats.prefill_s += elapsed
        else:
            stats.decode_s += elapsed
            stats.decoded_per_row += len(emitted)
        for i, t in enumerate(emitted):
            out = rows.record([t])
            stats.new_tokens += out[0] is not None
            generated += 1
            yield Sampled(out, list(rows.done), p_logits[i : i + 1])
            if rows.all_done:
                break
    stats.reprefills = target.rebuilds
