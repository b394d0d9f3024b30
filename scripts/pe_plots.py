"""Plot positional encodings: `python scripts/pe_plots.py [dim=64] [positions=128] [out=FILE.png]`.

Three panels: the sinusoidal table as a heatmap, and the dot product PE(pos)·PE(pos+k) against the
offset k for sinusoidal PE and for RoPE, drawn from several starting positions: the curves coincide
because both encodings see only the offset (minigpt/lab/pe_plots.py). Bad input ends with one line on
stderr and exit code 2.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from minigpt.cli import reports_user_errors, run_cli, to_object
from minigpt.config import register_configs
from minigpt.lab.config import PEPlotsConfig

register_configs()


@hydra.main(version_base="1.3", config_path="../configs", config_name="pe_plots")
@reports_user_errors
def main(cfg: DictConfig) -> None:
    from minigpt.inspect.plotting import save_png
    from minigpt.lab.pe_plots import plot_positional_encodings

    c = to_object(cfg, PEPlotsConfig)
    fig = plot_positional_encodings(c.dim, c.positions, c.head_dim, tuple(c.starts))
    print(f"positional encodings: {save_png(fig, Path(c.out))}")


if __name__ == "__main__":
    run_cli(main)
