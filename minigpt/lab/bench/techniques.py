"""What each technique switch costs per training step on the Llama-style model (`model=demo`).

A technique that adds work per token (QK-norm's norms, the value-embedding lookups and gates, Muon's
orthogonalisations) must win at equal training *time*, not only at equal tokens. This section times the
trainer's own step (`training/step.py`: autocast as the trainer picks it, fused loss, backward, clipping,
the optimizer from `build_optimizer`) of the Llama-style model (`ModelConfig()`, the default vocabulary and
batch) with each switch on, interleaved with the default, and reports each one's step time relative to the
default's. A ratio r means a run with the switch fits 1/r of the default's steps into the same time
(docs/tricks.md uses it for its equal-time rows).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from minigpt.data.config import DataConfig, TokenizerConfig
from minigpt.device.config import DeviceConfig
from minigpt.device.runtime import resolve_runtime
from minigpt.fast.timing import interleave
from minigpt.model.config import ModelConfig
from minigpt.model.factory import build_model
from minigpt.training.budget import Budget
from minigpt.training.config import OptimConfig, TrainConfig, TrainerConfig
from minigpt.training.optim import LRSchedule, build_optimizer
from minigpt.training.step import accumulate_gradients, optimizer_step, with_attention_kernel

# contender -> (ModelConfig overrides, OptimConfig overrides)
TECHNIQUES: dict[str, tuple[dict, dict]] = {
    "default": ({}, {}),
    "qk_norm": ({"qk_norm": True}, {}),
    "relu2": ({"activation": "relu2"}, {}),
    "zero_init_proj": ({"zero_init_proj": True}, {}),
    "value_embeds": ({"value_embeds": True}, {}),
    "smear": ({"smear": True}, {}),
    "bigram_embed": ({"bigram_embed": 16384}, {}),
    "logit_softcap": ({"logit_softcap": 15.0}, {}),
    "adamw": ({}, {"name": "adamw"}),  # the default's Muon replaced by AdamW for the matrices too
    "combined": ({"qk_norm": True, "activation": "relu2", "value_embeds": True}, {}),
    # the vocabulary changes the head's FLOPs per token (and the text per token: compare bits per byte)
    "vocab_2048": ({"vocab_size": 2048}, {}),
    "vocab_8192": ({"vocab_size": 8192}, {}),
}


def default_model_step(model_overrides: dict, optim_overrides: dict, runtime, batches: torch.Tensor):
    """One trainer step of the Llama-style model with the overrides, on a pool of fixed batches."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(**{"vocab_size": TokenizerConfig().bpe_vocab_size, **model_overrides}))
    model.to(runtime.device)
    cfg = OptimConfig(**optim_overrides)
    optimizer = build_optimizer(model, cfg, runtime.type, autocast_dtype=runtime.dtype)
    schedule, scaler = LRSchedule(cfg, Budget(max_steps=10**9)), runtime.grad_scaler()
    counter = iter(range(10**12))

    def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
        b = batches[next(counter) % batches.shape[0]]  # (B, T + 1)
        return b[:, :-1], b[:, 1:]

    def step() -> None:
        model.train()
        accumulate_gradients(model, next_batch, 1, runtime, scaler)
        schedule.apply(optimizer, 1000, 0.0, 0)
        optimizer_step(model, optimizer, scaler, cfg.grad_clip)

    return step


def bench_techniques(device: torch.device, quick: bool = False, repeats: int = 20,
                     steps_per_call: int = 5) -> dict:
    """Median seconds per step of each contender (interleaved calls of `steps_per_call` steps) and the
    ratio to the default's, in wall time and in this process's CPU time."""
    runtime = resolve_runtime(DeviceConfig(type=device.type), probe_cache=Path(DataConfig().cache_dir))
    runtime = with_attention_kernel(runtime, TrainConfig(), 1)  # every contender's attention has this shape
    cfg, tc = ModelConfig(), TrainerConfig()
    if quick:
        repeats, steps_per_call = 3, 2
    vocab = TokenizerConfig().bpe_vocab_size
    n_ids = min(m.get("vocab_size", vocab) for m, _ in TECHNIQUES.values())  # ids every contender embeds
    gen = torch.Generator().manual_seed(0)
    batches = torch.randint(0, n_ids, (8, tc.batch_size, cfg.block_size + 1), generator=gen)  # (8, B, T + 1)
    batches = batches.to(runtime.device)
    steps = {name: default_model_step(m, o, runtime, batches) for name, (m, o) in TECHNIQUES.items()}

    # CPU seconds of this process per call beside the wall time: on a CPU shared with other jobs the wall
    # time also counts the time the scheduler gave them, the CPU time (with threads=1) counts only the work
    cpu: dict[str, list[float]] = {name: [] for name in steps}

    def calls(name, step):
        def call():
            start = time.process_time()
            for _ in range(steps_per_call):
                step()
            cpu[name].append((time.process_time() - start) / steps_per_call)
        return call

    timings = interleave({name: calls(name, step) for name, step in steps.items()}, repeats, warmup=2,
                         device=runtime.device)
    base, base_cpu = timings["default"].median, statistics.median(cpu["default"])
    tokens = tc.batch_size * cfg.block_size * steps_per_call
    rows = {name: {"step_s": t.median / steps_per_call, "min_s": t.min / steps_per_call,
                   "max_s": t.max / steps_per_call, "ratio": t.median / base,
                   "tokens_per_s": tokens / t.median, "cpu_s": statistics.median(cpu[name]),
                   "cpu_ratio": statistics.median(cpu[name]) / base_cpu}
            for name, t in timings.items()}
    return {"dtype": str(runtime.dtype).removeprefix("torch."), "batch_size": tc.batch_size,
            "block_size": cfg.block_size, "vocab_size": vocab, "repeats": repeats,
            "steps_per_call": steps_per_call, "threads": torch.get_num_threads(), "rows": rows}
