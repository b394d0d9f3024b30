"""How fast the side-by-side's two arms train on this machine: tokens per second of each, timed interleaved.

At equal tokens the side-by-side compares what each recipe learns; at equal time what matters is also how many
tokens each trains per second. `throughput` times calls of a few training steps of each arm (batches drawn,
forward, backward, update, as its own training does), alternating the arms so that a machine that slows down
or speeds up affects both, at each thread count asked; an arm trains at its best one.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from minigpt.data.loader import BatchLoader
from minigpt.data.prepare import PreparedData, prepare_dataset
from minigpt.device.runtime import resolve_runtime
from minigpt.fast.timing import interleave
from minigpt.lab.config import SideBySideConfig
from minigpt.lab.side_by_side import ReferenceRun, import_reference
from minigpt.model.factory import build_model
from minigpt.training.budget import Budget
from minigpt.training.config import TrainConfig
from minigpt.training.optim import LRSchedule, build_optimizer
from minigpt.training.seeding import seed_everything
from minigpt.training.step import accumulate_gradients, optimizer_step, with_attention_kernel

log = logging.getLogger(__name__)


def minigpt_steps(cfg: TrainConfig, data: PreparedData, seed: int):
    """A function running one training step of the minigpt arm as its trainer runs them (autocast and
    attention kernel as the device chooses, fused loss, clipping, the optimizer and schedule of `cfg.optim`)
    on its batches."""
    runtime = with_attention_kernel(resolve_runtime(cfg.device, probe_cache=Path(cfg.data.cache_dir)), cfg, 1)
    seed_everything(seed)
    model = build_model(cfg.model, vocab_size=data.vocab_size).to(runtime.device)
    optimizer = build_optimizer(model, cfg.optim, runtime.type, autocast_dtype=runtime.dtype)
    schedule, scaler = LRSchedule(cfg.optim, Budget(max_steps=cfg.trainer.max_steps)), runtime.grad_scaler()
    loader = BatchLoader(data.split("train"), cfg.model.block_size, cfg.trainer.batch_size, seed=seed,
                         device=str(runtime.device))
    counter = iter(range(10**12))

    def step() -> None:
        model.train()
        schedule.apply(optimizer, next(counter) % cfg.trainer.max_steps, 0.0, 0)
        accumulate_gradients(model, loader.next_batch, 1, runtime, scaler)
        optimizer_step(model, optimizer, scaler, cfg.optim.grad_clip)

    return step


def throughput(cfg: SideBySideConfig) -> dict:
    """Training tokens per second of each arm at each of `cfg.threads`: calls of `timed_steps` steps (batches
    drawn, forward, backward, update), the arms interleaved, `repeats` calls each after one untimed; the
    median call counts. The best thread count of each arm is what it would train at."""
    gpt = import_reference(cfg.reference_path, cfg.reference.compile_optimizer)
    data = prepare_dataset(cfg.minigpt.data, cfg.minigpt.tokenizer, progress=False)
    tc, block = cfg.minigpt.trainer, cfg.minigpt.model.block_size
    seed, n = cfg.seeds[0], cfg.timed_steps
    tokens = n * tc.batch_size * block
    rows: dict[str, dict[str, float]] = {"reference": {}, "minigpt": {}}
    for threads in cfg.threads:
        torch.set_num_threads(threads)
        run = ReferenceRun(gpt, cfg.reference, data, block, tc.batch_size, seed, tc.max_steps)
        steps = {"reference": run.step, "minigpt": minigpt_steps(cfg.minigpt, data, seed)}
        calls = {arm: lambda step=step: [step() for _ in range(n)] for arm, step in steps.items()}
        for arm, timing in interleave(calls, cfg.repeats, warmup=1).items():
            rows[arm][str(threads)] = tokens / timing.median
            log.info("%s at %d threads: %.0f tokens/s", arm, threads, tokens / timing.median)
    best = {arm: max(by_threads.items(), key=lambda kv: kv[1]) for arm, by_threads in rows.items()}
    return {"tokens_per_s": rows, "best": {arm: {"threads": int(t), "tokens_per_s": v} for arm, (t, v) in
                                           best.items()},
            "timed_steps": n, "repeats": cfg.repeats, "batch": [tc.batch_size, block]}


def render_throughput(doc: dict) -> str:
    """Tokens per second by thread count, and each arm's best, as a Markdown table."""
    rows = doc["tokens_per_s"]
    threads = sorted({int(t) for by_threads in rows.values() for t in by_threads})
    lines = ["| threads | reference: tokens/s | minigpt: tokens/s | minigpt / reference |",
             "|---|---|---|---|"]
    for t in threads:
        r, m = rows["reference"].get(str(t)), rows["minigpt"].get(str(t))
        lines.append(f"| {t} | {r:,.0f} | {m:,.0f} | {m / r:.2f}x |")
    r, m = doc["best"]["reference"], doc["best"]["minigpt"]
    lines.append(f"| best | {r['tokens_per_s']:,.0f} ({r['threads']} threads) | {m['tokens_per_s']:,.0f} "
                 f"({m['threads']} threads) | {m['tokens_per_s'] / r['tokens_per_s']:.2f}x |")
    return "\n".join(lines)
