"""The sliding-window rule: what the model sees once a sequence outgrows its context.

A model trained on `block_size` tokens has no positions beyond that, so a longer sequence is
generated from its most recent tokens only. Rebuilding the context every step would throw the KV
cache away; instead the cache fills up to `block_size` slots and, when the next token would not
fit, it is rebuilt ("re-prefilled") from the last `keep` tokens, which then grow again to
`block_size`. Window positions restart at 0 on each rebuild, so this works the same for learned,
sinusoidal and rotary positions.

The window length is a function of the sequence length n alone:

    n <= block_size:  w(n) = n
    n >  block_size:  w(n) = keep + (n - block_size - 1) mod (block_size - keep + 1)

so the window climbs keep, keep + 1, ..., block_size and drops back to keep. Because it depends
only on n, the cached generator, the naive reference and an interactive session that feeds a whole
turn at once all see exactly the same context for every token, and a long prompt is cut the same
way wherever it comes from. keep = block_size is a pure sliding window (a rebuild every step);
the default keep = block_size // 2 rebuilds once every block_size // 2 + 1 tokens.
"""

from __future__ import annotations

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
