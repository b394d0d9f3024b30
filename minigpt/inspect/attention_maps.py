"""Attention maps: for one prompt, where every head of every layer looks.

Cell (i, j) of a head's map is the probability that query token i gives to key token j — one row of
the softmax, so each row sums to 1. The upper triangle is empty: the causal mask stops a token from
attending to its future. The probabilities come from the `math` backend (`GPT.attention_probs`), the
one backend that materialises them; the fused ones never do.

Typical patterns in a trained model: a bright diagonal (attend to yourself), the first sub-diagonal
(the previous token), a bright first column (the start token as a "no-op" sink), and heads that find
the matching bracket or the previous occurrence of the current token.
"""

from __future__ import annotations

import matplotlib
import numpy as np
import torch
from matplotlib.figure import Figure
from torch import nn

from minigpt.errors import UserError
from minigpt.inspect.plotting import figure_to_rgb, new_figure
from minigpt.model.factory import unwrap


def select(indices: list[int] | None, count: int, what: str) -> list[int]:
    """Validate a layers=/heads= selection against the model; None means all."""
    if indices is None:
        return list(range(count))
    bad = [i for i in indices if not 0 <= i < count]
    if bad or not indices:
        raise UserError(f"{what}={indices} must pick from 0..{count - 1}")
    return list(indices)


PANEL_IN = 2.4  # inches per head panel: room for ~24 readable token labels at font size 6
MAX_LABELS = 40  # beyond this the labels overlap; the axes then show positions instead


def token_labels(ids: list[int], tokenizer) -> list[str]:
    """One short, visible label per token: whitespace made visible, long tokens cut."""
    if tokenizer is None:
        return [str(i) for i in ids]
    labels = []
    for i in ids:
        text = "<eot>" if i == tokenizer.eot_id else tokenizer.decode([i])
        text = text.replace("\n", "\\n").replace("\t", "\\t").replace(" ", "·")  # · marks a space
        labels.append(text if len(text) <= 10 else text[:9] + "…")
    return labels


@torch.no_grad()
def attention_probs(model: nn.Module, ids: list[int] | torch.Tensor) -> list[torch.Tensor]:
    """One (H, T, T) probability tensor per layer for a single sequence of ids, in eval mode."""
    model = unwrap(model)  # torch.compile / DDP wrappers hide attention_probs
    device = next(model.parameters()).device
    idx = torch.as_tensor(ids, dtype=torch.long, device=device).reshape(1, -1)  # (1, T)
    idx = idx[:, -model.config.block_size :]  # the model cannot see further back
    was_training = model.training
    model.eval()  # attention dropout (if any) off: show what the model computes at inference
    try:
        return [p[0].float().cpu() for p in model.attention_probs(idx)]  # L x (H, T, T)
    finally:
        model.train(was_training)


def plot_attention(
    probs: list[torch.Tensor],
    labels: list[str],
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    title: str = "",
) -> Figure:
    """A grid of heatmaps, one row per layer and one column per head, tokens on both axes."""
    layers = list(range(len(probs))) if layers is None else layers
    heads = list(range(probs[0].shape[0])) if heads is None else heads
    T = probs[0].shape[-1]
    fig = new_figure(PANEL_IN * len(heads) + 0.6, PANEL_IN * len(layers) + 0.6)
    axes = fig.subplots(len(layers), len(heads), squeeze=False)
    show_labels = T <= MAX_LABELS
    # the masked future drawn blank, not as "probability 0" in dark blue
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="white")
    future = np.triu_indices(T, k=1)
    for r, layer in enumerate(layers):
        for c, head in enumerate(heads):
            ax = axes[r][c]
            # the colour scale is per panel, from 0 to that head's largest weight: heads differ a lot
            grid = probs[layer][head].numpy().copy()  # (T, T)
            grid[future] = np.nan
            ax.imshow(grid, cmap=cmap, vmin=0.0, interpolation="nearest")
            ax.set_title(f"layer {layer}, head {head}", fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
            if show_labels and r == len(layers) - 1:
                ax.set_xticks(range(T), labels, rotation=90, fontsize=6)
            if show_labels and c == 0:
                ax.set_yticks(range(T), labels, fontsize=6)
    fig.suptitle(title or "attention probabilities (row: query token, column: key token)", fontsize=10)
    return fig


def attention_figure(model: nn.Module, ids: list[int], tokenizer=None, **kwargs) -> Figure:
    """Attention maps of `model` on `ids` (the last block_size of them), labelled with the tokenizer."""
    probs = attention_probs(model, ids)
    T = probs[0].shape[-1]
    return plot_attention(probs, token_labels(list(ids)[-T:], tokenizer), **kwargs)


def log_attention_images(
    writer, model: nn.Module, tokens, step: int, tokenizer=None, tag: str = "attention"
) -> None:
    """Write the attention grid of `tokens` (a (T,) or (1, T) id tensor or list) to TensorBoard as one image.

    The trainer calls this at eval time when `logging.attention_images=true`; `writer` is a
    `torch.utils.tensorboard.SummaryWriter`. The model is left in the mode it was in.
    """
    ids = tokens.flatten().tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
    fig = attention_figure(model, ids, tokenizer, title=f"attention probabilities at step {step}")
    writer.add_image(tag, figure_to_rgb(fig), step, dataformats="HWC")
