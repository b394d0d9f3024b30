"""The side-by-side's plumbing, with a stand-in for the reference checkout: the import and its errors, the
batches the reference sees (minigpt's, seed for seed), its whole-split score against a direct computation, its
schedules against its training script's formulas, the table, and the script's one-line refusals."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from cli_helpers import run_script
from safetensors.torch import load_file

from minigpt.data.loader import BatchLoader
from minigpt.data.prepare import prepare_dataset
from minigpt.errors import UserError
from minigpt.lab import side_by_side as sbs
from minigpt.lab.config import ReferenceRecipe, SideBySideConfig
from minigpt.lab.side_by_side_throughput import render_throughput, throughput
from minigpt.training.budget import Budget
from minigpt.training.optim import LRSchedule, muon_momentum

# A stand-in for the reference's two modules, with its interfaces: a bigram model (each logit row depends on
# the current token alone), an optimizer whose groups carry `kind` and `initial_lr`, compiled step functions.
STAND_IN = {
    "nanochat/__init__.py": "",
    "nanochat/optim.py": """
        import torch

        @torch.compile
        def adamw_step_fused(x):
            return x

        @torch.compile
        def muon_step_fused(x):
            return x
    """,
    "nanochat/gpt.py": """
        from dataclasses import dataclass

        import torch
        import torch.nn.functional as F
        from torch import nn

        import nanochat.optim  # noqa: F401

        SEEN = []

        @dataclass
        class GPTConfig:
            sequence_len: int
            vocab_size: int
            n_layer: int
            n_head: int
            n_kv_head: int
            n_embd: int
            window_pattern: str

        class GPT(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.wte = nn.Embedding(config.vocab_size, config.n_embd)
                self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

            def init_weights(self):
                nn.init.normal_(self.wte.weight, std=0.5)
                nn.init.normal_(self.head.weight, std=0.1)

            def setup_optimizer(self, unembedding_lr, embedding_lr, matrix_lr, weight_decay, scalar_lr):
                groups = [dict(params=[self.wte.weight], lr=embedding_lr, kind="adamw"),
                          dict(params=[self.head.weight], lr=matrix_lr, kind="muon", momentum=0.0)]
                opt = torch.optim.SGD(groups, lr=0.1, weight_decay=weight_decay)
                for group in opt.param_groups:
                    group["initial_lr"] = group["lr"]
                return opt

            def forward(self, idx, targets):
                SEEN.append(idx.clone())
                logits = self.head(self.wte(idx))
                return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
    """,
}


@pytest.fixture
def checkout(tmp_path: Path):
    root = tmp_path / "reference"
    for name, text in STAND_IN.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    yield root
    for name in [m for m in sys.modules if m == "nanochat" or m.startswith("nanochat.")]:
        del sys.modules[name]


@pytest.fixture
def side_by_side(make_train_cfg, checkout):
    """A SideBySideConfig on the fast preset's data, 6 steps, and the stand-in checkout."""
    def make(**overrides) -> SideBySideConfig:
        minigpt = make_train_cfg("trainer.max_steps=6", "trainer.eval_tokens=all")
        return SideBySideConfig(reference_path=str(checkout), minigpt=minigpt, seeds=[3], **overrides)
    return make


@pytest.mark.parametrize("where, message", [
    ("missing", "reference_path={} does not exist"),
    ("empty", "reference_path={} is not a nanochat checkout: it has no nanochat/gpt.py"),
])
def test_a_folder_that_is_not_a_checkout_is_one_line(tmp_path, where, message):
    path = tmp_path / where
    if where == "empty":
        path.mkdir()
    with pytest.raises(UserError) as err:
        sbs.import_reference(str(path))
    assert str(err.value).startswith(message.format(path)) and "\n" not in str(err.value)
    with pytest.raises(UserError, match="reference_path is not set"):
        sbs.import_reference(None)


@pytest.mark.parametrize("compiled", [False, True])
def test_its_optimizer_steps_run_eagerly_unless_asked(checkout, compiled):
    sbs.import_reference(str(checkout), compile_optimizer=compiled)
    step = sys.modules["nanochat.optim"].adamw_step_fused
    assert hasattr(step, "_torchdynamo_orig_callable") == compiled


def test_the_reference_trains_on_minigpts_batches_and_is_scored_on_the_whole_split(side_by_side, tmp_path):
    cfg = side_by_side()
    data = prepare_dataset(cfg.minigpt.data, cfg.minigpt.tokenizer, progress=False)
    gpt = sbs.import_reference(cfg.reference_path)
    record = sbs.train_reference(gpt, cfg, data, seed=3, folder=tmp_path / "run")
    assert json.loads((tmp_path / "run" / sbs.RESULT).read_text()) == record
    assert set(load_file(tmp_path / "run" / sbs.WEIGHTS)) == {"wte.weight", "head.weight"}
    T, B = cfg.minigpt.model.block_size, cfg.minigpt.trainer.batch_size
    loader = BatchLoader(data.split("train"), T, B, seed=3)  # what minigpt's trainer draws with seed 3
    drawn = [loader.next_batch()[0] for _ in range(6)]
    assert all(torch.equal(a, b) for a, b in zip(gpt.SEEN[:6], drawn, strict=True))
    # the stand-in is a bigram model: the whole split's loss is the mean over every consecutive token pair,
    # computed here from the same training repeated (the runs are deterministic)
    val = torch.from_numpy(data.split("val").read(0, len(data.split("val"))).astype(np.int64))
    assert record["targets"] == len(val) - 1 and record["steps"] == 6 and record["tokens"] == 6 * B * T
    again = sbs.ReferenceRun(gpt, cfg.reference, data, T, B, seed=3, steps=6)
    for _ in range(6):
        again.step()
    with torch.no_grad():
        want = F.cross_entropy(again.model.head(again.model.wte(val[:-1])), val[1:]).item()
    assert record["val_loss"] == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("steps", [2200, 1850, 300])
def test_its_schedules_follow_its_training_scripts_formulas(steps):
    recipe = ReferenceRecipe()
    cfg = sbs.reference_schedule(recipe, recipe.weight_decay)
    lr = LRSchedule(cfg, Budget(max_steps=steps))
    warmdown = round(recipe.warmdown_ratio * steps)
    for i in range(steps):
        if i < recipe.warmup_steps:
            want_lr = (i + 1) / recipe.warmup_steps
        elif i <= steps - warmdown:
            want_lr = 1.0
        else:
            frac = (steps - i) / warmdown
            want_lr = frac + (1 - frac) * recipe.final_lr_frac
        if i < recipe.momentum_warmup_steps:
            want_momentum = 0.85 + (0.97 - 0.85) * i / recipe.momentum_warmup_steps
        elif i >= steps - warmdown:
            want_momentum = 0.97 + (0.90 - 0.97) * (i - (steps - warmdown)) / warmdown
        else:
            want_momentum = 0.97
        assert lr.lr(i, 0.0, 0) == pytest.approx(want_lr, abs=1e-3), i
        assert muon_momentum(i, i / steps, cfg) == pytest.approx(want_momentum, abs=1e-3), i


def test_the_table_pairs_the_arms_by_seed():
    losses = {"reference": {1: 3.5, 2: 3.6, 3: 3.4}, "minigpt": {1: 3.4, 2: 3.45, 3: 3.3}}
    runs = {arm: {s: {"steps": 10, "val_loss": v, "val_bpb": v / 2} for s, v in values.items()}
            for arm, values in losses.items()}
    doc = sbs.compare(runs)
    diff = doc["val_loss"]["difference"]
    assert diff["mean"] == pytest.approx(-0.35 / 3)
    d = [-0.1, -0.15, -0.1]
    sd = math.sqrt(sum((x - sum(d) / 3) ** 2 for x in d) / 2)
    t = (sum(d) / 3) / (sd / math.sqrt(3))
    assert diff["half_width"] == pytest.approx(4.302653 * sd / math.sqrt(3), rel=1e-5)
    assert 0 < diff["p_value"] < 0.05 and abs(t) > 4.3
    table = sbs.render_table(doc)
    assert "| 2 | 10 | 3.600 | 1.800 | 10 | 3.450 | 1.725 | -0.150 |" in table
    assert f"{-0.35 / 3:+.3f} ± {diff['half_width']:.3f} (p = {diff['p_value']:.3f})" in table


def test_the_script_refuses_a_missing_checkout_in_one_line(tmp_path, capsys):
    args = [f"reference_path={tmp_path / 'nowhere'}", f"hydra.run.dir={tmp_path / 'o'}"]
    run = run_script("side_by_side", args, capsys)
    assert run.code == 2 and run.err_lines == [f"error: reference_path={tmp_path / 'nowhere'} does not exist "
                                               "(give the folder of a nanochat checkout)"], run.err
    assert not (tmp_path / "o").exists()


def test_the_config_refuses_what_would_compare_unlike_things(make_train_cfg):
    sampled = make_train_cfg("trainer.eval_tokens=256")
    with pytest.raises(UserError, match="minigpt.trainer.eval_tokens=256: the arms are compared on the"):
        SideBySideConfig(minigpt=sampled)
    whole = make_train_cfg("trainer.eval_tokens=all")
    with pytest.raises(UserError, match="arms=\\['nanochat'\\] must name some of: reference, minigpt"):
        SideBySideConfig(minigpt=whole, arms=["nanochat"])
    assert dataclasses.replace(SideBySideConfig(minigpt=whole), seeds=[1]).seeds == [1]


def test_only_finished_runs_are_collected(tmp_path):
    def meta(seed: int, step: int) -> None:
        folder = tmp_path / "minigpt" / f"s{seed}" / "checkpoints" / "last"
        folder.mkdir(parents=True)
        record = {"step": step, "tokens_seen": step * 8, "train_seconds": 2.0, "val_loss": 3.0,
                  "val_bpb": 1.2, "config": {"trainer": {"seed": seed, "max_steps": 10}}}
        (folder / "meta.json").write_text(json.dumps(record))

    meta(1, 10)
    meta(2, 7)  # stopped by a signal at step 7: the next command goes on from it
    runs = sbs.collect(tmp_path)
    assert list(runs["minigpt"]) == [1] and runs["minigpt"][1]["tokens_per_s"] == 40
    assert not sbs.finished(tmp_path / "minigpt" / "s2" / "checkpoints" / "last" / "meta.json")
    assert not sbs.finished(tmp_path / "nowhere" / "meta.json")


def test_throughput_times_both_arms_at_each_thread_count(side_by_side):
    cfg = side_by_side(threads=[1, 2], timed_steps=2, repeats=1)
    doc = throughput(cfg)
    rates = doc["tokens_per_s"]
    assert set(rates) == {"reference", "minigpt"} and all(set(r) == {"1", "2"} for r in rates.values())
    for arm, best in doc["best"].items():
        assert best["tokens_per_s"] == max(rates[arm].values()) > 0
        assert rates[arm][str(best["threads"])] == best["tokens_per_s"]
    table = render_throughput(doc)
    assert table.count("\n") == 4 and "| best |" in table
