"""The ablation lab's measurements: what one trained run of `configs/experiment/ablation/` shows.

`make ablation SEEDS=3` trains every file of the lab with each seed at the same budget of model FLOPs, as one
Hydra multirun; each run is measured here, and the report (ablation_report.py) puts the seeds of one file
together. Everything is measured after training, on the run's final checkpoint and the run's own validation
split, in eval mode, so every run is scored the same way whatever it was trained with. A model trained
with `model.causal=false` is therefore measured causally, as it would be used (gpt.py, "Causality").

- val loss: mean cross-entropy (nats/token) over the trainer's own fixed validation batches (the same
  windows, so it equals the run's last `val/loss`);
- bits per byte: the same nats summed, divided by the UTF-8 bytes of the text they predict and by ln 2,
  so runs with different tokenizers compare (end-of-text tokens are scored but are no text: 0 bytes);
- gradient norm per layer: the L2 norm of d(val loss)/d(parameters of block i), one backward pass;
- attention entropy per layer: the mean entropy (nats) of the attention rows on the first val batch
  (0 = every query looks at one key; ln(t + 1) = uniform over the t + 1 keys query t may see);
- a greedy and a sampled continuation of the first tokens of the val split;
- the loss curves the trainer logged (TensorBoard), and the last training loss (training mode: for
  `causal=false` that is the loss *with* the next token visible);
- the run's row (`runs.RunRecord`: config, seed, budget, machine, tokens, FLOPs, training time, tokens/s,
  and the val loss and bits per byte above).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from minigpt.checkpoint.format import read_meta
from minigpt.checkpoint.load import read_checkpoint
from minigpt.data.eval_windows import eval_batches, eval_windows
from minigpt.data.prepare import PreparedData, load_prepared
from minigpt.errors import UserError
from minigpt.lab.loss_curves import EVENT_GLOB, read_scalars
from minigpt.lab.runs import RunRecord, read_record, sweep_jobs
from minigpt.sampling.decode import generate
from minigpt.sampling.params import SamplingParams

PROMPT_TOKENS = 16  # the continuation prompt: the first tokens of the val split
NEW_TOKENS = 24
SAMPLE_TEMPERATURE = 0.8
SAMPLE_SEED = 0


@dataclass
class RunMeasures:
    """One run of the lab, measured. Plain data, so it round-trips through JSON (`from_dict`)."""

    name: str  # the run's run_name (the ablation file's name)
    run_dir: str
    run: RunRecord  # config, seed, budget, machine, what it cost; its val loss and bits per byte (nats/token)
    model: dict  # the resolved model config
    scored_tokens: int
    scored_bytes: int
    grad_norms: list[float]  # per layer
    attn_entropy: list[float]  # per layer, nats
    prompt: str
    greedy: str
    sample: str
    train_loss: float | None  # the last logged train/loss
    curves: dict[str, list[list]] = field(default_factory=dict)  # tag -> [steps, values]

    @property
    def val_loss(self) -> float:
        return self.run.val_loss

    @property
    def bits_per_byte(self) -> float:
        return self.run.bits_per_byte

    @classmethod
    def from_dict(cls, d: dict) -> RunMeasures:
        return cls(**{**d, "run": RunRecord(**d["run"])})

    def to_dict(self) -> dict:
        return asdict(self)


def find_lab_runs(sweep_dir: Path) -> list[Path]:
    """The run folders of a lab sweep (with checkpoints/last), in job order (0_baseline_seed1337, ...)."""
    return sweep_jobs(sweep_dir, "make ablation")


def run_name(run_dir: Path, meta: dict | None = None) -> str:
    """The run's `run_name` (its ablation file's name), from its last checkpoint's meta.json."""
    meta = read_meta(Path(run_dir) / "checkpoints" / "last") if meta is None else meta
    return meta.get("config", {}).get("run_name") or Path(run_dir).name


def measure_run(run_dir: Path) -> RunMeasures:
    """Load `run_dir`'s last checkpoint and measure it (see the module docstring)."""
    run_dir = Path(run_dir)
    model, tokenizer, meta = read_checkpoint(run_dir)
    model.eval()
    cfg = model.config
    val = _prepared(meta, run_dir).split("val")
    trainer = meta.get("config", {}).get("trainer", {})
    batch_size = trainer.get("batch_size", 16)
    # the trainer's own validation windows: its budget spread over the whole split (eval_tokens; runs from
    # before it existed had eval_batches batches)
    budget = trainer.get("eval_tokens", trainer.get("eval_batches", 8) * batch_size * cfg.block_size)
    budget = None if budget == "all" else budget
    windows = eval_windows(len(val), cfg.block_size, budget)
    evals = list(eval_batches(val, windows, batch_size, token_bytes=tokenizer.token_byte_lengths()))
    batches = [(b.x, b.y) for b in evals]
    nats, tokens, grad_norms = loss_and_layer_grads(model, batches)
    n_bytes = int(sum(int(b.target_bytes.sum()) for b in evals))
    prompt = val.read(0, PROMPT_TOKENS).astype(np.int64).tolist()
    greedy, sample = continuations(model, prompt, tokenizer.vocab_size)
    scalars = read_scalars(run_dir / "tb") if any((run_dir / "tb").glob(EVENT_GLOB)) else {}
    train = scalars.get("train/loss")
    return RunMeasures(
        name=run_name(run_dir, meta), run_dir=str(run_dir),
        run=read_record(run_dir, nats / tokens, nats / max(n_bytes, 1) / math.log(2)),
        model=meta["model_config"], scored_tokens=tokens, scored_bytes=n_bytes, grad_norms=grad_norms,
        attn_entropy=attention_entropy(model, batches[0][0]), prompt=tokenizer.decode(prompt),
        greedy=tokenizer.decode(greedy), sample=tokenizer.decode(sample),
        train_loss=train[1][-1] if train else None,
        curves={tag: [list(s), list(v)] for tag, (s, v) in scalars.items()
                if tag in ("train/loss", "val/loss")},
    )


def loss_and_layer_grads(
    model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]
) -> tuple[float, int, list[float]]:
    """(summed nats, scored tokens, per-layer gradient norms of the mean loss), in eval mode."""
    model.eval()
    model.zero_grad(set_to_none=True)
    counts = [int((y != -1).sum()) for _, y in batches]  # -1: a context-only target, not scored
    total, tokens = 0.0, sum(counts)
    for (x, y), n in zip(batches, counts, strict=True):  # (b, T) each
        _, loss = model(x, y)  # mean over the batch's n scored targets
        (loss * (n / tokens)).backward()  # the gradient of the mean over all batches' tokens
        total += loss.item() * n
    norms = [_grad_norm(block) for block in model.transformer.h]
    model.zero_grad(set_to_none=True)
    return total, tokens, norms


def _grad_norm(module: torch.nn.Module) -> float:
    grads = [p.grad.double().pow(2).sum() for p in module.parameters() if p.grad is not None]
    return float(torch.stack(grads).sum().sqrt()) if grads else 0.0


@torch.no_grad()
def attention_entropy(model: torch.nn.Module, idx: torch.Tensor) -> list[float]:
    """Per layer: the mean over batch, heads and queries of -sum_j p_j ln p_j of the attention rows."""
    out = []
    for probs in model.attention_probs(idx):  # (B, H, T, T) each
        p = probs.double()
        h = -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(-1)  # 0·ln 0 = 0 (masked keys)
        out.append(float(h.mean()))
    return out


def continuations(model: torch.nn.Module, prompt: list[int], vocab_size: int) -> tuple[list[int], list[int]]:
    """(greedy, sampled) continuations of `prompt`, NEW_TOKENS each, with the KV-cached generator; only ids
    below `vocab_size` (the tokenizer's: a model's vocabulary may be padded past it)."""
    out = []
    for temperature in (0.0, SAMPLE_TEMPERATURE):
        gen = torch.Generator().manual_seed(SAMPLE_SEED)
        result = generate(model, [prompt], max_new_tokens=NEW_TOKENS,
                          params=SamplingParams(temperature, vocab_size=vocab_size), generator=gen)
        out.append(result.tokens[0])
    return out[0], out[1]


def reference_losses(run_dir: Path) -> dict[str, float]:
    """What a model that learned nothing scores on the validation split: a uniform guess (ln V) and the train
    split's unigram frequencies (add-one smoothed), which ignore the input entirely."""
    meta = read_meta(Path(run_dir) / "checkpoints" / "last")
    data = _prepared(meta, Path(run_dir))
    vocab = meta["model_config"]["vocab_size"]
    train, val = data.split("train"), data.split("val")
    counts = np.bincount(train.read(0, len(train)), minlength=vocab).astype(np.float64) + 1.0
    targets = np.asarray(val.read(1, len(val) - 1), dtype=np.int64)  # every token but the first
    return {"uniform": math.log(vocab), "unigram": float(-np.log(counts[targets] / counts.sum()).mean())}


def changed_fields(model: dict, baseline: dict) -> dict:
    """The model config entries in which a run differs from the baseline: what the ablation changed."""
    return {k: v for k, v in model.items() if baseline.get(k) != v}


def _prepared(meta: dict, run_dir: Path) -> PreparedData:
    folder = Path(meta.get("data", {}).get("dir", ""))
    if not (folder / "meta.json").is_file():
        raise UserError(f"the prepared data of {run_dir} ({folder}) is gone; prepare it again with the run's "
                        "data and tokenizer settings (scripts/prepare_data.py), then rerun the report")
    return load_prepared(folder)
