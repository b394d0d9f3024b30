"""Training-step throughput: minigpt against the Hugging Face reference on the same weights.

A step is the whole thing a trainer does per batch: forward, cross-entropy, backward, AdamW update,
zeroing the gradients. Every contender starts from the same weights and trains on the same random
batch; the reference's loss is computed exactly as minigpt's simple path computes it (cross-entropy
over all B·T logits), so both do the same arithmetic. Contenders, each in fp32 and under bf16 autocast
(weights and optimizer in fp32), so that every table compares best with best:

- `minigpt <dtype> simple`  the textbook path: full logits, F.cross_entropy, torch's default AdamW
- `minigpt <dtype>`         what the trainer runs (training/step.py, training/optim.py): the loss fused
                            with the output head (model/chunked_loss.py, also under autocast), the
                            optimizer from `build_optimizer` (fused AdamW)
- `reference <dtype>`       transformers' GPT2LMHeadModel (SDPA attention) + torch's default AdamW
- `minigpt compile <dtype>` the trainer's path, torch.compile'd; the compile time is reported
                            separately and excluded from the step time

Ratios: `vs ref fp32`, and `vs best ref`: against the faster of the reference's eager settings in this run.
MFU = achieved model FLOP/s (6·N + attention per token, `GPT.flops_per_token`) / the peak of the dtype the
matmuls run in (bench/peak.py: measured, or the datasheet's bf16 figure on a known GPU); a row faster than
its measured peak raises that peak (noted), so no MFU exceeds 100%. Peak memory is taken during the first
(untimed, warm-up) step of each contender, which also allocates the optimizer state.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minigpt.fast.timing import interleave, time_call
from minigpt.lab.bench.peak import dtype_peak_flops, effective_peak
from minigpt.lab.bench.reference import gpt2_like_config, logits_agree, reference_model
from minigpt.lab.bench.resources import peak_memory_bytes
from minigpt.model.factory import build_model
from minigpt.model.gpt import GPT
from minigpt.training.config import OptimConfig
from minigpt.training.optim import build_optimizer


@dataclass(frozen=True)
class TrainShape:
    name: str
    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int
    block_size: int
    batch_size: int


SHAPES = {
    "S": TrainShape("S", n_layer=4, n_head=4, n_embd=256, vocab_size=4096, block_size=256, batch_size=16),
    "M": TrainShape("M", n_layer=6, n_head=6, n_embd=384, vocab_size=50304, block_size=256, batch_size=8),
}
QUICK_SHAPES = {  # `quick=true`: the same architecture, small enough for seconds
    "S": TrainShape("S", n_layer=2, n_head=4, n_embd=128, vocab_size=4096, block_size=128, batch_size=8),
    "M": TrainShape("M", n_layer=2, n_head=6, n_embd=192, vocab_size=50304, block_size=128, batch_size=4),
}

LR, BETAS, WEIGHT_DECAY = 1e-4, (0.9, 0.95), 0.1


def _adamw(model: torch.nn.Module) -> torch.optim.AdamW:
    """torch's AdamW with its defaults (the for-loop implementation on CPU), for the simple paths."""
    return torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)


def _trainer_adamw(model: torch.nn.Module, device: torch.device) -> torch.optim.Optimizer:
    """The trainer's optimizer (parameter groups, fused where supported), same hyperparameters."""
    cfg = OptimConfig(name="adamw", lr=LR, beta1=BETAS[0], beta2=BETAS[1], weight_decay=WEIGHT_DECAY)
    return build_optimizer(model, cfg, device.type)


def make_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
    autocast_dtype: torch.dtype | None, hf: bool, fused_loss: bool = False,
) -> Callable[[], torch.Tensor]:
    """A closure running one full training step on (x, y); returns the loss tensor.

    fused_loss: call the model as the trainer does, `model(x, y, return_logits=False)`."""
    device_type = x.device.type

    def step() -> torch.Tensor:
        ctx = (torch.autocast(device_type, dtype=autocast_dtype) if autocast_dtype is not None
               else contextlib.nullcontext())
        with ctx:
            if hf:
                logits = model(input_ids=x).logits  # (B, T, V)
                loss = F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), y.view(-1))
            elif fused_loss:
                _, loss = model(x, y, return_logits=False)
            else:
                _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def build_contenders(
    shape: TrainShape, names: tuple[str, ...], device: torch.device,
) -> tuple[dict[str, Callable[[], torch.Tensor]], dict[str, float], GPT]:
    """The step closures for `names`, each with its own copy of one set of weights; plus compile times."""
    cfg = gpt2_like_config(shape.n_layer, shape.n_head, shape.n_embd, shape.vocab_size, shape.block_size)
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    base = build_model(cfg).to(device)
    x = torch.randint(0, shape.vocab_size, (shape.batch_size, shape.block_size), generator=gen).to(device)
    y = torch.randint(0, shape.vocab_size, (shape.batch_size, shape.block_size), generator=gen).to(device)
    steps: dict[str, Callable[[], torch.Tensor]] = {}
    compile_s: dict[str, float] = {}
    for name in names:
        dtype = torch.bfloat16 if contender_dtype(name) == "bfloat16" else None
        if name.startswith("reference"):
            ref = reference_model(base).train()
            logits_agree(base, ref, x[:1, :32], atol=1e-3)
            steps[name] = make_step(ref, _adamw(ref), x, y, dtype, hf=True)
            continue
        model = build_model(cfg).to(device)
        model.load_state_dict(base.state_dict())
        model.train()
        if name.endswith("simple"):
            steps[name] = make_step(model, _adamw(model), x, y, dtype, hf=False)
            continue
        opt = _trainer_adamw(model, device)
        if "compile" in name:
            step = make_step(torch.compile(model), opt, x, y, dtype, hf=False, fused_loss=True)
            compile_s[name] = time_call(step, device)  # the first call compiles (forward and backward)
        else:
            step = make_step(model, opt, x, y, dtype, hf=False, fused_loss=True)
        steps[name] = step
    return steps, compile_s, base


def contender_dtype(name: str) -> str:
    """"minigpt bf16 simple" -> "bfloat16"; the dtype the contender's matmuls run in."""
    return "bfloat16" if "bf16" in name.split() else "float32"


def bench_train_step(
    shape: TrainShape, names: tuple[str, ...], device: torch.device, peak: dict, repeats: int,
) -> dict:
    """Tokens/s, step time, MFU and peak memory of each contender on `shape`; ratios to the reference."""
    steps, compile_s, base = build_contenders(shape, names, device)
    start = time.perf_counter()
    memory = {name: peak_memory_bytes(step, device) for name, step in steps.items()}  # also the warm-up
    timings = interleave(steps, repeats=repeats, warmup=0, device=device)
    tokens = shape.batch_size * shape.block_size
    flops = base.flops_per_token() * tokens
    achieved = {name: flops / t.median for name, t in timings.items()}  # model FLOP/s
    peaks, notes = {}, []
    for dtype in sorted({contender_dtype(n) for n in timings}):
        measured = dtype_peak_flops(peak, dtype)
        peaks[dtype], raised = effective_peak(measured, [a for n, a in achieved.items()
                                                          if contender_dtype(n) == dtype])
        if raised:
            notes.append(f"{dtype} peak raised from the measured {measured / 1e9:.1f} to "
                         f"{peaks[dtype] / 1e9:.1f} GFLOP/s: a step ran faster than the matmul measurement "
                         "(a busy moment?)")
    rows = {}
    for name, t in timings.items():
        dtype = contender_dtype(name)
        rows[name] = {
            "dtype": dtype, "step_s": t.to_dict(), "tokens_per_s": tokens / t.median,
            "mfu": achieved[name] / peaks[dtype], "peak_mem_bytes": memory[name],
            "compile_s": compile_s.get(name),
        }
    refs = [row["tokens_per_s"] for name, row in rows.items() if name.startswith("reference")]
    for row in rows.values():
        if "reference fp32" in rows:
            row["speedup_vs_reference"] = row["tokens_per_s"] / rows["reference fp32"]["tokens_per_s"]
        if refs:
            row["speedup_vs_best_reference"] = row["tokens_per_s"] / max(refs)
    return {"shape": vars(shape).copy(), "tokens_per_step": tokens, "flops_per_token": base.flops_per_token(),
            "peak_flops": peaks, "timed_s": time.perf_counter() - start, "contenders": rows, "notes": notes}
