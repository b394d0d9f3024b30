"""Temperature made visible: one next-token distribution at several temperatures, and its entropy.

    p_T(i) = softmax((z - max z) / T)_i

As T -> 0 the largest logit wins everything (entropy -> 0, greedy decoding); at T = 1 the model's
own distribution; as T -> infinity every token gets 1/V (entropy -> log V, uniform noise). In
between, the entropy rises monotonically with T: dividing by a larger T shrinks every gap between
logits, and the distribution can only spread out.

`temperature_figure` draws the top tokens' probabilities at a few temperatures side by side, and
the entropy against T on a log axis with both limits marked. Matplotlib runs on the Agg backend
(files only, no display needed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from minigpt.sampling.next_token import entropy, probabilities
from minigpt.sampling.params import SamplingParams
from minigpt.sampling.sequences import window_length


@torch.no_grad()
def next_token_logits(model: torch.nn.Module, ids: Sequence[int]) -> torch.Tensor:
    """The model's logits (V,) for the token after `ids` (cut to the window, as generation does)."""
    block = model.config.block_size
    ids = list(ids)[len(ids) - window_length(len(ids), block, block) :]  # the last block_size tokens
    idx = torch.tensor([ids], device=next(model.parameters()).device)  # (1, T)
    logits, _ = model(idx, last_only=True)  # (1, 1, V)
    return logits[0, -1].float().cpu()


def distributions(logits: torch.Tensor, temperatures: Sequence[float]) -> torch.Tensor:
    """(len(temperatures), V): softmax((z - max) / T) for each T."""
    return torch.stack([probabilities(logits, SamplingParams(t)) for t in temperatures])


def entropy_curve(logits: torch.Tensor, temperatures: Sequence[float]) -> torch.Tensor:
    """Entropy in nats of the distribution at each temperature, (len(temperatures),)."""
    return entropy(distributions(logits.double(), temperatures))


def temperature_figure(
    logits: torch.Tensor,
    label: Callable[[int], str],
    path: Path,
    temperatures: Sequence[float] = (0.25, 0.5, 1.0, 2.0, 4.0),
    top: int = 20,
    title: str = "",
) -> Path:
    """Write the PNG: bars of the `top` tokens at each temperature, then entropy vs T (log axis)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: works on a headless machine
    import matplotlib.pyplot as plt

    vocab = logits.shape[-1]
    top = min(top, vocab)
    order = torch.argsort(logits, descending=True)[:top]  # temperature never changes the ranking
    names = [label(int(i)) for i in order]
    full = distributions(logits, temperatures)  # (n_T, V)
    probs, h_at = full[:, order], entropy(full)  # (n_T, top), (n_T,)

    n = len(temperatures)
    widths = {"width_ratios": [1.0] * n + [1.8]}  # the entropy plot gets more room than each bar chart
    fig, axes = plt.subplots(1, n + 1, figsize=(3.0 * n + 5.0, 5.0), gridspec_kw=widths)
    for ax, t, p, h in zip(axes[:n], temperatures, probs, h_at, strict=True):
        ax.barh(range(top), p.numpy(), color="tab:blue")
        ax.set_yticks(range(top), names if ax is axes[0] else [""] * top, fontsize=8)
        ax.invert_yaxis()  # the most likely token on top
        ax.set_xlim(0, min(1.0, 1.1 * float(probs.max())))  # one scale for all panels, so they compare
        ax.set_title(f"T = {t:g}   H = {float(h):.2f} nats")
        ax.set_xlabel("probability")

    ts = torch.logspace(-3, 3, 121, dtype=torch.float64)
    h = entropy_curve(logits, ts.tolist())
    ax = axes[n]
    ax.semilogx(ts.numpy(), h.numpy(), color="tab:red", label="entropy H(T)")
    ax.axhline(0.0, color="gray", ls="--", lw=1)
    ax.axhline(math.log(vocab), color="gray", ls="--", lw=1)
    ax.annotate("T -> 0: one-hot on the argmax, H = 0", (ts[0].item(), 0.0), xytext=(0, 6),
                textcoords="offset points", fontsize=8)  # fmt: skip
    ax.annotate(f"T -> inf: uniform, H = log V = {math.log(vocab):.2f}", (ts[0].item(), math.log(vocab)),
                xytext=(0, -12), textcoords="offset points", fontsize=8)  # fmt: skip
    for t in temperatures:
        ax.axvline(t, color="tab:blue", lw=0.5, alpha=0.5)
    ax.set_xlabel("temperature T (log scale)")
    ax.set_ylabel("entropy (nats)")
    ax.set_title("entropy of the next-token distribution")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def token_label(decode: Callable[[list[int]], str]) -> Callable[[int], str]:
    """A readable label for one token id: its text quoted, so spaces and newlines show."""
    return lambda i: repr(decode([i]))
