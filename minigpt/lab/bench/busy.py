"""Training on a busy machine: the Llama-style run's (TrainConfig's defaults) tokens/s alone and beside a
CPU-bound competitor, with the thread count chosen by measurement and with one thread per core (torch's own
default).

The competitor is a Python busy loop in a process of its own, which the section starts and stops. The
trainer's step of the Llama-style model (techniques.default_model_step: the trainer's autocast, fused loss and
optimizer, random tokens) runs on the CPU in four settings, timed in interleaved rounds:

    quiet    measured     set_threads(None) as a run starts, then a ThreadGovernor fed every step's clock
    quiet    fixed        one thread per core (threads.thread_ceiling)
    busy     measured     the same, with the competitor running from before the run starts
    busy     fixed

and once per round a measured run of twice the steps meets a competitor that arrives a quarter of the way in:
the governor's
reaction mid-run (device/governor.py), and the tokens/s after the arrival. Ratios: each busy setting's
tokens/s over the quiet tokens/s of the same setting (what the run keeps), and quiet measured over quiet fixed
(the choice costs nothing on an idle machine).
"""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from minigpt.data.config import DataConfig, TokenizerConfig
from minigpt.device.config import DeviceConfig
from minigpt.device.cpu_load import CpuLoad
from minigpt.device.governor import ThreadGovernor
from minigpt.device.runtime import resolve_runtime
from minigpt.device.threads import set_threads, thread_ceiling
from minigpt.fast.timing import Timing
from minigpt.lab.bench.format import table
from minigpt.lab.bench.format import x as _x
from minigpt.lab.bench.techniques import default_model_step
from minigpt.model.config import ModelConfig
from minigpt.training.config import TrainConfig, TrainerConfig
from minigpt.training.step import with_attention_kernel

SETTINGS = ("measured", "fixed")
BUSY_LOOP = "while True: pass"


@contextlib.contextmanager
def competitor() -> Iterator[subprocess.Popen]:
    """A process that keeps one core busy until the block ends."""
    proc = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
    try:
        time.sleep(0.3)  # running, not starting up
        yield proc
    finally:
        proc.kill()
        proc.wait()


def timed_run(step: Callable[[], None], steps: int, tokens: int, setting: str, fixed: int,
              arrival_step: int | None = None) -> dict:
    """`steps` steps of `tokens` tokens as a run with the `setting`'s threads; with `arrival_step`, a
    competitor starts before that step. Returns the seconds per step (after the arrival, if any) and the
    threads used."""
    choice = set_threads(None if setting == "measured" else fixed)
    governor = ThreadGovernor(choice)  # idle for a fixed count, as in a run with device.threads set
    with contextlib.ExitStack() as stack:
        start = time.perf_counter()
        arrived, switched = start, None
        for i in range(steps):
            if i == arrival_step:
                stack.enter_context(competitor())
                arrived = time.perf_counter()
            step()
            governor.step_done(time.perf_counter() - start, tokens)
            if switched is None and governor.changes:
                switched = time.perf_counter() - arrived
        done = steps - (arrival_step or 0)
        return {"step_s": (time.perf_counter() - arrived) / done, "threads": choice.threads,
                "threads_at_end": governor.threads, "switched_after_s": switched}


def bench_busy(quick: bool = False, steps: int = 60, repeats: int = 3) -> dict:
    """Seconds per step of the Llama-style model's training step in each setting (module docstring)."""
    if quick:
        steps, repeats = 6, 1
    runtime = resolve_runtime(DeviceConfig(type="cpu"), probe_cache=Path(DataConfig().cache_dir))
    runtime = with_attention_kernel(runtime, TrainConfig(), 1)  # as the trainer runs the default's attention
    cfg, tc, vocab = ModelConfig(), TrainerConfig(), TokenizerConfig().bpe_vocab_size
    gen = torch.Generator().manual_seed(0)
    batches = torch.randint(0, vocab, (8, tc.batch_size, cfg.block_size + 1), generator=gen)  # (8, B, T + 1)
    step = default_model_step({}, {}, runtime, batches)
    tokens = tc.batch_size * cfg.block_size
    cpu_load, before = CpuLoad(), torch.get_num_threads()
    fixed = thread_ceiling(cpu_load.cpus)[0]
    runs: dict[str, list[dict]] = {f"{load} {s}": [] for load in ("quiet", "busy") for s in SETTINGS}
    runs["arrival measured"] = []
    try:
        timed_run(step, 2, tokens, "fixed", fixed)  # warm-up: allocations, the autocast cache, the optimizer
        for r in range(repeats):
            order = SETTINGS if r % 2 == 0 else SETTINGS[::-1]
            for setting in order:
                runs[f"quiet {setting}"].append(timed_run(step, steps, tokens, setting, fixed))
            with competitor():
                for setting in order:
                    runs[f"busy {setting}"].append(timed_run(step, steps, tokens, setting, fixed))
            runs["arrival measured"].append(timed_run(step, 2 * steps, tokens, "measured", fixed, steps // 2))
    finally:
        torch.set_num_threads(before)
    rows = {name: _summary(r, tokens) for name, r in runs.items()}
    tokens_per_s = {name: row["tokens_per_s"] for name, row in rows.items()}
    return {
        "model": {"n_layer": cfg.n_layer, "n_embd": cfg.n_embd, "vocab_size": vocab,
                  "block_size": cfg.block_size},
        "batch_size": tc.batch_size, "dtype": str(runtime.dtype).removeprefix("torch."), "steps": steps,
        "repeats": repeats, "cores": cpu_load.cores, "fixed_threads": fixed, "rows": rows,
        "kept": {"measured": tokens_per_s["busy measured"] / tokens_per_s["quiet measured"],
                 "fixed": tokens_per_s["busy fixed"] / tokens_per_s["quiet fixed"],
                 "arrival": tokens_per_s["arrival measured"] / tokens_per_s["quiet measured"]},
        "quiet_measured_vs_fixed": tokens_per_s["quiet measured"] / tokens_per_s["quiet fixed"],
    }


def _summary(runs: list[dict], tokens: int) -> dict:
    timing = Timing.from_samples([r["step_s"] for r in runs])
    switched = [r["switched_after_s"] for r in runs if r["switched_after_s"] is not None]
    return {"step_s": timing.to_dict(), "tokens_per_s": tokens / timing.median,
            "threads": sorted({r["threads"] for r in runs}),
            "threads_at_end": sorted({r["threads_at_end"] for r in runs}),
            "switched_after_s": statistics.median(switched) if switched else None}


def format_busy(r: dict) -> list[str]:
    """The section's table: tokens/s alone and beside the competitor, and what each setting keeps."""
    m = r["model"]
    head = (f"Training beside a busy loop (the Llama-style model, `model=demo`: {m['n_layer']} layers x "
            f"{m['n_embd']} wide, vocab {m['vocab_size']}, batch {r['batch_size']} x {m['block_size']}, "
            f"{r['dtype']}; "
            f"{r['steps']} steps per run, median of {r['repeats']} interleaved rounds; {r['cores']} cores): "
            "tokens/s [threads]")
    rows = []
    for setting, label in (("measured", "measured (device.threads unset)"),
                           ("fixed", f"fixed: one per core ({r['fixed_threads']})")):
        quiet, busy = r["rows"][f"quiet {setting}"], r["rows"][f"busy {setting}"]
        rows.append([label, _cell(quiet), _cell(busy), _x(r["kept"][setting])])
    arrival = r["rows"]["arrival measured"]
    after = arrival["switched_after_s"]
    threads = f"threads {arrival['threads']} -> {arrival['threads_at_end']}"
    notes = [f"  quiet, the measured choice runs at {_x(r['quiet_measured_vs_fixed'])} the fixed one",
             f"  a busy loop arriving mid-run: {arrival['tokens_per_s']:,.0f} tokens/s after it came "
             f"({_x(r['kept']['arrival'])} quiet), {threads}"
             + ("" if after is None else f", switched {after:.1f} s after it came")]
    return [head, *table(["threads", "quiet", "one busy loop", "kept"], rows), *notes]


def _cell(row: dict) -> str:
    threads = "/".join(str(t) for t in row["threads"])
    return f"{row['tokens_per_s']:,.0f} [{threads}]"
