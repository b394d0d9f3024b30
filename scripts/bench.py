"""Measure minigpt's speed against a reference, in one run: `python scripts/bench.py [--quick] [--only ...]`.

Prints a table (medians with min-max of interleaved repeats, ratios to the Hugging Face reference)
and, with --json-out, writes the same numbers as JSON. The sections and their sizes are described
in minigpt/lab/bench/suite.py; `make bench ARGS="--quick"` passes flags through.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from minigpt.errors import USER_ERROR_EXIT_CODE, UserError
from minigpt.lab.bench.sections import ALIASES, EXTRA_SECTIONS, SECTIONS, select_sections


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes and few repeats: under a minute")
    names = ", ".join((*SECTIONS, *EXTRA_SECTIONS, *ALIASES))
    p.add_argument("--only", nargs="+", metavar="SECTION", help=f"run only these: {names}")
    p.add_argument("--json-out", type=Path, help="also write the results as JSON to this path")
    p.add_argument("--threads", type=int, default=None, help="intra-op CPU threads (default: one per core)")
    p.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu or cuda")
    p.add_argument("--compile", dest="compile_", action=argparse.BooleanOptionalAction, default=None,
                   help="include torch.compile contenders (default: yes, except with --quick)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch  # after parsing: `--help` answers without it

    from minigpt.lab.bench.report import format_report, write_json
    from minigpt.lab.bench.suite import run_suite

    try:
        sections = select_sections(args.only)
        if args.threads is not None:
            if args.threads < 1:
                raise UserError(f"--threads {args.threads} must be at least 1")
            torch.set_num_threads(args.threads)
        kind = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
        if kind == "auto":
            kind = "cpu"
        if kind not in ("cpu", "cuda") or (kind == "cuda" and not torch.cuda.is_available()):
            raise UserError(f"--device {args.device} is not available here (use cpu, or cuda with a GPU)")
        log = lambda msg: print(msg, file=sys.stderr, flush=True)
        start = time.perf_counter()
        results = run_suite(sections, torch.device(kind), quick=args.quick, compile_=args.compile_, log=log)
        results["machine"]["wall_s"] = time.perf_counter() - start
        print(format_report(results))
        if args.json_out is not None:
            write_json(results, args.json_out)
        failed = [name for name, r in results["sections"].items() if "error" in r]
        if failed:
            print(f"error: sections failed: {', '.join(failed)} (see the table)", file=sys.stderr)
            return 1
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    return 0


if __name__ == "__main__":
    sys.exit(main())
