"""Validation numbers: bits per byte against an independent computation for every tokenizer kind, the
trainer's windows spread from the first document to the last, and the trainer's number equal to
scripts/evaluate.py's on the same checkpoint and windows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from cli_helpers import run_script
from model_helpers import tiny_config

from minigpt.checkpoint import format as ckpt
from minigpt.cluster.dist_env import DistEnv
from minigpt.data.config import DataConfig, TokenizerConfig
from minigpt.data.prepare import prepare_dataset
from minigpt.data.tokenizers import EOT
from minigpt.device.runtime import Runtime
from minigpt.model.factory import build_model
from minigpt.runs.train import train
from minigpt.training.config import LoggingConfig
from minigpt.training.evaluation import Evaluation
from minigpt.training.trainer import Trainer

T = 16  # the context of the models here


def _corpus(folder: Path) -> Path:
    """ASCII and multi-byte text (2-, 3- and 4-byte UTF-8), so that bytes, characters and tokens differ."""
    folder.mkdir(parents=True)
    for i in range(8):
        lines = [f"file {i} line {j}: café {'中文 ' * (j % 3)}🐍 x = {j * i}\n" for j in range(25)]
        (folder / f"doc{i}.txt").write_text("".join(lines), encoding="utf-8")
    return folder


def _evaluation(model, prepared, budget: int | None, batch_size: int = 3) -> Evaluation:
    runtime = Runtime(torch.device("cpu"), torch.float32, compile=False)
    return Evaluation(model, prepared.split("val"), T, budget, batch_size, runtime, DistEnv(),
                      prepared.tokenizer, LoggingConfig(), seed=0)


def _val_texts(prepared, corpus: Path) -> list[str]:
    """The val documents read from the files on disk, in the order the prepared split holds them."""
    files = [corpus / Path(f["name"]).name for f in prepared.meta["files"]["val"]]
    return [f.read_text(encoding="utf-8") for f in files]


# The split hashes each file's (absolute, tmp) path, so any 1-7 of the 8 files can land in train: bpe's 288
# is below what a single one of them supports (296).
@pytest.mark.parametrize(("kind", "vocab"), [("bpe", 288), ("char", None), ("byte", None)])
def test_bits_per_byte_equals_an_independent_computation(tmp_path: Path, kind: str, vocab: int | None):
    corpus = _corpus(tmp_path / "corpus")
    data = DataConfig(source="text", paths=[str(corpus)], val_ratio=0.25)
    prepared = prepare_dataset(data, TokenizerConfig(kind=kind, vocab_size=vocab), tmp_path / "cache",
                               progress=False)
    tok = prepared.tokenizer
    torch.manual_seed(0)
    model = build_model(tiny_config(n_layer=1, n_head=2, n_embd=16, block_size=T), vocab_size=tok.vocab_size)
    score = _evaluation(model, prepared, budget=None).score()

    # Independently: the token stream from the files, disjoint windows of T targets, the last one ending at
    # the split's end (scoring only what no earlier window did), and a float64 log-softmax per target.
    texts = _val_texts(prepared, corpus)
    ids = torch.tensor([t for text in texts for t in [tok.eot_id, *tok.encode(text)]])
    n, nats = len(ids), 0.0
    with torch.no_grad():
        for first in range(1, n, T):  # targets first .. first+T-1
            end = min(first + T, n)
            start = max(0, end - 1 - T)
            logits = model.eval()(ids[None, start : end - 1])[0][0].double()  # (T, V)
            logp = F.log_softmax(logits, dim=-1)[torch.arange(end - 1 - start), ids[start + 1 : end]]
            nats -= logp[(first - 1) - start :].sum().item()  # only the targets from `first` on
    text_bytes = sum(len(t.encode("utf-8")) for t in texts)
    assert len(tok.decode(ids[1:].tolist()).replace(EOT, "").encode("utf-8")) == text_bytes
    assert text_bytes > sum(len(t) for t in texts)  # multi-byte characters are in there
    assert score.tokens == n - 1 and score.bytes == text_bytes
    assert score.loss == pytest.approx(nats / (n - 1), rel=1e-5)
    assert score.bpb == pytest.approx(nats / math.log(2) / text_bytes, rel=1e-5)


def test_a_budget_scores_the_first_and_the_last_document(make_train_cfg, tmp_path: Path):
    cfg = make_train_cfg(f"trainer.eval_tokens={2 * 32}")
    trainer = Trainer(cfg, tmp_path / "run", env=DistEnv())  # writes nothing
    ev = trainer.evaluation
    val, w, tok = ev.val, ev.windows, trainer.tokenizer
    assert len(w) == 2 and w.starts[0] == 0 and w.starts[-1] + 32 + 1 == len(val)  # end to end
    docs = tok.decode(val.read(0, len(val)).tolist()).split(EOT)[1:]  # the val documents in order
    first = tok.decode(val.read(int(w.starts[0]), 33).tolist())
    last = tok.decode(val.read(int(w.starts[-1]), 33).tolist())
    assert first.startswith(EOT) and docs[0].startswith(first.removeprefix(EOT))
    assert docs[-1].endswith(last.split(EOT)[-1])
    assert ev.score().tokens == 2 * 32


@pytest.mark.slow
def test_the_trainers_number_equals_evaluate_py_on_the_same_windows(make_train_cfg, tmp_path: Path, capsys):
    run = tmp_path / "run"
    result = train(make_train_cfg("trainer.eval_tokens=all", "trainer.max_steps=4", "optim.lr=1e-2"), run)
    meta = ckpt.read_meta(run / "checkpoints" / "last")
    assert meta["val_loss"] == pytest.approx(result.val_loss)
    assert meta["val_bpb"] == pytest.approx(result.val_bpb)
    out = run_script("evaluate", [f"checkpoint={run}", "stride=32", "device=cpu", "batch_size=5",
                                  f"hydra.run.dir={tmp_path / 'eval'}"], capsys)
    assert out.code == 0, out.err
    scored = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert scored["tokens"] == meta["eval"]["targets"] == meta["eval"]["val_tokens"] - 1
    assert scored["bytes"] == meta["eval"]["bytes"] > 0
    assert scored["loss"] == pytest.approx(meta["val_loss"], rel=1e-5)
    assert scored["bpb"] == pytest.approx(meta["val_bpb"], rel=1e-5)
    assert f"{scored['bpb']:.4f} bits/byte" in out.out


def test_an_older_checkpoints_corpus_is_still_found():
    """meta.json of a run from before a data option was renamed (num_threads -> num_workers)."""
    from minigpt.inspect.perplexity import recorded_corpus

    data = recorded_corpus({"config": {"data": {"source": "text", "paths": ["a.txt"], "num_threads": 0}}})
    assert data == DataConfig(source="text", paths=["a.txt"])
