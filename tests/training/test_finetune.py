"""Fine-tuning (`trainer.init_from`): a random Hugging Face GPT-2 imported with a byte tokenizer and
fine-tuned through the real scripts, a minigpt run continued as a new run, and the model keys that may and
may not change."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch
from cli_helpers import run_script
from conftest import write_corpus
from model_helpers import tiny_config
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from minigpt.checkpoint import format as ckpt
from minigpt.data.config import TokenizerConfig
from minigpt.data.tokenizers import ByteTokenizer
from minigpt.errors import UserError
from minigpt.model.config import ModelConfig
from minigpt.model.factory import build_model
from minigpt.runs.train import train
from minigpt.training import start as finetune
from minigpt.training.budget import Budget
from minigpt.training.config import TrainConfig
from minigpt.training.optim import LRSchedule
from minigpt.training.start import InitFrom

transformers = pytest.importorskip("transformers")

CTX = 64  # the HF model's context; the fine-tuning run shortens it to 32


@pytest.fixture(scope="module")
def hf_gpt2(tmp_path_factory) -> tuple[Path, transformers.GPT2LMHeadModel]:
    """A tiny random GPT-2 saved the way Hugging Face saves one, and its byte-level minigpt tokenizer."""
    root = tmp_path_factory.mktemp("finetune")
    cfg = transformers.GPT2Config(vocab_size=260, n_positions=CTX, n_embd=32, n_layer=2, n_head=2,
                                  bos_token_id=256, eos_token_id=256)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.save_pretrained(root / "hf")
    ByteTokenizer().save(root / "tokenizer")
    return root, model


def _train_args(root: Path, corpus: Path, *extra: str) -> list[str]:
    # optim=muon: optim.lr reaches the head and the tables (the default recipe gives each group its own)
    return ["data=text", f"data.paths=[{corpus}]", f"data.cache_dir={root / 'data'}", "device=cpu",
            "trainer.batch_size=4", "trainer.eval_every=10", "trainer.eval_tokens=512", "optim=muon",
            "optim.lr=3e-3", "optim.warmup_steps=2", "logging.progress_bar=false", "logging.sample_tokens=8",
            *extra]


@pytest.mark.slow
def test_fine_tune_an_imported_gpt2_on_a_text_corpus(hf_gpt2, tmp_path: Path, capsys):
    root, hf = hf_gpt2
    ckpt_dir, run = tmp_path / "imported", tmp_path / "run"
    corpus = write_corpus(tmp_path / "corpus")
    imported = run_script("import_hf", [f"source={root / 'hf'}", f"out={ckpt_dir}",
                                        f"tokenizer_dir={root / 'tokenizer'}"], capsys)
    assert imported.code == 0, imported.err

    # An imported checkpoint has no run to continue: resuming it says, in one line, what to do instead.
    refused = run_script("train", _train_args(root, corpus, f"trainer.resume={ckpt_dir}",
                                              f"hydra.run.dir={tmp_path / 'refused'}"), capsys)
    assert refused.code == 2 and len(refused.err_lines) == 1, refused.err
    assert f"trainer.init_from={ckpt_dir}" in refused.err and "Traceback" not in refused.err

    args = _train_args(root, corpus, f"trainer.init_from={ckpt_dir}", "trainer.max_steps=20",
                       "model.block_size=32", "model.dropout=0.1", f"hydra.run.dir={run}")
    tuned = run_script("train", args, capsys)
    assert tuned.code == 0, tuned.err
    assert "Traceback" not in tuned.err
    meta = ckpt.read_meta(run / "checkpoints" / "last")
    assert meta["step"] == 20 and meta["tokenizer"]["name"] == "byte"
    mc = meta["model_config"]
    assert (mc["n_embd"], mc["n_layer"], mc["vocab_size"], mc["activation"]) == (32, 2, 260, "gelu_tanh")
    assert (mc["block_size"], mc["dropout"]) == (32, 0.1)  # the two keys this run changed
    state = ckpt.load_state(run / "checkpoints" / "last")
    assert meta["val_loss"] < state["first_val_loss"] - 1.0  # a random GPT-2 learns the corpus' bytes

    generated = run_script("generate", [f"checkpoint={run}", "max_new_tokens=8", "device=cpu", "stream=false",
                                        f"hydra.run.dir={tmp_path / 'gen'}"], capsys)
    assert generated.code == 0, generated.err
    assert (tmp_path / "gen" / "samples.txt").read_text().startswith("--- sample 0")


def test_the_run_starts_from_the_source_weights(hf_gpt2, monkeypatch):
    """An HF folder directly (its gpt2 tokenizer replaced by bytes: tiktoken's file is not here offline), with
    the context cut to 32: the logits equal Hugging Face's own on the first 32 positions."""
    root, hf = hf_gpt2
    monkeypatch.setattr(finetune, "build_tokenizer", lambda cfg: ByteTokenizer())
    init = InitFrom.open(str(root / "hf"))
    cfg = init.model_config(dataclasses.replace(TrainConfig().model, block_size=32))
    model = build_model(cfg, vocab_size=init.tokenizer(TokenizerConfig()).vocab_size)
    init.load_weights(model)
    idx = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(idx)[0], hf(idx).logits, atol=1e-4, rtol=1e-4)
    assert model.transformer.wpe.weight.shape == (32, 32)


def test_an_hf_folder_without_the_gpt2_tokenizer_says_how_to_import_it(hf_gpt2, monkeypatch):
    root, _ = hf_gpt2

    def offline(cfg):
        raise UserError("tokenizer=gpt2 needs tiktoken's 'gpt2' file, which could not be loaded")

    monkeypatch.setattr(finetune, "build_tokenizer", offline)
    hint = r"could not be loaded; or import the folder .*scripts/import_hf.py source=.* tokenizer_dir=DIR"
    with pytest.raises(UserError, match=hint):
        InitFrom.open(str(root / "hf")).tokenizer(TokenizerConfig())


@pytest.mark.slow
def test_fine_tune_a_minigpt_run_as_a_new_run(make_train_cfg, tmp_path: Path):
    source = tmp_path / "source"
    first = train(make_train_cfg("trainer.max_steps=6", "optim.lr=1e-2"), source)
    tuned_cfg = make_train_cfg(f"trainer.init_from={source}", "trainer.max_steps=4", "model.dropout=0.1")
    tuned = train(tuned_cfg, tmp_path / "tuned")
    assert tuned.step == 4 and tuned.tokens_seen == 4 * 4 * 32  # step 0, in its own folder
    assert tuned.first_val_loss == pytest.approx(first.val_loss, rel=1e-6)  # the source's weights, same data
    events = EventAccumulator(str(tmp_path / "tuned" / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    lrs = {e.step: e.value for e in events.Scalars("optim/lr")}
    schedule = LRSchedule(tuned_cfg.optim, Budget(max_steps=4))  # a fresh one: counted from this run's step 0
    assert lrs[2] == pytest.approx(schedule.lr(1, 0.0, 0))  # logged at step 2: the lr step 2 (index 1) used
    with pytest.raises(UserError, match="trainer.init_from and trainer.resume"):
        make_train_cfg(f"trainer.init_from={source}", f"trainer.resume={source}")
    shutil.rmtree(source)  # a stopped fine-tuning run resumes from its own checkpoint, without the source
    resumed = train(make_train_cfg(f"trainer.init_from={source}", "trainer.max_steps=6", "model.dropout=0.1",
                                   "trainer.resume=auto"), tmp_path / "tuned")
    assert resumed.step == 6


def test_which_model_keys_a_fine_tuning_run_may_change(tmp_path: Path):
    source = tiny_config(n_layer=3, n_head=2, n_embd=32, block_size=64, vocab_size=300, dropout=0.2,
                         pos_encoding="rope")
    init = InitFrom(tmp_path / "src", False, source)

    def command_line(**overrides) -> ModelConfig:  # the run's model config: the default's, plus overrides
        return dataclasses.replace(TrainConfig().model, **overrides)

    run = init.model_config(command_line(block_size=16, attention="math"))
    assert (run.n_layer, run.n_embd, run.pos_encoding, run.vocab_size) == (3, 32, "rope", 300)
    assert (run.block_size, run.attention, run.dropout) == (16, "math", 0.0)  # dropout: this run's
    for bad, key in [(command_line(n_layer=6), "model.n_layer=6"),
                     (command_line(norm_placement="post"), "model.norm_placement"),
                     (command_line(vocab_size=512), "model.vocab_size=512")]:
        with pytest.raises(UserError, match=f"{key}.*cannot change when fine-tuning"):
            init.model_config(bad)
    with pytest.raises(UserError, match="model.block_size=256 is longer than the context"):
        init.model_config(command_line(block_size=256))
    assert init.model_config(command_line(n_layer=3)).n_layer == 3  # the source's value may be restated
