"""The shape walk: every tensor shape of one forward pass, in data-flow order, observed on the real model.

Nothing here is a hand-written table. One forward pass runs with
- forward pre-hooks and hooks on every module: the order modules start in, and each output's shape;
- a TorchFunctionMode: every tensor operation a minigpt module runs itself (outside its child
  modules) is attributed to its source line, so the walk shows the lines that add the positional
  encoding, make Q/K/V, split the heads, score, softmax, weigh the values, concatenate the heads
  and add the residuals — printed beside the line's own `# (B, H, T, D)` comment, so a wrong
  comment would stand out;
- PyTorch's own FLOP counter (`torch.utils.flop_counter.FlopCounterMode`) counts every matrix multiply
  as it runs (2 per multiply-add) and charges it to every module that is running, so each row shows what
  it really computed.
Attention runs through the `math` backend for the walk (the only one that materialises the (T, T)
scores); it is restored afterwards.
"""

from __future__ import annotations

import linecache
import os
import sys
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.flop_counter import FlopCounterMode

from minigpt.model.attention import CausalSelfAttention
from minigpt.model.ffn import ffn_hidden_size
from minigpt.model.gpt import GPT


@dataclass
class Stage:
    """One row of the walk: a module (kind = its class name) or a line of minigpt source (kind 'line')."""

    name: str
    kind: str
    depth: int
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    params: int = 0  # parameters owned by the module and its children (0 for lines)
    flops: int = 0  # forward matmul FLOPs measured in this module, whole batch


@dataclass
class ShapeWalk:
    stages: list[Stage]
    dims: dict[str, int]  # the legend: B, T, C, H, H_kv, D, V, L, F (FFN hidden)
    total_params: int
    forward_flops: int  # measured, whole batch
    train_flops_per_token: int  # the model's own 6N + 12LCT estimate (what MFU uses)


class _SourceLineOps(TorchFunctionMode):
    """Sees every torch call of the forward pass and attributes the ops a minigpt module runs itself (not
    inside a child module) to its source lines.

    The lines are what shows the stages that are not modules: embedding + PE, Q/K/V, heads, scores,
    weights·V, the concatenation, the residual additions.
    """

    def __init__(self, walk: list[Stage], module_stack: list[nn.Module]) -> None:
        super().__init__()
        self.walk, self.module_stack = walk, module_stack

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        module = self.module_stack[-1] if self.module_stack else None
        file = _minigpt_source(module)
        if file is None:
            return out  # inside nn.Linear, nn.LayerNorm, ...: those have their own module rows
        tensors = out if isinstance(out, (tuple, list)) else (out,)
        if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
            return out  # x.shape, x.dim() and friends
        if getattr(func, "__name__", "") == "detach":
            return out  # bookkeeping (the recorded probabilities), not data flow
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename != file:
            frame = frame.f_back  # skip torch's wrappers; ops in helpers (rope.py) count for the calling line
        if frame is None:
            return out
        code = linecache.getline(file, frame.f_lineno).strip()
        name = f"{os.path.basename(file)}:{frame.f_lineno}  {code}"
        shapes = [tuple(t.shape) for t in tensors]
        depth = len(self.module_stack) - 1  # the root GPT is on the stack but has no row
        last = self.walk[-1]
        if last.kind == "line" and last.name == name and last.depth == depth:
            last.shapes = shapes  # several ops on one line: the line's result is the last one
        else:
            self.walk.append(Stage(name, "line", depth, shapes))
        return out


def _minigpt_source(module: nn.Module | None) -> str | None:
    """The source file of a minigpt module's class; None for torch's own modules."""
    if module is None or not type(module).__module__.startswith("minigpt."):
        return None
    return sys.modules[type(module).__module__].__file__


def walk_shapes(model: GPT, batch_size: int = 2, seq_len: int | None = None) -> ShapeWalk:
    """Run one forward pass of random ids (B, T) through `model` and record every stage."""
    cfg = model.config
    T = min(seq_len or cfg.block_size, cfg.block_size)
    device = next(model.parameters()).device
    idx = torch.randint(0, cfg.vocab_size, (batch_size, T), device=device)  # (B, T)
    stages = [Stage("ids", "input", 0, [tuple(idx.shape)])]
    names = {m: n for n, m in model.named_modules()}
    stack: list[nn.Module] = []
    rows: dict[nn.Module, Stage] = {}

    def pre_hook(module: nn.Module, _inputs) -> None:
        if module is not model:  # the root's output is the logits row at the end
            stage = Stage(names[module], type(module).__name__, len(stack) - 1, params=_count(module))
            stages.append(stage)
            rows[module] = stage  # a module called twice (never in GPT) would keep its last call
        stack.append(module)

    def post_hook(module: nn.Module, _inputs, output) -> None:
        stack.pop()
        if module is model:
            return
        outs = output if isinstance(output, (tuple, list)) else (output,)
        rows[module].shapes = [tuple(o.shape) for o in outs if isinstance(o, torch.Tensor)]

    handles = []
    for module in model.modules():
        handles += [module.register_forward_pre_hook(pre_hook), module.register_forward_hook(post_hook)]
    attns = [m for m in model.modules() if isinstance(m, CausalSelfAttention)]
    was_training = model.training
    try:
        for a in attns:
            a.record_probs = True  # route through the math backend, where the scores exist
        model.eval()
        counter = FlopCounterMode(display=False)  # keys: "GPT.<module name>"
        with torch.no_grad(), counter, _SourceLineOps(stages, stack):
            logits, _ = model(idx)
    finally:
        for h in handles:
            h.remove()
        for a in attns:
            a.record_probs, a.probs = False, None
        model.train(was_training)
    stages.append(Stage("logits", "output", 0, [tuple(logits.shape)]))
    per_module = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
    for module, stage in rows.items():
        stage.flops = per_module.get(f"{type(model).__name__}.{names[module]}", 0)
    dims = {"B": batch_size, "T": T, "C": cfg.n_embd, "H": cfg.n_head, "H_kv": cfg.kv_heads,
            "D": cfg.head_dim, "V": cfg.vocab_size, "L": cfg.n_layer, "F": ffn_hidden_size(cfg)}
    return ShapeWalk(stages, dims, model.num_params(non_embedding=False), counter.get_total_flops(),
                     model.flops_per_token())


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def symbolic(shape: tuple[int, ...], dims: dict[str, int]) -> str:
    """(2, 4, 16, 32) -> '(B, H, T, D)': each size named by the one dimension it equals, else the number.

    Sizes that equal several dimensions are resolved by position where that is safe (the batch is
    always first), and left as numbers otherwise.
    """
    names = {k: v for k, v in dims.items() if k != "L"}
    derived = {"D/2": dims["D"] // 2, "3C": 3 * dims["C"]}  # rope tables, the fused QKV projection
    parts = []
    for i, size in enumerate(shape):
        # a derived name only where no dimension fits: (T, D/2) for rope tables, 3C for the fused QKV
        matches = [k for k, v in names.items() if v == size] or [k for k, v in derived.items() if v == size]
        if "H" in matches and "H_kv" in matches:
            matches.remove("H_kv")  # plain multi-head attention: H_kv is H
        if len(matches) > 1 and "B" in matches:
            matches = ["B"] if i == 0 and len(shape) > 1 else [m for m in matches if m != "B"]
        parts.append(matches[0] if len(matches) == 1 else str(size))
    return "(" + ", ".join(parts) + ")"


def format_walk(walk: ShapeWalk) -> str:
    """The walk as a text table: stage, observed shape(s), symbolic shape, parameters, FLOPs."""
    d = walk.dims
    legend = "  ".join(f"{k}={v}" for k, v in d.items())
    lines = [f"legend: {legend}   (F = FFN hidden width)", ""]
    header = f"{'stage':<46} {'shape':<26} {'symbolic':<20} {'params':>10} {'fwd FLOPs':>11}  source"
    lines += [header, "-" * len(header)]
    for s in walk.stages:
        code = ""
        if s.kind == "line":
            where, code = s.name.split("  ", 1)
            label = "  " * s.depth + where
        else:
            label = "  " * s.depth + f"{s.name} [{s.kind}]"
        distinct = list(dict.fromkeys(s.shapes))
        shape = " ".join(map(str, distinct))
        if len(distinct) == 1 < len(s.shapes):
            shape += f" x{len(s.shapes)}"  # q, k, v of one size
        sym = " ".join(symbolic(sh, d) for sh in distinct)
        params = f"{s.params:,}" if s.params else ""
        flops = f"{s.flops:,}" if s.flops else ""
        lines.append(f"{label:<46} {shape:<26} {sym:<20} {params:>10} {flops:>11}  {code}".rstrip())
    tokens = d["B"] * d["T"]
    lines += [
        "",
        f"parameters: {walk.total_params:,} (tied weights counted once)",
        f"forward FLOPs per token, measured: {walk.forward_flops / tokens:,.0f} (matmuls, T={d['T']})",
        f"training FLOPs per token (fwd + bwd, model.flops_per_token): {walk.train_flops_per_token:,}",
    ]
    return "\n".join(lines)
