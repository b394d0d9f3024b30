"""Measure minigpt's speed against references, in one run: `python scripts/bench.py [quick=true] [only=...]`.

Prints a table (medians with min-max of interleaved repeats, ratios to the references) and, with
json_out=..., writes the same numbers as JSON. The sections and their sizes are described in
minigpt/lab/bench/suite.py; `make bench ARGS="quick=true"` passes keys through. A section that fails is
reported in the table, and the command then exits 1; bad input ends with one line and exit code 2.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig

from minigpt.cli import reports_user_errors, run_cli, to_object
from minigpt.config import register_configs
from minigpt.errors import UserError
from minigpt.lab.config import BenchConfig

register_configs()


@hydra.main(version_base="1.3", config_path="../configs", config_name="bench")
@reports_user_errors
def main(cfg: DictConfig) -> None:
    import torch

    from minigpt.device.threads import set_threads
    from minigpt.lab.bench.report import format_report, write_json
    from minigpt.lab.bench.sections import select_sections
    from minigpt.lab.bench.suite import run_suite

    c = to_object(cfg, BenchConfig)
    threads = set_threads(c.threads)
    kind = ("cuda" if torch.cuda.is_available() else "cpu") if c.device == "auto" else c.device
    if kind == "cuda" and not torch.cuda.is_available():
        raise UserError("device=cuda but no CUDA device is available (use device=cpu or device=auto)")
    log = lambda msg: print(msg, file=sys.stderr, flush=True)
    start = time.perf_counter()
    results = run_suite(select_sections(c.only), torch.device(kind), quick=c.quick, compile_=c.compile,
                        log=log)
    results["machine"]["wall_s"] = time.perf_counter() - start
    results["machine"]["threads_reason"] = threads.reason
    print(format_report(results))
    if c.json_out is not None:
        write_json(results, Path(c.json_out))
    failed = [name for name, r in results["sections"].items() if "error" in r]
    if failed:
        print(f"error: sections failed: {', '.join(failed)} (see the table)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    run_cli(main)
