"""Why the skip path: it carries the gradient back to the early layers.

Without `x +`, the gradient of the first block has to pass through every later sublayer; within a few dozen
steps of training it is orders of magnitude smaller than the last block's, and the stack stops learning.
"""

from __future__ import annotations

import pytest
import torch
from model_helpers import fit, tiny_config, walk_batch

from minigpt.model.factory import build_model


def first_to_last_gradient(residual: bool, seed: int = 0, steps: int = 50) -> float:
    """A 6-layer model trained `steps` steps on walks; then the gradient norm of the first block's parameters
    over the last block's, for one more batch."""
    torch.manual_seed(seed)
    model = build_model(tiny_config(n_layer=6, n_head=4, n_embd=32, block_size=32, vocab_size=16,
                                    pos_encoding="rope", residual=residual))
    batch = lambda step: walk_batch(16, seed=1000 + step + 10**5 * seed)  # noqa: E731
    fit(model, batch, steps, lr=3e-3)
    model.zero_grad()
    model(*batch(steps))[1].backward()
    norms = [torch.cat([p.grad.flatten() for p in b.parameters()]).norm() for b in model.transformer.h]
    return (norms[0] / norms[-1]).item()


@pytest.mark.slow
def test_without_the_skip_path_the_first_blocks_gradient_collapses():
    """Margins: over seeds 0-9 the ratio was 2.9 to 10.8 with the skip path and 5e-7 to 0.038 without (seven
    seeds below 1e-4; the lowest quotient of the two, 110)."""
    with_skip, without = first_to_last_gradient(True), first_to_last_gradient(False)
    print(f"\nfirst / last block gradient norm after 50 steps: with the skip path {with_skip:.3g}, "
          f"without {without:.3g}")
    assert with_skip > 1.0  # the early blocks learn as fast as the late ones ...
    assert without < 0.1 and without < with_skip / 50  # ... and without the skip path they barely learn
