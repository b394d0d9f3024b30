"""llama.cpp itself on the exported GGUF files (through llama-cpp-python, `pip install llama-cpp-python`):
its greedy tokens equal ours, its logits are ours up to its own arithmetic, and its tokenizer, with the
pre-tokenizer the export names, splits every text into our ids. A real run of llama.cpp's C++; skipped only
where the package is not installed.

llama.cpp's arithmetic: its KV cache is float16 by default (logits then differ by ~4e-3), so the logits are
compared with a float32 cache; its CPU GELU reads a float16 table (~3e-3 on GPT-2 blocks); its rotary angles
are float32 (~1e-5, as in transformers).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from interop_helpers import SHAPES, make_checkpoint, small_bpe, stdlib_texts
from test_gguf import with_pattern
from test_hf_tokenizer import TRICKY

from minigpt.data.config import DataConfig, TokenizerConfig
from minigpt.data.prepare import prepare_dataset
from minigpt.data.sources import load_corpus
from minigpt.interop.gguf_export import export_gguf
from minigpt.interop.gguf_vocab import PRE_TOKENIZERS
from minigpt.sampling.decode import generate
from minigpt.sampling.params import SamplingParams

llama_cpp = pytest.importorskip("llama_cpp")

GREEDY_TOKENS = 100
F32 = 0  # ggml's type id of float32, for the KV cache


@contextlib.contextmanager
def llama(path: Path, n_ctx: int, **options) -> Iterator[llama_cpp.Llama]:
    """llama.cpp on 2 threads with the model's context; closed before the interpreter exits."""
    model = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=2, n_threads_batch=2, verbose=False,
                            **options)
    try:
        yield model
    finally:
        model.close()


def llama_greedy(model: llama_cpp.Llama, prompt: list[int], n: int) -> list[int]:
    """llama.cpp's own greedy sampler (top_k=1, no repetition penalty)."""
    out = []
    for token in model.generate(prompt, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
        out.append(token)
        if len(out) == n:
            return out
    return out


@pytest.mark.parametrize("shape", SHAPES)
def test_llama_cpp_decodes_our_greedy_tokens(tmp_path: Path, shape: str) -> None:
    _, model = make_checkpoint(tmp_path / "ckpt", shape)
    path = export_gguf(model, small_bpe(), tmp_path / "m.gguf", "f32", name="t")
    prompt = small_bpe().encode("def decode(self, s):\n")
    ours = generate(model, [prompt], max_new_tokens=GREEDY_TOKENS, params=SamplingParams(temperature=0.0),
                    generator=torch.Generator().manual_seed(0)).tokens[0]
    with llama(path, model.config.block_size) as theirs:
        assert theirs.n_vocab() == model.config.vocab_size and theirs.token_eos() == small_bpe().eot_id
        assert llama_greedy(theirs, prompt, GREEDY_TOKENS) == ours
    assert len(set(ours)) > 5  # a real sequence, not one token repeated


@pytest.mark.parametrize("shape", SHAPES)
def test_llama_cpp_logits_are_ours(tmp_path: Path, shape: str) -> None:
    _, model = make_checkpoint(tmp_path / "ckpt", shape)
    T = model.config.block_size
    window = (torch.arange(T) * 7 % small_bpe().vocab_size).tolist()
    with llama(export_gguf(model, small_bpe(), tmp_path / "m.gguf", "f32", name="t"), T, logits_all=True,
               type_k=F32, type_v=F32) as theirs:
        theirs.eval(window)
        logits = torch.from_numpy(np.array(theirs.scores[:T]))  # (T, V)
    with torch.no_grad():
        ours = model(torch.tensor([window]))[0][0]
    assert ours.std() > 1.0
    assert (logits - ours).abs().max() <= (1e-2 if SHAPES[shape].pos_encoding == "learned" else 1e-4)


@pytest.mark.parametrize("pattern", PRE_TOKENIZERS, ids=["gpt4", "cl100k", "gpt2-hf", "r50k"])
def test_llama_cpp_splits_like_our_pattern(tmp_path: Path, pattern: str) -> None:
    tok = with_pattern(small_bpe(), pattern)
    _, model = make_checkpoint(tmp_path / "ckpt", "demo", tok)
    with llama(export_gguf(model, tok, tmp_path / "m.gguf", "f32", name="t"), 128) as theirs:
        for text in [*TRICKY, *stdlib_texts()]:
            assert theirs.tokenize(text.encode(), add_bos=False, special=False) == tok.encode(text), text[:60]
            assert theirs.detokenize(tok.encode(text)) == text.encode()


@pytest.mark.slow  # prepares the default corpus with the default tokenizer (~10 s on 2 cores)
def test_llama_cpp_encodes_the_whole_val_split_to_our_ids(tmp_path: Path) -> None:
    data = DataConfig(cache_dir=str(tmp_path / "cache"))
    prepared = prepare_dataset(data, TokenizerConfig(kind="bpe", train_chars=1_000_000), progress=False)
    _, model = make_checkpoint(tmp_path / "ckpt", "demo", prepared.tokenizer)
    docs = list(load_corpus(data, tmp_path / "cache").documents("val"))
    with llama(export_gguf(model, prepared.tokenizer, tmp_path / "m.gguf", "f32", name="t"), 128) as theirs:
        for doc in docs:
            assert theirs.tokenize(doc.text.encode(), add_bos=False, special=False) == (
                prepared.tokenizer.encode(doc.text)), doc.name
