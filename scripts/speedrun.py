"""The CPU speedrun table: `python scripts/speedrun.py [--budget 3min] [SWEEP OVERRIDE ...]`.

Runs `scripts/train.py -m <overrides> trainer.max_time=<budget> trainer.max_steps=null` (one job per
combination, one after the other), scores every job on the whole val split (stride = block), adds the rows to
docs/speedrun.json and rewrites the table between the speedrun markers of docs/speedrun.md
(minigpt/lab/speedrun.py).

    python scripts/speedrun.py                                   # model=demo,modern,tiny (the default first)
    python scripts/speedrun.py model=modern model.n_embd=128,192 optim.lr=2e-3,4e-3 optim.schedule=cosine,wsd
    python scripts/speedrun.py --render                          # only re-render the table from the JSON

Bad input ends with one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

from minigpt.errors import USER_ERROR_EXIT_CODE, UserError
from minigpt.training.budget import parse_duration

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SWEEP = ["model=demo,modern,tiny"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", help=f"Hydra sweep overrides (default: {' '.join(DEFAULT_SWEEP)})")
    p.add_argument("--budget", default="3min", help="trainer.max_time of every run (default: 3min)")
    p.add_argument("--results", type=Path, default=ROOT / "docs" / "speedrun.json", help="the results JSON")
    p.add_argument("--readme", type=Path, default=ROOT / "docs" / "speedrun.md",
                   help="the Markdown file holding the table (default: docs/speedrun.md)")
    p.add_argument("--sweep-dir", type=Path, help="the multirun folder (default: outputs/speedrun/<time>)")
    p.add_argument("--render", action="store_true", help="run nothing: re-render the table from the JSON")
    p.add_argument("--fresh", action="store_true", help="drop the rows already in the JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from minigpt.lab import speedrun  # after parsing: `--help` answers without torch

    try:
        results = {"rows": []} if args.fresh else speedrun.load_results(args.results)
        if not args.render:
            parse_duration(args.budget, key="--budget")  # before anything runs
            stamp = datetime.datetime.now().strftime("%Y-%m-%d/%H-%M-%S")
            sweep_dir = args.sweep_dir or ROOT / "outputs" / "speedrun" / stamp
            jobs = speedrun.run_sweep(args.overrides or DEFAULT_SWEEP, args.budget, sweep_dir)
            rows = [speedrun.score_run(job, args.budget) for job in jobs]
            results = speedrun.merge(results, rows)
            args.results.parent.mkdir(parents=True, exist_ok=True)
            args.results.write_text(json.dumps(results, indent=2) + "\n")
        table = speedrun.render_table(results)
        readme = args.readme.read_text(encoding="utf-8")
        args.readme.write_text(speedrun.update_readme(readme, table, args.readme.name), encoding="utf-8")
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    except OSError as e:
        print(f"error: cannot read or write {e.filename}: {e.strerror}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
