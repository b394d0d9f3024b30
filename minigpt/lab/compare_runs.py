"""Training the runs of a comparison or a ladder: Hydra multiruns of scripts/train.py, as processes.

A comparison trains its two arms side by side (one multirun each, started together, so whatever else the
machine does slows both alike); a ladder trains one multirun per budget. Each multirun is the command a user
would type, `python scripts/train.py -m <overrides> trainer.seed=1337,1338 hydra.sweep.dir=...`, so a
launcher override (`hydra/launcher=slurm`, in `train_args`) sends its seeds to a cluster to train in
parallel. Every run is started with `trainer.resume=auto`: a run stopped half-way continues where it
stopped, a fresh folder starts from scratch, and a finished run is left as it is. The processes' output goes
to a log file each; each run's own train.log is in its folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from minigpt.errors import UserError
from minigpt.lab.runs import finished, sweep_values

TRAIN_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train.py"


@dataclass(frozen=True)
class Multirun:
    """One multirun of train.py: `overrides` x `seeds`, job folders `<sweep_dir>/<prefix>seed<seed>`."""

    overrides: tuple[str, ...]
    seeds: tuple[int, ...]
    sweep_dir: Path
    log: Path
    prefix: str = ""

    def run_dir(self, seed: int) -> Path:
        return self.sweep_dir / f"{self.prefix}seed{seed}"

    def command(self, train_args: list[str]) -> list[str]:
        subdir = f"hydra.sweep.subdir={self.prefix}seed${{trainer.seed}}"
        return [sys.executable, str(TRAIN_SCRIPT), "-m", *self.overrides,
                f"trainer.seed={','.join(map(str, self.seeds))}", "trainer.resume=auto",
                f"hydra.sweep.dir={self.sweep_dir}", subdir, *train_args]


def check_not_a_sweep(name: str, overrides: list[str]) -> None:
    """Refuse an override that sweeps (`a=1,2`): one arm or one ladder point is one config."""
    for o in overrides:
        if "=" in o and len(sweep_values(o.split("=", 1)[1])) > 1:
            raise UserError(f"{name} override {o!r} is a sweep; each of {name} is one config (one value per "
                            "key)")


def run_together(multiruns: list[Multirun], train_args: list[str],
                 threads: int | None) -> list[tuple[int, Path, Path]]:
    """Start every multirun at once, each with `threads` intra-op threads (OMP_NUM_THREADS; None: torch's
    default, one per core), and wait for all of them. Returns the runs that did not finish: (seed, run
    folder, log of its multirun)."""
    return run_pool(multiruns, train_args, threads, jobs=max(len(multiruns), 1))


def run_pool(multiruns: list[Multirun], train_args: list[str], threads: int | None, jobs: int,
             on_finished: Callable[[int], None] | None = None) -> list[tuple[int, Path, Path]]:
    """Run the multiruns `jobs` at a time, in order; `on_finished(i)` once multirun i has ended with every
    run finished. Returns the runs that did not finish, as `run_together` does."""
    env = dict(os.environ)
    env.pop("HYDRA_FULL_ERROR", None)  # each run's errors in one line, in its log
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    running: dict[int, subprocess.Popen] = {}
    failed, waiting = [], list(range(len(multiruns)))
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                i = waiting.pop(0)
                running[i] = _start(multiruns[i], train_args, env)
            i = _wait_any(running)
            del running[i]
            m = multiruns[i]
            lost = [(seed, m.run_dir(seed), m.log) for seed in m.seeds if not finished(m.run_dir(seed))]
            failed += lost
            if not lost and on_finished is not None:
                on_finished(i)
    finally:
        for p in running.values():  # a stop signal here (Ctrl-C) stops the runs too; they resume next time
            p.terminate()
            p.wait()
    return failed


def _start(m: Multirun, train_args: list[str], env: dict) -> subprocess.Popen:
    m.log.parent.mkdir(parents=True, exist_ok=True)
    with open(m.log, "ab") as log:
        return subprocess.Popen(m.command(train_args), stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=TRAIN_SCRIPT.parents[1])


def _wait_any(running: dict[int, subprocess.Popen]) -> int:
    """The index of a process that has ended (waiting for the first to end)."""
    while True:
        for i, p in running.items():
            if p.poll() is not None:
                return i
        time.sleep(0.5)


def failure_line(run: Path, log: Path) -> str:
    """Why `run` did not finish, in a few words: the last `error:` line of the log, or its last line."""
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    errors = [line for line in lines if line.startswith("error:")]
    last = (errors or [line for line in lines if line.strip()] or ["(the log is empty)"])[-1]
    return f"{run} did not finish (log {log}: {last.strip()[:300]})"
