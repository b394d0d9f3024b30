"""Positional encodings: the sinusoidal table, and why sinusoidal PE and RoPE encode *relative* position.

For the sinusoidal table, PE(pos) · PE(pos + k) = sum_i cos(k * w_i) with w_i = 10000^(-2i/C): the
sin/cos pairs are clocks and the dot product only sees how far the two clocks turned apart, so the
similarity curve against the offset k is the same whatever pos it starts from.
RoPE makes the same promise inside attention: a query rotated to position pos and a key rotated to
pos + k have a dot product that depends on k only. Both curves are computed here with the model's
own code (`sinusoidal_table`, `RotaryEmbedding` + `apply_rope`) and drawn for several starting
positions, so a reader sees the curves lie on top of each other.
"""

from __future__ import annotations

import torch
from matplotlib.figure import Figure

from minigpt.inspect.plotting import new_figure
from minigpt.model.embedding import sinusoidal_table
from minigpt.model.rope import RotaryEmbedding, apply_rope


def sinusoidal_similarity(dim: int, starts: list[int], max_offset: int) -> torch.Tensor:
    """PE(pos) · PE(pos + k) for pos in `starts`, k = 0..max_offset: (len(starts), max_offset + 1)."""
    table = sinusoidal_table(max(starts) + max_offset + 1, dim).double()  # (P, C)
    rows = [table[p : p + max_offset + 1] @ table[p] for p in starts]  # each (K,)
    return torch.stack(rows)


def rope_similarity(head_dim: int, starts: list[int], max_offset: int, base: float = 10000.0) -> torch.Tensor:
    """<rope(x, pos), rope(x, pos + k)> for one fixed vector x: (len(starts), max_offset + 1).

    x is all ones over sqrt(D) (unit length), so every rotating pair weighs the same and the
    value at k = 0 is 1.
    """
    rope = RotaryEmbedding(head_dim, max(starts) + max_offset + 1, base)
    x = torch.full((1, 1, 1, head_dim), head_dim**-0.5, dtype=torch.float64)  # (B=1, H=1, T=1, D)
    rows = []
    for p in starts:
        q = apply_rope(x, *(t.double() for t in rope(torch.tensor([p]))))  # (1, 1, 1, D)
        ks = x.expand(1, 1, max_offset + 1, head_dim)  # (1, 1, K, D): the same vector at K positions
        k = apply_rope(ks, *(t.double() for t in rope(torch.arange(p, p + max_offset + 1))))  # (1, 1, K, D)
        rows.append((k @ q.transpose(-1, -2)).flatten())  # (K,)
    return torch.stack(rows)


def plot_positional_encodings(
    dim: int = 64, n_positions: int = 128, head_dim: int = 32, starts: tuple[int, ...] = (0, 17, 60)
) -> Figure:
    """Three panels: the sinusoidal table, its similarity against offset, RoPE's similarity against offset."""
    max_offset, starts = n_positions // 2, list(starts)
    fig = new_figure(13, 4.2)
    ax_tab, ax_sin, ax_rope = fig.subplots(1, 3, width_ratios=[1.2, 1, 1])

    table = sinusoidal_table(n_positions, dim).numpy()  # (P, C)
    im = ax_tab.imshow(table, aspect="auto", cmap="RdBu", vmin=-1, vmax=1)
    ax_tab.set_title(f"sinusoidal PE table ({n_positions} positions x {dim} dims)")
    ax_tab.set_xlabel("dimension (even: sin, odd: cos; frequency falls to the right)")
    ax_tab.set_ylabel("position")
    fig.colorbar(im, ax=ax_tab, fraction=0.05)

    offsets = range(max_offset + 1)
    curves = [
        (ax_sin, sinusoidal_similarity(dim, starts, max_offset), f"sinusoidal: PE(pos)·PE(pos+k), C={dim}"),
        (ax_rope, rope_similarity(head_dim, starts, max_offset), f"RoPE: q(pos)·k(pos+k), D={head_dim}"),
    ]
    for ax, sim, title in curves:
        # draw later starts thinner and dashed so the overlap (same curve for every pos) stays visible
        for i, (p, row) in enumerate(zip(starts, sim, strict=True)):
            style = ["-", "--", ":"][i % 3]
            ax.plot(offsets, row.numpy(), lw=max(0.8, 2.5 - 0.8 * i), ls=style, label=f"pos = {p}")
        ax.set_title(title)
        ax.set_xlabel("offset k")
        ax.set_ylabel("dot product")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig
