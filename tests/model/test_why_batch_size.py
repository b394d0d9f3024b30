"""Why a larger batch steadies the update: the loss is a mean over the batch, so the gradient of B independent
sequences is the mean of B independent gradients, and its variance falls as 1/B.
"""

from __future__ import annotations

import torch
from model_helpers import WALK_V, tiny_config, walk_batch

from minigpt.model.factory import build_model

BATCHES = 48  # independent batches per size


def gradient_variance(model: torch.nn.Module, batch_size: int, seed: int) -> float:
    """E||g - E g||^2 of the model's loss gradient over BATCHES batches of `batch_size` fresh walks."""
    grads = []
    for i in range(BATCHES):
        model.zero_grad()
        model(*walk_batch(batch_size, seed=seed + i))[1].backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    g = torch.stack(grads)  # (BATCHES, n_params)
    return ((g - g.mean(0)).pow(2).sum(1).sum() / (BATCHES - 1)).item()


def variances(seed: int = 0) -> dict[int, float]:
    torch.manual_seed(seed)
    model = build_model(tiny_config(n_layer=2, n_head=4, n_embd=32, block_size=32, vocab_size=WALK_V,
                                    pos_encoding="rope")).train()
    return {b: gradient_variance(model, b, seed=10**4 * b + 10**6 * seed) for b in (1, 4, 16)}


def test_the_gradients_variance_falls_as_one_over_the_batch_size():
    """1 if the variance falls exactly as 1/B; a summed loss would make it B². Margins: over seeds 0-9 it was
    0.92-1.08 for B = 4 and 0.92-1.13 for B = 16 (asserted: within [0.75, 1.3])."""
    var = variances()
    scaled = {b: b * v / var[1] for b, v in var.items()}
    print(f"\ngradient variance per batch size {({b: f'{v:.3g}' for b, v in var.items()})}; "
          f"B·var(B)/var(1): {({b: round(s, 2) for b, s in scaled.items()})}")
    assert 0.75 < scaled[4] < 1.3 and 0.75 < scaled[16] < 1.3
