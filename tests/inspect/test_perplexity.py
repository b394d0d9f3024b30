"""Perplexity against exp(mean loss), and sliding-window scoring against each token scored once."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from model_helpers import tiny_config

from minigpt.data.tokenizers import ByteTokenizer
from minigpt.device.config import InferenceDeviceConfig
from minigpt.inspect import perplexity
from minigpt.inspect.config import EvaluateConfig
from minigpt.inspect.perplexity import document_tokens, evaluate, sliding_window_loss
from minigpt.model.factory import build_model

B, T = 3, 6


def _model(**kw):
    torch.manual_seed(0)
    cfg = dict(n_layer=2, n_head=4, n_embd=32, block_size=8, vocab_size=37)
    return build_model(tiny_config(**(cfg | kw)))


def test_perplexity_is_exp_of_the_mean_loss_on_a_short_text() -> None:
    model = _model(block_size=64, vocab_size=257).eval()
    tok = ByteTokenizer()
    text = "def f(x):\n    return x + 1\n"
    tokens = document_tokens([text], tok)
    assert tokens.tolist() == [tok.eot_id, *text.encode()]
    with torch.no_grad():  # independent: one plain forward over the whole (short) text
        logits, _ = model(tokens[None, :-1])
        losses = F.cross_entropy(logits[0], tokens[1:], reduction="none")
    result = sliding_window_loss(model, tokens, batch_size=2)
    assert result.tokens == len(text)
    assert math.isclose(result.perplexity, math.exp(losses.mean().item()), rel_tol=1e-5)


def test_sliding_window_scores_each_token_once_with_its_context() -> None:
    model = _model(block_size=8).eval()
    tokens = torch.randint(0, 37, (41,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():  # stride 1: every target sees min(8, j) tokens before it
        logits = [model(tokens[None, max(0, j - 8) : j])[0][0, -1] for j in range(1, 41)]  # (V,) each
        naive = [F.cross_entropy(lg, tokens[j]) for j, lg in enumerate(logits, start=1)]
    result = sliding_window_loss(model, tokens, stride=1, batch_size=4)
    assert result.tokens == 40
    assert math.isclose(result.loss, torch.stack(naive).mean().item(), rel_tol=1e-5)
    disjoint = sliding_window_loss(model, tokens, stride=8, batch_size=3)
    assert disjoint.tokens == 40 and abs(disjoint.loss - result.loss) < 0.5


def _saved(tmp_path: Path, text: str) -> tuple[torch.nn.Module, EvaluateConfig]:
    """A byte-level model saved as a checkpoint, and the config that scores `text` with it on the CPU."""
    from minigpt.checkpoint.format import save_checkpoint

    model = _model(block_size=16, vocab_size=257)
    save_checkpoint(tmp_path / "ckpt", model, {}, {"model_config": vars(model.config)}, ByteTokenizer())
    (tmp_path / "t.txt").write_text(text)
    return model, EvaluateConfig(checkpoint=str(tmp_path / "ckpt"), text_file=str(tmp_path / "t.txt"),
                                 device=InferenceDeviceConfig("cpu"), stride=4)


def test_evaluate_a_text_file_from_a_checkpoint(tmp_path: Path) -> None:
    model, cfg = _saved(tmp_path, "hello world\n" * 5)
    result, what = evaluate(cfg)
    expected = sliding_window_loss(model, document_tokens(["hello world\n" * 5], ByteTokenizer()), stride=4)
    assert what.endswith("t.txt") and result.tokens == 60
    assert math.isclose(result.loss, expected.loss, rel_tol=1e-6)


def test_scoring_on_a_cpu_keeps_the_memory_each_batch_frees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    _, cfg = _saved(tmp_path, "hello world\n")
    calls = []
    monkeypatch.setattr(perplexity, "keep_freed_memory", lambda: calls.append(1) or "kept, said the stand-in")
    with caplog.at_level(logging.INFO, logger="minigpt.inspect.perplexity"):
        evaluate(cfg)
    assert calls == [1]
    assert "memory: kept, said the stand-in" in caplog.text
