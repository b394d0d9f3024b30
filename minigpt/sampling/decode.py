"""KV-cached generation: one prefill over the prompts, then one token per decode step.

    prefill   the prompt windows (B, T) -> forward once, filling every layer's K/V cache
    decode    the last sampled tokens (B, 1) -> forward; each query attends to all cached K/V,
              and its own K/V are written into the next cache slot (`decode_forward`: one decode step)

Only the last position is projected to the vocabulary (`last_only=True`): the (B, T, V) logits of
a prompt would be computed and thrown away.

Prompts of different lengths share one batch through left padding: row b's window is
right-aligned and `cache.set_padding` tells the model to give it positions 0, 1, ... and to
mask the padding, so each row sees exactly what it would see alone.

When a sequence outgrows the model's context, the cache is rebuilt from the most recent tokens
(see `sequences.py` for the rule). If any row needs a rebuild, the whole batch is re-prefilled,
each row from its own window; for the other rows that window is just their current context.

A step costs one host sync: the sampled tokens come back as a Python list for the stop checks.
The model must be in eval mode (dropout off) for the tokens to be reproducible.

A loop takes its decode step as a function (`DecodeFn`): the model's own (`own_step`) unless the caller
hands in another that gives the same logits (the generate command hands in the fastest one this machine
has, `minigpt/fast/`, which checks that before using it).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Sequence

import torch

from minigpt.model.kv_cache import KVCache
from minigpt.sampling.naive import naive_stream_tokens
from minigpt.sampling.next_token import sample
from minigpt.sampling.params import SamplingParams
from minigpt.sampling.sequences import (
    GenerationResult,
    GenerationStats,
    Rows,
    Sampled,
    StopFn,
    default_keep,
    window_length,
)

# Token id written into the padding slots: any valid id works, the mask hides it.
PAD_ID = 0


def decode_forward(model: torch.nn.Module, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """One decode step: the newest tokens (B, T) fed on top of `cache` -> their logits (B, T, V); the cache
    grows by T. T is 1 here; speculative decoding verifies several drafted tokens at once."""
    return model(tokens, kv_cache=cache)[0]


# A decode step with its model bound (`own_step`), or another function that gives its logits
DecodeFn = Callable[[torch.Tensor, KVCache], torch.Tensor]


def own_step(model: torch.nn.Module) -> DecodeFn:
    """`model`'s own decode step: `decode_forward` with `model` bound."""
    return functools.partial(decode_forward, model)


def prefill_windows(model: torch.nn.Module, cache: KVCache, windows: list[list[int]]) -> torch.Tensor:
    """Reset `cache` and fill it with the left-padded `windows`; return the last logits (B, V)."""
    t = max(len(w) for w in windows)
    idx = torch.tensor([[PAD_ID] * (t - len(w)) + w for w in windows], dtype=torch.long)  # (B, T)
    pad = torch.tensor([t - len(w) for w in windows], dtype=torch.long)  # (B,)
    cache.reset()
    cache.set_padding(pad)
    logits, _ = model(idx.to(cache.device), kv_cache=cache, last_only=True)  # (B, 1, V)
    return logits[:, -1]


def prefill(model: torch.nn.Module, windows: list[list[int]]) -> tuple[KVCache, torch.Tensor]:
    """A new cache of the model's whole context filled with the left-padded `windows` (B rows); and the last
    logits (B, V)."""
    cache = model.new_kv_cache(len(windows))
    return cache, prefill_windows(model, cache, windows)


@torch.no_grad()
def stream_tokens(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    params: SamplingParams,
    generator: torch.Generator,
    stop_ids: Sequence[int] = (),
    stop_fn: StopFn | None = None,
    keep: int | None = None,
    stats: GenerationStats | None = None,
    step: DecodeFn | None = None,
) -> Iterator[Sampled]:
    """Generate up to `max_new_tokens` per row with the KV cache, yielding every new token of every row.

    prompts: B lists of token ids (each non-empty). Ends early once every row has stopped.
    keep: tokens kept when the window is rebuilt (default block_size // 2, see `sequences.py`).
    step: the decode step (default `own_step(model)`); prefills are always `model`'s own forward.
    """
    step = own_step(model) if step is None else step
    block_size = model.config.block_size
    keep = default_keep(block_size) if keep is None else keep
    rows = Rows(prompts, stop_ids, stop_fn)
    stats = stats if stats is not None else GenerationStats()
    stats.batch_size = len(prompts)
    stats.prompt_tokens = sum(len(p) for p in prompts)
    if max_new_tokens <= 0:
        return
    device = next(model.parameters()).device
    cache = model.new_kv_cache(len(prompts), max_len=block_size, device=device)

    start = time.perf_counter()
    widths = [window_length(len(s), block_size, keep) for s in rows.seqs]
    logits = prefill_windows(model, cache, [s[len(s) - w :] for s, w in zip(rows.seqs, widths, strict=True)])
    for i in range(max_new_tokens):
        tokens = sample(logits, params, generator)  # (B,)
        emitted = rows.record(tokens.tolist())  # the step's one host sync
        stats.new_tokens += sum(t is not None for t in emitted)
        elapsed = time.perf_counter() - start
        if i == 0:
            stats.prefill_s += elapsed
        else:
            stats.decode_s += elapsed
        yield Sampled(emitted, list(rows.done), logits)
        if rows.all_done or i == max_new_tokens - 1:
            return
        start = time.perf_counter()
        stats.decoded_per_row += 1
        new_widths = [window_length(len(s), block_size, keep) for s in rows.seqs]
        if all(nw == w + 1 for nw, w in zip(new_widths, widths, strict=True)):
            logits = step(tokens.view(-1, 1), cache)[:, -1]  # (B, V)
        else:  # some row's window is full: rebuild every row from its own window
            stats.reprefills += 1
            windows = [s[len(s) - w :] for s, w in zip(rows.seqs, new_widths, strict=True)]
            logits = prefill_windows(model, cache, windows)
        widths = new_widths


def generate(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    params: SamplingParams,
    generator: torch.Generator,
    stop_ids: Sequence[int] = (),
    stop_fn: StopFn | None = None,
    keep: int | None = None,
    use_cache: bool = True,
    keep_logits: bool = False,
    step: DecodeFn | None = None,
) -> GenerationResult:
    """Run `stream_tokens` (or, with use_cache=False, the naive reference) to the end and collect rows."""
    stats = GenerationStats()
    out: list[list[int]] = [[] for _ in prompts]
    logits: list[torch.Tensor] = []
    kwargs = dict(max_new_tokens=max_new_tokens, params=params, generator=generator, stop_ids=stop_ids,
                  stop_fn=stop_fn, keep=keep, stats=stats)
    if use_cache:
        stream = stream_tokens(model, prompts, step=step, **kwargs)
    elif step is not None:
        raise ValueError("the naive reference has no cache to decode on; pass step=None with use_cache=False")
    else:
        stream = naive_stream_tokens(model, prompts, **kwargs)
    for sampled in stream:
        for b, t in enumerate(sampled.emitted):
            if t is not None:
                out[b].append(t)
        if keep_logits:
            logits.append(sampled.logits)
    return GenerationResult(out, stats, logits)


def sample_text(
    model: torch.nn.Module, tokenizer, prompt: str, max_new_tokens: int, temperature: float, seed: int
) -> str:
    """A short continuation of `prompt` (or of a document start when empty), for eyeballing progress.

    The trainer calls this at every evaluation. Uses the KV-cached generator with its own seeded
    `torch.Generator`, never the global RNG, so sampling during training cannot change the training run;
    the model's mode is restored afterwards.
    """
    was_training = model.training
    model.eval()
    ids = tokenizer.encode(prompt) if prompt else [tokenizer.eot_id]
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    try:
        # the tokenizer's vocabulary: a model's may be padded past it, and those ids decode to nothing
        params = SamplingParams(temperature, vocab_size=tokenizer.vocab_size)
        result = generate(model, [ids], max_new_tokens=max_new_tokens, params=params, generator=gen,
                          stop_ids=[tokenizer.eot_id])  # the end of a document ends it
    finally:
        model.train(was_training)
    return prompt + tokenizer.decode(result.tokens[0])
