"""The technique screen's tables: `python scripts/tricks_report.py ROOT --round NAME [--bench BENCH_JSON]`.

Examples:
    python scripts/tricks_report.py outputs/tricks --round muon --bench outputs/bench/techniques.json
    python scripts/tricks_report.py --render docs/tricks.json --page docs/tricks.md    # re-render only

ROOT holds one folder per arm, `<arm>/s<seed>/`, each a run of `scripts/train.py` (docs/tricks.md gives the
commands); an arm's control is the arm with the same steps and no change of its own, or the one named by
`--control ARM=CONTROL`. The arms are round NAME of the screen: written into `docs/tricks.json` beside the
page (every run's numbers, the other rounds kept as they are) and as a table between the page's
`<!-- tricks:NAME:begin -->` and `<!-- tricks:NAME:end -->` markers (minigpt/lab/tricks.py). BENCH_JSON:
`python scripts/bench.py only=[techniques] json_out=...`, whose step-time ratios become the table's last
column for the arms named `<prefix>_<technique>`. Bad input ends with one line on stderr and exit code 2.
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
    p.add_argument("--round", dest="round_name", help="the round of the screen the arms under ROOT are")
    p.add_argument("--bench", type=Path, help="a bench JSON with the techniques section")
    p.add_argument("--control", action="append", default=[], metavar="ARM=CONTROL",
                   help="pair ARM with CONTROL (an equal-time arm: fewer steps than its control)")
    p.add_argument("--render", type=Path, help="re-render every round of the page from this JSON")
    p.add_argument("--page", type=Path, default=Path("docs/tricks.md"), help="the Markdown page to update")
    args = p.parse_args(argv)
    from minigpt.lab.tricks import collect, markers, render_block, replace_block

    try:
        text = args.page.read_text() if args.page.is_file() else ""
        if args.render is not None:
            rounds = json.loads(args.render.read_text())["rounds"]
        elif args.root is not None and args.round_name:
            pairs = [c.split("=", 1) for c in args.control]
            if any(len(pair) != 2 for pair in pairs):
                raise UserError(f"--control takes ARM=CONTROL, got {args.control}")
            rounds = {args.round_name: collect(args.root, dict(pairs))}
        else:
            raise UserError("give the folder of arms (ROOT) and its --round NAME, or --render <json>")
        for name in rounds:  # refuse before writing anything
            begin, end = markers(name)
            if begin not in text or end not in text:
                raise UserError(f"{args.page} has no {begin} ... {end} markers to write the table between")
        if args.render is None:
            (doc,) = rounds.values()
            doc["step_ratios"] = step_ratios(args.bench, doc["arms"])
            out = args.page.with_suffix(".json")
            saved = json.loads(out.read_text()) if out.is_file() else {"rounds": {}}
            saved["rounds"][args.round_name] = doc
            out.write_text(json.dumps(saved, indent=1) + "\n")
            print(f"wrote {out}")
        for name, doc in rounds.items():
            text = replace_block(text, name, render_block(doc))
        args.page.write_text(text)
        print(f"wrote {args.page}")
    except (UserError, OSError, KeyError, ValueError, json.JSONDecodeError) as e:
        exit_with_error(str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
