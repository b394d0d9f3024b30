"""Report on an ablation-lab sweep: `python scripts/ablation_report.py [SWEEP] [--readme docs/ablation.md]`.

Examples:
    make ablation                                              # trains the lab's runs, then calls this
    python scripts/ablation_report.py outputs/ablation/<date>/<time>
    python scripts/ablation_report.py outputs/ablation/<date>/<time> --readme docs/ablation.md   # documented

Measures each run's final checkpoint (val loss, bits per byte, per-layer gradient norms and attention
entropy, greedy and sampled continuations) and writes ablation.json, ablation.md and ablation.png into the
sweep folder (minigpt/lab/ablation_report.py). --readme also copies the JSON and the figure into docs/
and regenerates the generated block of that Markdown file (docs/ablation.md). Without SWEEP: the newest under
outputs/ablation. Bad input ends with one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from minigpt.errors import UserError, exit_with_error

LAB_ROOT = Path("outputs/ablation")


def newest_sweep(root: Path = LAB_ROOT) -> Path:
    sweeps = [p.parent for p in root.glob("*/*/multirun.yaml")] if root.is_dir() else []
    if not sweeps:
        raise UserError(f"no ablation sweep under {root}; run `make ablation` first (or pass a sweep folder)")
    return max(sweeps, key=lambda p: p.stat().st_mtime)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sweep", nargs="?", type=Path, help="the sweep folder of `make ablation`")
    p.add_argument("--readme", type=Path, help="also rewrite this Markdown file's ablation block (and docs/)")
    p.add_argument("--docs", type=Path, default=Path("docs"), help="where --readme puts the JSON and figure")
    args = p.parse_args(argv)
    # the checkpoints' own ablation warnings are the point of the lab, not news: keep the console short
    logging.basicConfig(level=logging.ERROR, format="%(message)s")
    from minigpt.lab.ablation_report import write_report

    try:
        if args.readme is not None and not args.readme.is_file():
            raise UserError(f"--readme {args.readme} does not exist (give the Markdown file to update, "
                            "docs/ablation.md)")
        for path in write_report(args.sweep or newest_sweep(), readme=args.readme, docs_dir=args.docs):
            print(f"wrote {path}")
    except UserError as e:
        exit_with_error(str(e))


if __name__ == "__main__":
    main()
