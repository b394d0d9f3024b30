"""Why LayerNorm and not BatchNorm: BatchNorm's statistics are the batch's, LayerNorm's the token's own.

`model.norm=batchnorm` exists to show this. Each test measures the real model or norm against a statistic
computed here by hand, and would fail if the two norms behaved alike.
"""

from __future__ import annotations

import torch
from model_helpers import VOCAB, shrunk_config

from minigpt.model.factory import build_model
from minigpt.model.norm import build_norm

EPS = 1e-5


def test_batchnorm_centres_each_channel_over_the_batch_and_eval_uses_the_running_averages():
    """Not "over the whole input": one mean and variance per channel, over the B·T tokens of the batch."""
    B, T, C = 4, 6, 8
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, C, generator=g) * torch.linspace(0.5, 4, C) + torch.linspace(-3, 3, C)  # (B, T, C)
    norm = build_norm("batchnorm", C, eps=EPS, bias=True).train()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2.0, generator=g)
        norm.bias.normal_(generator=g)
        y = norm(x)
    mean = x.mean(dim=(0, 1))  # (C,): per channel, over every token of the batch
    var = x.var(dim=(0, 1), unbiased=False)
    torch.testing.assert_close(y, (x - mean) / (var + EPS).sqrt() * norm.weight + norm.bias)
    # torch's momentum 0.1 from (0, 1); the running variance is the unbiased estimate over the B·T tokens
    torch.testing.assert_close(norm.running_mean, 0.1 * mean)
    torch.testing.assert_close(norm.running_var, 0.9 + 0.1 * x.var(dim=(0, 1), unbiased=True))
    norm.eval()
    expected = (x - norm.running_mean) / (norm.running_var + EPS).sqrt() * norm.weight + norm.bias
    torch.testing.assert_close(norm(x).detach(), expected)
    # what it does not do: each token keeps its own mean, which LayerNorm would remove, and the input is not
    # normalised as one whole (the channels' centres differ in x but not in y)
    centred = (y - norm.bias) / norm.weight
    assert centred.mean(-1).abs().max() > 0.1
    torch.testing.assert_close(centred.mean(dim=(0, 1)), torch.zeros(C), atol=1e-5, rtol=0)


def _outputs(norm: str, idx: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(0)
    model = build_model(shrunk_config("tiny", norm=norm)).train()  # training mode, dropout 0
    return model(idx)[0]  # (B, T, V)


def test_batchnorm_couples_the_rows_of_a_batch_and_the_future_and_layernorm_does_not():
    idx = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    other_row, later_token = idx.clone(), idx.clone()
    other_row[1] = (other_row[1] + 1) % VOCAB  # another sequence in the batch
    later_token[0, 8:] = (later_token[0, 8:] + 1) % VOCAB  # row 0's own future
    for norm, coupled in (("batchnorm", True), ("layernorm", False)):
        out = _outputs(norm, idx)
        rows, future = _outputs(norm, other_row), _outputs(norm, later_token)
        assert torch.equal(out[0], rows[0]) is not coupled, norm  # row 0 depends on row 1 ...
        assert torch.equal(out[0, :8], future[0, :8]) is not coupled, norm  # ... and on its own future
        if coupled:  # by a visible amount, not by rounding
            assert (out[0] - rows[0]).abs().max() > 1e-3 and (out[0, :8] - future[0, :8]).abs().max() > 1e-3


def _train_eval_gap(model: torch.nn.Module, idx: torch.Tensor) -> float:
    """Relative difference of the logits in eval and in training mode (dropout 0: only the norm differs)."""
    with torch.no_grad():
        trained, evaluated = model.train()(idx)[0], model.eval()(idx)[0]
    return ((evaluated - trained).norm() / trained.norm()).item()


def train_eval_gaps(norm: str, seed: int = 0) -> tuple[float, float]:
    """The model's eval-vs-train gap on 8- and on 32-token windows, after its running averages (if any) were
    collected on 8-token windows: 50 forward passes in training mode, no optimizer (momentum 0.1 forgets the
    start within ~50 batches)."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = build_model(shrunk_config("tiny", norm=norm, pos_encoding="sinusoidal", block_size=32)).train()
    with torch.no_grad():
        for _ in range(50):
            model(torch.randint(0, VOCAB, (32, 8), generator=g))
    short, long = (torch.randint(0, VOCAB, (32, t), generator=g) for t in (8, 32))
    return _train_eval_gap(model, short), _train_eval_gap(model, long)


def test_batchnorm_behaves_differently_in_eval_on_longer_sequences_and_layernorm_does_not():
    """Sinusoidal positions make each channel's statistics depend on the position, as real activations do: the
    running averages of 8-token windows are not the statistics of 32-token ones. Margins: over seeds 0-9 the
    batchnorm gap was 0.12-0.14 on 8 tokens and
    0.96-1.12 on 32 (asserted: < 0.2, > 0.6 and more than 4x)."""
    (bn_short, bn_long), (ln_short, ln_long) = train_eval_gaps("batchnorm"), train_eval_gaps("layernorm")
    print(f"\nrelative eval-vs-train difference of the logits, 8 / 32 tokens: batchnorm {bn_short:.3f} / "
          f"{bn_long:.3f}, layernorm {ln_short:.3g} / {ln_long:.3g}")
    assert bn_short < 0.2 and bn_long > 0.6 and bn_long > 4 * bn_short
    assert ln_short == ln_long == 0.0  # the same arithmetic in both modes
