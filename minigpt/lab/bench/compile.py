"""Does torch.compile pay for the Llama-style run? The measurement behind device.compile's default on a CPU.

The model, batch and step count of the Llama-style run (the dataclass defaults: TrainConfig(), the BPE
vocabulary), random tokens, the trainer's own step code (training/step.py) and optimizer. Two copies of one
set of weights train side by side, eager and compiled: the compiled one's first step is the compile time; then
steps alternate (eager, compiled, eager, ...), so the steady-state ratio is measured under the same machine
load. Compilation pays when it is won back within the run:

    break_even_steps = compile_s / (eager_step_s - compiled_step_s)     (vs trainer.max_steps)

for a first run (Inductor's on-disk cache empty) and for a later one (the cache filled by the first).
"""

from __future__ import annotations

import dataclasses
import tempfile

import torch
import torch._dynamo
from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

from minigpt.device.config import DeviceConfig
from minigpt.device.runtime import resolve_runtime
from minigpt.fast.timing import interleave, time_call
from minigpt.model.factory import build_model
from minigpt.training.budget import Budget
from minigpt.training.config import TrainConfig
from minigpt.training.optim import LRSchedule, build_optimizer
from minigpt.training.step import accumulate_gradients, optimizer_step


def bench_compile(device: torch.device, *, repeats: int = 10, quick: bool = False) -> dict:
    """Compile time, eager vs compiled step time of the Llama-style model, and the break-even step count."""
    cfg = TrainConfig()
    tc = cfg.trainer
    batch, block = tc.batch_size, cfg.model.block_size
    if quick:  # the same run, fewer timed steps: the compile time dominates either way
        repeats = 2
    vocab = cfg.tokenizer.bpe_vocab_size
    model_cfg = dataclasses.replace(cfg.model, vocab_size=vocab)
    runtime = resolve_runtime(DeviceConfig(type=device.type, dtype="float32", compile=False))
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (8, batch, block + 1), generator=gen).to(device)  # a pool of batches
    steps = {}
    for name in ("eager", "compiled", "compiled again"):
        torch.manual_seed(0)
        model = build_model(model_cfg).to(device).train()
        run = torch.compile(model) if name != "eager" else model
        optimizer = build_optimizer(model, cfg.optim, device.type)
        schedule = LRSchedule(cfg.optim, Budget(max_steps=tc.max_steps))
        steps[name] = _step_fn(run, model, optimizer, schedule, tokens, runtime, cfg.optim.grad_clip)
    # The first call compiles forward and backward: into an empty cache folder, as a first run does; then a
    # second copy compiles again with what the first left in that folder, as every later run of the same model
    # does (Inductor keeps its compiled graphs on disk, in /tmp/torchinductor_<user> by default).
    # torch._dynamo.reset() before each forgets what this process compiled, as a new process would.
    with tempfile.TemporaryDirectory(prefix="minigpt-bench-inductor-") as tmp, temporary_cache_dir(tmp):
        torch._dynamo.reset()
        compile_s = time_call(steps.pop("compiled"), device)
        torch._dynamo.reset()  # the first copy would now compile again: the second one is timed from here on
        compile_warm_s = time_call(steps["compiled again"], device)
    steps["compiled"] = steps.pop("compiled again")
    steps["eager"]()  # the eager copy's first step, untimed likewise: both have taken one step
    timings = interleave(steps, repeats=repeats, warmup=1, device=device)
    eager, compiled = timings["eager"].median, timings["compiled"].median
    gain = eager - compiled
    even = lambda seconds: seconds / gain if gain > 0 else None  # None: compiled steps are not faster
    return {
        "model": {k: getattr(model_cfg, k) for k in ("n_layer", "n_head", "n_embd", "block_size",
                                                     "vocab_size")},
        "batch_size": batch, "max_steps": tc.max_steps, "compile_s": compile_s,
        "compile_warm_s": compile_warm_s,
        "eager_step_s": timings["eager"].to_dict(), "compiled_step_s": timings["compiled"].to_dict(),
        "speedup": eager / compiled, "break_even_steps": even(compile_s),
        "break_even_steps_warm": even(compile_warm_s),
    }


def _step_fn(run, model, optimizer, schedule, tokens, runtime, grad_clip: float):
    counter, step_counter = iter(range(10**9)), iter(range(10**9))
    scaler = runtime.grad_scaler()

    def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
        b = tokens[next(counter) % tokens.shape[0]]  # (B, T + 1)
        return b[:, :-1], b[:, 1:]

    def step() -> None:
        accumulate_gradients(run, next_batch, 1, runtime, scaler)
        schedule.apply(optimizer, next(step_counter), 0.0, 0)
        optimizer_step(model, optimizer, scaler, grad_clip)

    return step
