"""Plot positional encodings: `python scripts/pe_plots.py [--dim 64] [--positions 128] [--out FILE.png]`.

Three panels: the sinusoidal table as a heatmap, and the dot product PE(pos)·PE(pos+k) against the
offset k for sinusoidal PE and for RoPE, drawn from several starting positions — the curves coincide
because both encodings see only the offset (minigpt/lab/pe_plots.py). A pure file tool, so plain
flags rather than Hydra; bad input ends with one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from minigpt.errors import UserError, exit_with_error


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dim", type=int, default=64, help="width C of the sinusoidal table (default 64)")
    p.add_argument("--positions", type=int, default=128, help="positions in the table (default 128)")
    p.add_argument("--head-dim", type=int, default=32, help="RoPE head size D (default 32)")
    p.add_argument("--starts", type=int, nargs="+", default=[0, 17, 60], help="positions to start from")
    p.add_argument("--out", type=Path, default=Path("outputs/inspect/positional_encodings.png"))
    args = p.parse_args(argv)
    from minigpt.inspect.plotting import save_png
    from minigpt.lab.pe_plots import plot_positional_encodings

    try:
        for name in ("dim", "head_dim"):
            value = getattr(args, name)
            if value < 2 or value % 2:
                raise UserError(f"--{name.replace('_', '-')}={value} must be even and >= 2 (sin/cos pairs)")
        if args.positions < 2 or min(args.starts) < 0:
            raise UserError("--positions must be >= 2 and --starts non-negative")
        fig = plot_positional_encodings(args.dim, args.positions, args.head_dim, tuple(args.starts))
        print(f"positional encodings: {save_png(fig, args.out)}")
    except UserError as e:
        exit_with_error(str(e))


if __name__ == "__main__":
    main()
