"""The technique screen's table: `python scripts/tricks_report.py ROOT [--bench BENCH_JSON] [--page PAGE]`.

Examples:
    python scripts/tricks_report.py outputs/tricks --bench outputs/bench/techniques.json --page docs/tricks.md
    python scripts/tricks_report.py --render docs/tricks.json --page docs/tricks.md    # re-render only

ROOT holds one folder per arm, `<arm>/s<seed>/`, each a run of `scripts/train.py` (docs/tricks.md gives the
commands); an arm's control is the arm with the same steps and no change of its own, or the one named by
`--control ARM=CONTROL`. Writes
`docs/tricks.json` beside the page (every run's numbers) and the page's table between its `tricks` markers
(minigpt/lab/tricks.py). BENCH_JSON: `python scripts/bench.py only=[techniques] json_out=...`, whose
step-time ratios become the table's last column for the arms named `<prefix>_<technique>`. Bad input ends
with one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from minigpt.errors import UserError, exit_with_error


def step_ratios(bench_json: Path | None, arms: dict) -> dict[str, float]:
    """Each arm's step time relative to the default's, from the bench's techniques section."""
    if bench_json is None:
        return {}
    rows = json.loads(bench_json.read_text())["sections"]["techniques"]["rows"]
    found = {}
    for arm in arms:
        technique = arm.split("_", 1)[-1]
        if technique in rows:  # the CPU-time ratio where the bench has it (steady on a shared machine)
            found[arm] = rows[technique].get("cpu_ratio", rows[technique]["ratio"])
    return found


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", nargs="?", type=Path, help="the folder of arms")
    p.add_argument("--bench", type=Path, help="a bench JSON with the techniques section")
    p.add_argument("--control", action="append", default=[], metavar="ARM=CONTROL",
                   help="pair ARM with CONTROL (an equal-time arm: fewer steps than its control)")
    p.add_argument("--render", type=Path, help="re-render the page from this JSON instead of collecting")
    p.add_argument("--page", type=Path, default=Path("docs/tricks.md"), help="the Markdown page to update")
    args = p.parse_args(argv)
    from minigpt.lab.tricks import BEGIN, END, collect, render_block, replace_block

    try:
        text = args.page.read_text() if args.page.is_file() else ""
        if BEGIN not in text or END not in text:  # refuse before writing anything
            raise UserError(f"{args.page} has no {BEGIN} ... {END} markers to write the table between")
        if args.render is not None:
            doc = json.loads(args.render.read_text())
        elif args.root is not None:
            pairs = [c.split("=", 1) for c in args.control]
            if any(len(pair) != 2 for pair in pairs):
                raise UserError(f"--control takes ARM=CONTROL, got {args.control}")
            doc = collect(args.root, dict(pairs))
            doc["step_ratios"] = step_ratios(args.bench, doc["arms"])
            out = args.page.with_suffix(".json")
            out.write_text(json.dumps(doc, indent=1) + "\n")
            print(f"wrote {out}")
        else:
            raise UserError("give the folder of arms (ROOT) or --render <json>")
        args.page.write_text(replace_block(text, render_block(doc)))
        print(f"wrote {args.page}")
    except (UserError, OSError, KeyError, json.JSONDecodeError) as e:
        exit_with_error(str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
