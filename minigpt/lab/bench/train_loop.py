"""Sustained training throughput with the trainer's own step code: tokens/s and MFU over many steps.

Where train_step.py times single steps against a reference, this runs the real training step
(`training/step.py`: autocast, backward, clip, fused AdamW, schedule) for a couple of hundred steps on
random tokens, the way `scripts/train.py` would with `device=cuda`: bf16 autocast, `torch.compile`,
SDPA (flash) attention. The shape defaults to GPT-2 small (124M); `scripts/device_check.sh` runs it on
a GPU and reports MFU against the datasheet peak. `smoke=True` shrinks everything to run on a CPU in
seconds (the numbers then only show that the path works).
"""

from __future__ import annotations

import dataclasses
import time

import torch

from minigpt.device.config import DeviceConfig
from minigpt.device.runtime import datasheet_tflops, peak_flops, resolve_runtime
from minigpt.lab.bench.reference import gpt2_like_config
from minigpt.model.factory import build_model
from minigpt.training.budget import Budget
from minigpt.training.config import OptimConfig, TrainConfig, TrainerConfig
from minigpt.training.optim import LRSchedule, build_optimizer
from minigpt.training.step import accumulate_gradients, optimizer_step, with_attention_kernel

GPT2_SMALL = {"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50304, "block_size": 1024}
SMOKE = {"n_layer": 2, "n_head": 2, "n_embd": 64, "vocab_size": 512, "block_size": 64}


def bench_train_loop(device: torch.device, *, smoke: bool = False, steps: int = 200, warmup_steps: int = 10,
                     batch_size: int = 16, compile_: bool | None = None, dtype: str = "auto") -> dict:
    """Time `steps` steps (after `warmup_steps` untimed ones, compilation included) on random tokens.

    dtype and compile_ default to what the trainer picks for the device (`device/runtime.py`): on CUDA
    bf16 autocast and torch.compile."""
    shape = SMOKE if smoke else GPT2_SMALL
    if smoke:
        steps, warmup_steps, batch_size = min(steps, 6), min(warmup_steps, 2), min(batch_size, 4)
    # exact GELU by default; GPT-2's tanh form costs the same
    cfg = dataclasses.replace(gpt2_like_config(**shape), attention="sdpa")
    device_cfg = DeviceConfig(type=device.type, dtype=dtype, compile=compile_)
    run = TrainConfig(model=cfg, trainer=dataclasses.replace(TrainerConfig(), batch_size=batch_size))
    runtime = with_attention_kernel(resolve_runtime(device_cfg), run, 1)  # the kernel the trainer would pick
    torch.manual_seed(0)
    model = build_model(cfg).to(runtime.device)
    train_model = torch.compile(model) if runtime.compile else model
    optim_cfg = OptimConfig(name="adamw", lr=6e-4, warmup_steps=warmup_steps)
    optimizer = build_optimizer(model, optim_cfg, runtime.type, autocast_dtype=runtime.dtype)
    schedule = LRSchedule(optim_cfg, Budget(max_steps=steps + warmup_steps))
    scaler = runtime.grad_scaler()
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, shape["vocab_size"], (64, batch_size, shape["block_size"] + 1), generator=gen)
    tokens = tokens.to(runtime.device)  # a pool of batches already on the device: the loader is not timed
    counter, step_counter = iter(range(10**9)), iter(range(10**9))

    def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
        b = tokens[next(counter) % tokens.shape[0]]  # (B, T + 1)
        return b[:, :-1], b[:, 1:]

    def step() -> torch.Tensor:
        train_model.train()
        loss = accumulate_gradients(train_model, next_batch, 1, runtime, scaler)
        schedule.apply(optimizer, next(step_counter), 0.0, 0)
        optimizer_step(model, optimizer, scaler, grad_clip=1.0)
        return loss

    start = time.perf_counter()
    for _ in range(warmup_steps):
        first_loss = step()
    runtime.synchronize()
    warmup_s = time.perf_counter() - start
    if runtime.type == "cuda":
        torch.cuda.reset_peak_memory_stats(runtime.device)
    start = time.perf_counter()
    for _ in range(steps):
        loss = step()
    runtime.synchronize()
    elapsed = time.perf_counter() - start
    tokens_per_s = steps * batch_size * shape["block_size"] / elapsed
    flops = model.flops_per_token() * tokens_per_s
    sheet = datasheet_tflops(runtime.device)
    peak = peak_flops(device_cfg, runtime)
    return {
        "shape": shape, "batch_size": batch_size, "steps": steps, "warmup_steps": warmup_steps,
        "dtype": str(runtime.dtype).removeprefix("torch."), "compile": runtime.compile,
        "attention": cfg.attention, "params": model.num_params(non_embedding=False),
        "warmup_s": warmup_s, "step_s": elapsed / steps, "tokens_per_s": tokens_per_s,
        "model_flops_per_s": flops, "peak_flops": peak, "peak_source": "datasheet" if sheet else "measured",
        "mfu": flops / peak, "loss_first": first_loss.item(), "loss_last": loss.item(),
        "peak_mem_bytes": torch.cuda.max_memory_allocated(runtime.device) if runtime.type == "cuda" else None,
    }
