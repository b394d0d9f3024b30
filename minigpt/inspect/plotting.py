"""The two things every inspection figure needs: a headless figure and a way out of it (PNG or pixels).

Figures are built with `matplotlib.figure.Figure` directly instead of `pyplot`: pyplot keeps global
state (a current figure, an interactive backend chosen from the environment) that leaks between calls
and needs a display on some machines; a bare Figure on the Agg canvas needs neither.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from minigpt.errors import UserError

DPI = 100  # pixels per inch: a 10 x 6 inch figure becomes a 1000 x 600 PNG, small enough for docs/


def new_figure(width_in: float, height_in: float) -> Figure:
    """A blank figure on the Agg canvas, sized in inches (pixels = inches * DPI)."""
    fig = Figure(figsize=(width_in, height_in), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_png(fig: Figure, path: Path) -> Path:
    """Write `fig` as a PNG at `path` (parent folders created); returns the path."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise UserError(f"output file {path} must end in .png (the plots are written as PNG)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    return path


def figure_to_rgb(fig: Figure) -> np.ndarray:
    """Render `fig` and return its pixels as an (H, W, 3) uint8 array (what TensorBoard's add_image takes)."""
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()  # drop alpha; copy: the buffer is reused
