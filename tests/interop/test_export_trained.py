"""End to end: a model trained by the real trainer with the default (demo) architecture and a corpus-trained
bpe goes through scripts/export.py to both formats, and transformers and llama.cpp continue a prompt with our
greedy tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cli_helpers import run_script
from conftest import compose_train, fast_overrides, write_corpus

from minigpt.checkpoint.load import load_model
from minigpt.cli import to_object
from minigpt.runs.train import train
from minigpt.sampling.decode import generate
from minigpt.sampling.params import SamplingParams
from minigpt.training.config import TrainConfig

transformers = pytest.importorskip("transformers")


@pytest.mark.slow
def test_a_trained_default_architecture_model_runs_elsewhere(tmp_path: Path, capsys) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    overrides = [*fast_overrides(tmp_path, corpus), "model=demo", "model.block_size=128", "tokenizer=bpe",
                 "tokenizer.vocab_size=300", "trainer.max_steps=40"]
    train(to_object(compose_train(overrides), TrainConfig), tmp_path / "run")
    model, tokenizer, _ = load_model(tmp_path / "run", "cpu")
    assert model.config.kv_heads < model.config.n_head and not model.config.tie_weights  # GQA, untied
    summaries = {"hf": "LlamaForCausalLM, which transformers loads with no custom code",
                 "gguf": "llama.cpp's llama graph, f32 weights"}
    for fmt, out in (("hf", tmp_path / "hf"), ("gguf", tmp_path / "m.gguf")):
        done = run_script("export", [f"checkpoint={tmp_path / 'run'}", f"format={fmt}", f"out={out}"], capsys)
        assert done.code == 0 and done.out.strip() == f"exported to {out}: {summaries[fmt]}", done.err

    prompt = tokenizer.encode("def f3(x):\n")
    ours = generate(model, [prompt], max_new_tokens=100, params=SamplingParams(temperature=0.0),
                    generator=torch.Generator().manual_seed(0)).tokens[0]
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf", local_files_only=True)
    assert type(hf).__name__ == "LlamaForCausalLM"
    assert hf_tokenizer(corpus.joinpath("part0.txt").read_text())["input_ids"] == tokenizer.encode(
        corpus.joinpath("part0.txt").read_text())
    with torch.no_grad():
        theirs = hf.generate(torch.tensor([prompt]), max_new_tokens=100, do_sample=False, eos_token_id=None,
                             pad_token_id=0)[0, len(prompt):].tolist()
    assert theirs == ours

    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(tmp_path / "m.gguf"), n_ctx=128, n_threads=2, verbose=False)
    try:
        tokens = []
        for token in llm.generate(prompt, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0):
            tokens.append(token)
            if len(tokens) == 100:
                break
    finally:
        llm.close()
    assert tokens == ours
