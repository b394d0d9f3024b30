"""A model whose vocabulary is padded past its tokenizer's (GPT-2 pads 50257 to 50304) never yields an id the
tokenizer cannot decode, in any sampling path: the samples during training (a fine-tune of such a model), the
generator with and without its KV cache, the interactive session, and the ablation lab's continuations.

The model under test is made to *prefer* the padded rows: every real row of its head is zero and the three
padded ones are large multiples of two hidden channels, so an unmasked draw would pick a padded id at nearly
every step (the check below shows it does) and a masked one draws uniformly among the real ones.
"""

from __future__ import annotations

import dataclasses
import io
import sys

import pytest
import torch
from cli_helpers import run_script
from conftest import write_corpus
from model_helpers import tiny_config

from minigpt.checkpoint.format import save_checkpoint
from minigpt.data.tokenizers import ByteTokenizer
from minigpt.lab.ablation import continuations
from minigpt.model.factory import build_model
from minigpt.model.gpt import GPT
from minigpt.sampling.next_token import sample
from minigpt.sampling.params import SamplingParams

TOKENIZER = ByteTokenizer()  # 257 ids: 256 bytes and <|endoftext|>
PADDED = 260


def _padded_model() -> GPT:
    torch.manual_seed(0)
    model = build_model(tiny_config(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=PADDED,
                                    tie_weights=False))
    with torch.no_grad():
        head = model.lm_head.weight  # (V, C)
        head.zero_()
        head[257, 0], head[258, 0], head[259, 1] = 1000.0, -1000.0, 1000.0  # one of them wins every row
    return model.eval()


def test_the_model_really_prefers_the_padded_ids_and_sampling_never_draws_them():
    model = _padded_model()
    idx = torch.randint(0, 257, (4, 16), generator=torch.Generator().manual_seed(1))
    logits, _ = model(idx)
    gen = torch.Generator().manual_seed(0)
    unmasked = sample(logits.reshape(-1, PADDED), SamplingParams(1.0), gen)
    assert (unmasked >= 257).float().mean() > 0.9  # what the fault looked like
    masked = sample(logits.reshape(-1, PADDED), SamplingParams(1.0, vocab_size=257), gen)
    assert int(masked.max()) < 257


def test_the_ablation_lab_continuations_stay_in_the_tokenizer():
    greedy, sampled = continuations(_padded_model(), [TOKENIZER.eot_id, 100, 101], TOKENIZER.vocab_size)
    assert max(greedy + sampled) < 257 and TOKENIZER.decode(greedy + sampled) is not None


@pytest.fixture
def padded_checkpoint(tmp_path):
    model = _padded_model()
    meta = {"model_config": dataclasses.asdict(model.config), "step": 0}
    return save_checkpoint(tmp_path / "padded", model, {"step": 0}, meta, TOKENIZER)


@pytest.mark.slow
@pytest.mark.parametrize("mode", [["kv_cache=true", "num_samples=2"], ["kv_cache=false", "num_samples=2"],
                                  ["interactive=true"]])
def test_generate_decodes_every_sample(mode, padded_checkpoint, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("def f(x):\n\n"))  # one turn, then an empty line ends it
    result = run_script("generate", [f"checkpoint={padded_checkpoint}", "max_new_tokens=40", "device=cpu",
                                     "stream=false", *mode, f"hydra.run.dir={tmp_path / 'g'}"], capsys)
    assert result.code == 0, result.err
    assert "Traceback" not in result.out + result.err and "outside" not in result.err


@pytest.mark.slow
def test_fine_tuning_a_padded_model_samples_during_training(padded_checkpoint, tmp_path, capsys):
    """A fine-tune from it (trainer.init_from) samples at its evaluations and at the end: every sample
    decodes (it used to end the run with `token id 257 is outside byte's vocabulary`)."""
    corpus = write_corpus(tmp_path / "corpus")
    run = tmp_path / "run"
    args = ["data=text", f"data.paths=[{corpus}]", f"data.cache_dir={tmp_path / 'data'}", "device=cpu",
            f"trainer.init_from={padded_checkpoint}", "trainer.max_steps=2", "trainer.batch_size=2",
            "trainer.eval_every=1", "trainer.eval_tokens=64", "optim.lr=1e-9", "logging.sample_tokens=40",
            "logging.progress_bar=false", f"hydra.run.dir={run}"]
    result = run_script("train", args, capsys)
    assert result.code == 0, result.err
    assert "--- sample after 2 steps ---" in result.out and "Traceback" not in result.out + result.err
