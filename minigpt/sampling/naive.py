"""The deliberately simple reference generator: no cache, no padding, no batching tricks.

For every new token, every row's current window (the same rule as the cached generator, `sequences.py`) is
run through the full model on its own, and the last position's logits are stacked into a batch.
It is O(T^2) per token and exists to be obviously right: tests check that the KV-cached
generator produces the same logits and tokens, and `kv_cache=false` in generate.yaml runs it.

Sampling goes through the same `sample` call on the same (B, V) logits, so with the same seeded
generator both paths draw the same random numbers and pick the same tokens.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import torch

from minigpt.sampling.next_token import sample
from minigpt.sampling.params import SamplingParams
from minigpt.sampling.sequences import GenerationStats, Rows, Sampled, StopFn, default_keep, window_length


@torch.no_grad()
def naive_stream_tokens(
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
) -> Iterator[Sampled]:
    """Same interface and outputs as `decode.stream_tokens`, recomputing everything for every token."""
    block_size = model.config.block_size
    keep = default_keep(block_size) if keep is None else keep
    rows = Rows(prompts, stop_ids, stop_fn)
    stats = stats if stats is not None else GenerationStats()
    stats.batch_size = len(prompts)
    stats.prompt_tokens = sum(len(p) for p in prompts)
    device = next(model.parameters()).device
    for i in range(max_new_tokens):
        start = time.perf_counter()
        last = []
        for seq in rows.seqs:
            window = seq[len(seq) - window_length(len(seq), block_size, keep) :]
            idx = torch.tensor([window], dtype=torch.long, device=device)  # (1, T)
            logits, _ = model(idx, last_only=True)  # (1, 1, V): the whole window again, no cache
            last.append(logits[0, -1])
        logits = torch.stack(last)  # (B, V)
        emitted = rows.record(sample(logits, params, generator).tolist())
        stats.new_tokens += sum(t is not None for t in emitted)
        if i == 0:
            stats.prefill_s += time.perf_counter() - start
        else:
            stats.decode_s += time.perf_counter() - start
            stats.decoded_per_row += 1
        yield Sampled(emitted, list(rows.done), logits)
        if rows.all_done:
            return
