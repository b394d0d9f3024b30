"""Turning the last position's logits into the next token: temperature, top-k, top-p, a seeded draw.

The filters compose in a fixed order, each on the output of the one before:

    logits (B, V) -> temperature -> top-k -> top-p -> probabilities -> one uniform per row -> token (B,)

- **Temperature** divides (logits - max) by T. Subtracting the row maximum first changes nothing
  mathematically (softmax is shift-invariant) but keeps exp() from overflowing when T is small.
  T -> 0 collapses the distribution onto the argmax, so T = 0 *is* greedy decoding (no division);
  T -> infinity flattens it towards uniform.
- **Top-k** keeps the k most likely tokens (exactly k: ties are broken by `torch.topk`'s order).
- **Top-p** (nucleus) keeps the smallest set of most likely tokens whose mass reaches p.

The draw uses inverse-CDF sampling with one uniform number per row from an explicit
`torch.Generator`, never the global RNG. One uniform per row per step, whatever the logits, means
two decoding paths (cached and uncached) that see the same logits consume the generator
identically and pick the same tokens; a filtered-out token has a zero-width CDF interval and can
never be drawn.
"""

from __future__ import annotations

import torch

from minigpt.sampling.params import SamplingParams


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """(logits - max) / T over the last dimension; T must be > 0 (T = 0 is handled as argmax)."""
    shifted = logits - logits.amax(dim=-1, keepdim=True)  # the max becomes 0: exp() stays <= 1
    return shifted / temperature


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Set all but the k largest logits per row to -inf. k = 0 or k >= V leaves the logits unchanged."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    values, indices = torch.topk(logits, k, dim=-1)  # (B, k)
    # Scatter the survivors into a -inf tensor rather than thresholding at the k-th value, so ties
    # at the threshold cannot let more than k tokens through.
    return torch.full_like(logits, float("-inf")).scatter(-1, indices, values)


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability mass reaches p; -inf elsewhere."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V)
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs  # (B, V) mass of the strictly more likely tokens
    # A token is needed while the tokens before it still fall short of p; the first always is.
    drop_sorted = mass_before >= p
    drop_sorted[..., 0] = False
    drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def filtered_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p, in fp32. Not for T = 0 (greedy has nothing to filter)."""
    x = apply_temperature(logits.float(), params.temperature)
    x = top_k_filter(x, params.top_k)
    return top_p_filter(x, params.top_p)


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """(..., V) -> (...) int64: the most likely token, the first of equal maxima. 16-bit logits are compared
    as float32, which holds every one of them exactly, so the order is theirs: PyTorch's argmax walks 16-bit
    values one by one, several times slower than its vectorised float32 one."""
    return logits.float().argmax(dim=-1)


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution `sample` draws from, (..., V). At T = 0: one-hot on the argmax."""
    if params.vocab_size is not None:
        logits = logits[..., : params.vocab_size]  # (..., V')
    if params.greedy:
        return torch.nn.functional.one_hot(greedy(logits), logits.shape[-1]).float()
    return torch.softmax(filtered_logits(logits, params), dim=-1)


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> torch.Tensor:
    """Draw one token per row: logits (B, V) -> token ids (B,) int64.

    Always consumes exactly B uniforms from `generator` (even when greedy), so the random stream
    does not depend on the knobs' values or on how the logits were computed.
    """
    u = torch.rand(logits.shape[0], 1, generator=generator, device=logits.device)  # (B, 1)
    if params.vocab_size is not None:
        logits = logits[:, : params.vocab_size]  # (B, V')
    if params.greedy:
        return greedy(logits)
    return draw(torch.softmax(filtered_logits(logits, params), dim=-1), u)  # (B,)


def draw(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: weights (B, V) >= 0, not necessarily normalised, and uniforms u (B, 1) in [0, 1) ->
    token ids (B,), token i with probability weights[i] / sum(weights). A zero-weight token is never drawn."""
    cdf = torch.cumsum(weights, dim=-1)  # (B, V)
    # The first token whose CDF exceeds u * total; scaling by the total absorbs rounding in the sum.
    idx = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_(max=weights.shape[-1] - 1)  # (B, 1)
    # u * total can round up to the total itself (u just below 1), which would land past the last
    # token with mass; fall back to the argmax then, so a zero-weight token is never returned.
    ok = weights.gather(-1, idx) > 0  # (B, 1)
    return torch.where(ok, idx, weights.argmax(dim=-1, keepdim=True)).squeeze(1)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats over the last dimension; 0 * log 0 counts as 0."""
    logp = torch.log(probs.clamp_min(torch.finfo(probs.dtype).tiny))
    return -(probs * logp).sum(dim=-1)
