"""The side-by-side: another project's small-GPT recipe trained on minigpt's bins and batches, and scored.

A claim that one recipe beats another is only as good as the sameness of everything else. The reference
recipe, nanochat's model and its Muon + AdamW optimizer, imported at run time from the checkout the user names
(`reference_path`; nothing of it is copied here), is trained

    on the same tokens       the minigpt arm's prepared bins (its data=, tokenizer=), read by its BatchLoader
    in the same order        seed s draws the same windows for both arms (trainer.seed = s)
    for the same budget      trainer.max_steps steps of trainer.batch_size x model.block_size tokens
    scored the same way      minigpt's scorer on the whole val split in disjoint windows: the number
                             `scripts/evaluate.py stride=<block_size>` prints

and otherwise as its own training script trains it (`ReferenceRecipe`): its learning rates per parameter
group, a linear warmup, the peak held, then a linear warmdown; Muon's momentum warmed up and cooled down; its
cautious weight decay fading on a cosine; float32; no gradient clipping. Its schedules are computed by
minigpt's schedule functions (training/optim.py), which have the same shapes.

`train_arms` trains each arm and seed into `<out>/<arm>/s<seed>/` (the minigpt arm is an ordinary run folder
of `training.train`); `collect` reads back every finished run of a folder, so two processes may train into
one folder side by side; `compare` pairs the arms by seed (lab/stats.py). How many tokens each arm trains in
the same time is side_by_side_throughput.py's.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import math
import sys
import time
from pathlib import Path
from types import ModuleType

import torch
from safetensors.torch import save_file
from torch import nn

from minigpt.data.eval_windows import eval_batches, eval_windows
from minigpt.data.loader import BatchLoader
from minigpt.data.prepare import PreparedData, prepare_dataset
from minigpt.errors import UserError
from minigpt.inspect.perplexity import Score, score_batches
from minigpt.lab.config import ReferenceRecipe, SideBySideConfig
from minigpt.lab.stats import mean_interval, paired_comparison
from minigpt.lab.tricks import markers, replace_block
from minigpt.runs.train import train
from minigpt.signals import Interrupted
from minigpt.training.budget import Budget
from minigpt.training.config import OptimConfig, TrainConfig
from minigpt.training.optim import LRSchedule, muon_momentum, weight_decay_multiplier
from minigpt.training.seeding import seed_everything

log = logging.getLogger(__name__)

REFERENCE_FILES = ("nanochat/gpt.py", "nanochat/optim.py")  # what makes a folder a checkout of it
RESULT = "result.json"  # a reference run's record, in <out>/reference/s<seed>/
WEIGHTS = "model.safetensors"  # and its trained weights
KIND = "side_by_side"  # a page's blocks are between <!-- side_by_side:<name>:begin/end --> markers


def import_reference(path: str | None, compile_optimizer: bool = False) -> ModuleType:
    """The reference's model module (`nanochat.gpt`) from the checkout at `path`. Unless `compile_optimizer`,
    its optimizer's torch.compile'd step functions are swapped for the plain functions they wrap (Inductor
    needs a C++ compiler on a CPU and minutes to compile)."""
    if not path:
        raise UserError("reference_path is not set: give the folder of a nanochat checkout "
                        "(reference_path=/path/to/nanochat)")
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        raise UserError(f"reference_path={path} does not exist (give the folder of a nanochat checkout)")
    missing = [f for f in REFERENCE_FILES if not (root / f).is_file()]
    if missing:
        raise UserError(f"reference_path={path} is not a nanochat checkout: it has no {missing[0]}")
    sys.path.insert(0, str(root))
    try:
        gpt = importlib.import_module("nanochat.gpt")
    except Exception as e:  # its own imports: a missing dependency, a version that does not import
        raise UserError(f"reference_path={path}: importing nanochat.gpt failed: {type(e).__name__}: {e}") \
            from None
    finally:
        sys.path.remove(str(root))
    if not Path(gpt.__file__).resolve().is_relative_to(root):
        raise UserError(f"reference_path={path}: nanochat was already imported from {gpt.__file__}")
    optim = sys.modules["nanochat.optim"]
    for name in ("adamw_step_fused", "muon_step_fused"):
        fn = getattr(optim, name)
        if not compile_optimizer:
            setattr(optim, name, getattr(fn, "_torchdynamo_orig_callable", fn))
    return gpt


def reference_schedule(recipe: ReferenceRecipe, weight_decay: float) -> OptimConfig:
    """The reference's schedules as minigpt's optimizer settings (lr 1: `LRSchedule.lr` is the multiplier)."""
    return OptimConfig(lr=1.0, warmup_steps=recipe.warmup_steps, schedule="wsd",
                       cooldown_ratio=recipe.warmdown_ratio, min_lr_ratio=recipe.final_lr_frac,
                       muon_momentum=recipe.momentum, muon_momentum_start=recipe.momentum_start,
                       muon_momentum_warmup_steps=recipe.momentum_warmup_steps,
                       muon_momentum_end=recipe.momentum_end, weight_decay=weight_decay,
                       weight_decay_schedule="cosine")


class ReferenceRun:
    """The reference model and optimizer, built and initialised as its training script does, and its training
    steps on minigpt's batches of `split` (seeded as minigpt's trainer seeds a run)."""

    def __init__(self, gpt: ModuleType, recipe: ReferenceRecipe, data: PreparedData, block_size: int,
                 batch_size: int, seed: int, steps: int) -> None:
        seed_everything(seed)
        config = gpt.GPTConfig(sequence_len=block_size, vocab_size=data.vocab_size, n_layer=recipe.n_layer,
                               n_head=recipe.n_head, n_kv_head=recipe.n_kv_head, n_embd=recipe.n_embd,
                               window_pattern=recipe.window_pattern)
        with torch.device("meta"):  # its model is built on the meta device, then given memory and initialised
            self.model = gpt.GPT(config)
        self.model.to_empty(device="cpu")
        self.model.init_weights()
        s = recipe.lr_scale
        self.optimizer = self.model.setup_optimizer(
            unembedding_lr=recipe.unembedding_lr * s, embedding_lr=recipe.embedding_lr * s,
            scalar_lr=recipe.scalar_lr * s, matrix_lr=recipe.matrix_lr * s, weight_decay=recipe.weight_decay)
        self.schedule = reference_schedule(recipe, recipe.weight_decay)
        self.lr = LRSchedule(self.schedule, Budget(max_steps=steps))
        self.loader = BatchLoader(data.split("train"), block_size, batch_size, seed=seed)
        self.steps, self.taken = steps, 0

    def step(self, batch: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """The next training step (after the last one of `steps` the schedule starts again) on `batch`, or
        on the loader's next one: its loss, before the update."""
        i = self.taken % self.steps
        self.taken += 1
        x, y = batch if batch is not None else self.loader.next_batch()  # (B, T) each
        loss = self.model(x, y)
        loss.backward()
        progress = i / self.steps
        lr = self.lr.lr(i, 0.0, 0)
        momentum = muon_momentum(i, progress, self.schedule)
        decay = self.schedule.weight_decay * weight_decay_multiplier(progress, "cosine")
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"] * lr
            if group["kind"] == "muon":
                group["momentum"], group["weight_decay"] = momentum, decay
        self.optimizer.step()
        self.model.zero_grad(set_to_none=True)
        return loss.detach()


class ReferenceLoss(nn.Module):
    """The reference model behind the call minigpt's scorer makes: (x, y) -> (None, mean loss, y != -1)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, y: torch.Tensor, return_logits: bool = False):
        return None, self.model(x, y)  # its loss ignores targets of -1, as minigpt's does


def whole_split_score(model: nn.Module, data: PreparedData, block_size: int, batch_size: int) -> Score:
    """The score of `model` (minigpt's call convention, float32) on every val target once, in disjoint
    windows: what minigpt's trainer scores with trainer.eval_tokens=all."""
    val = data.split("val")
    windows = eval_windows(len(val), block_size, None)
    batches = ((b.x, b.y, b.target_bytes) for b in
               eval_batches(val, windows, batch_size, token_bytes=data.tokenizer.token_byte_lengths()))
    return score_batches(model, batches)


def train_reference(gpt: ModuleType, cfg: SideBySideConfig, data: PreparedData, seed: int,
                    folder: Path) -> dict:
    """Train and score the reference for one seed; write its weights (`WEIGHTS`, to look inside) and its
    record (`RESULT`, last) into `folder`, and return the record."""
    tc, block = cfg.minigpt.trainer, cfg.minigpt.model.block_size
    steps = cfg.reference.steps or tc.max_steps
    run = ReferenceRun(gpt, cfg.reference, data, block, tc.batch_size, seed, steps)
    seconds = 0.0
    for i in range(steps):
        start = time.perf_counter()
        loss = run.step()
        seconds += time.perf_counter() - start
        if i % 100 == 0 or i == steps - 1:
            log.info("reference seed %d: step %d/%d, loss %.4f", seed, i + 1, steps, loss.item())
    score = whole_split_score(ReferenceLoss(run.model), data, block, tc.batch_size)
    tokens = steps * tc.batch_size * block
    record = {"arm": "reference", "seed": seed, "steps": steps, "tokens": tokens, "val_loss": score.loss,
              "val_bpb": score.bpb, "targets": score.tokens, "train_seconds": seconds,
              "tokens_per_s": tokens / seconds, "threads": torch.get_num_threads(),
              "recipe": dataclasses.asdict(cfg.reference)}
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in run.model.state_dict().items()}, folder / WEIGHTS)
    (folder / RESULT).write_text(json.dumps(record, indent=1) + "\n")
    return record


def minigpt_config(cfg: SideBySideConfig, seed: int) -> TrainConfig:
    """The minigpt arm's run of `seed`, going on from its folder's checkpoint where a command stopped."""
    return dataclasses.replace(cfg.minigpt, trainer=dataclasses.replace(cfg.minigpt.trainer, seed=seed,
                                                                        resume="auto"))


def finished(meta: Path) -> bool:
    """Whether the minigpt run whose last checkpoint's meta.json is `meta` trained to its end."""
    record = json.loads(meta.read_text()) if meta.is_file() else {}
    return bool(record) and record["step"] >= record["config"]["trainer"]["max_steps"]


def train_arms(cfg: SideBySideConfig, out: Path) -> None:
    """Train every arm of `cfg.arms` for every seed into `out/<arm>/s<seed>/`, skipping finished runs (a
    minigpt run a stop signal ended goes on from its checkpoint; the signal ends this command too)."""
    gpt = import_reference(cfg.reference_path, cfg.reference.compile_optimizer) if "reference" in cfg.arms \
        else None
    data = prepare_dataset(cfg.minigpt.data, cfg.minigpt.tokenizer, progress=False)
    for seed in cfg.seeds:
        for arm in cfg.arms:
            folder = out / arm / f"s{seed}"
            if arm == "reference" and not (folder / RESULT).is_file():
                train_reference(gpt, cfg, data, seed, folder)
            elif arm == "minigpt" and not finished(folder / "checkpoints" / "last" / "meta.json"):
                result = train(minigpt_config(cfg, seed), folder)
                if result.interrupted:
                    raise Interrupted(result.stop_signal)


def collect(out: Path) -> dict[str, dict[int, dict]]:
    """Every finished run under `out`, by arm and seed: steps, tokens, val loss and bits per byte (whole
    split), training seconds."""
    runs: dict[str, dict[int, dict]] = {"reference": {}, "minigpt": {}}
    for path in sorted(out.glob(f"reference/s*/{RESULT}")):
        record = json.loads(path.read_text())
        runs["reference"][record["seed"]] = record
    for path in sorted(out.glob("minigpt/s*/checkpoints/last/meta.json")):
        if not finished(path):
            continue
        meta = json.loads(path.read_text())
        tokens, seconds = meta["tokens_seen"], meta["train_seconds"]
        seed = meta["config"]["trainer"]["seed"]
        runs["minigpt"][seed] = {
            "arm": "minigpt", "seed": seed, "steps": meta["step"], "tokens": tokens,
            "val_loss": meta["val_loss"], "val_bpb": meta["val_bpb"], "train_seconds": seconds,
            "tokens_per_s": tokens / seconds if seconds else math.nan}
    return runs


def compare(runs: dict[str, dict[int, dict]]) -> dict:
    """Each arm's mean over its seeds and minigpt - reference paired by seed, in nats per token and bits per
    byte (lab/stats.py)."""
    doc = {"runs": {arm: {str(s): r for s, r in sorted(by_seed.items())} for arm, by_seed in runs.items()}}
    for key in ("val_loss", "val_bpb"):
        values = {arm: {s: r[key] for s, r in by_seed.items()} for arm, by_seed in runs.items()}
        doc[key] = {arm: dataclasses.asdict(mean_interval(list(v.values())))
                    for arm, v in values.items() if v}
        paired = paired_comparison(values["minigpt"], values["reference"])
        doc[key]["difference"] = None if paired is None else {**dataclasses.asdict(paired.difference),
                                                              "p_value": paired.p_value}
    return doc


def render_table(doc: dict) -> str:
    """The runs seed by seed and the paired difference, as a Markdown table."""
    runs = doc["runs"]
    seeds = sorted({int(s) for by_seed in runs.values() for s in by_seed})

    def cell(arm: str, seed: int) -> str:
        r = runs[arm].get(str(seed))
        return "- | - | -" if r is None else f"{r['steps']:,} | {r['val_loss']:.3f} | {r['val_bpb']:.3f}"

    lines = ["| seed | reference: steps | val loss | bits/byte | minigpt: steps | val loss | bits/byte | "
             "minigpt - reference |", "|---|---|---|---|---|---|---|---|"]
    for seed in seeds:
        r, m = runs["reference"].get(str(seed)), runs["minigpt"].get(str(seed))
        delta = "-" if r is None or m is None else f"{m['val_loss'] - r['val_loss']:+.3f}"
        lines.append(f"| {seed} | {cell('reference', seed)} | {cell('minigpt', seed)} | {delta} |")
    loss, bpb = doc["val_loss"], doc["val_bpb"]
    means = [f"{d[arm]['mean']:.3f}" if arm in d else "-"
             for arm in ("reference", "minigpt") for d in (loss, bpb)]
    diff = loss["difference"]
    delta = "-" if diff is None else f"{diff['mean']:+.3f}"
    if diff is not None and not math.isnan(diff["p_value"]):
        delta += f" ± {diff['half_width']:.3f} (p = {diff['p_value']:.3f})"
    lines.append(f"| mean | | {means[0]} | {means[1]} | | {means[2]} | {means[3]} | {delta} |")
    return "\n".join(lines)


def check_doc(page: Path, name: str) -> None:
    """Refuse, before anything is trained, a page without the block's markers."""
    begin, end = markers(name, KIND)
    text = page.read_text() if page.is_file() else ""
    if begin not in text or end not in text:
        raise UserError(f"doc={page} has no {begin} ... {end} markers to write the table between")


def write_doc(page: Path, name: str, doc: dict, table: str) -> list[Path]:
    """The table into `page` between block `name`'s markers, and `doc` into side_by_side.json beside it."""
    store = page.parent / "side_by_side.json"
    saved = json.loads(store.read_text()) if store.is_file() else {"blocks": {}}
    saved["blocks"][name] = doc
    store.write_text(json.dumps(saved, indent=1) + "\n")
    page.write_text(replace_block(page.read_text(), name, table, KIND))
    return [store, page]
