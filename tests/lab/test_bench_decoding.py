"""The decoding sections of the bench against independent counts: bytes read per step (int8 included), the
GGUF file llama.cpp is measured on (read back by the `gguf` package, and run by llama.cpp itself), the
targets, and the report and docs/decoding.md rendered from a synthetic result (nothing is timed)."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from minigpt.fast.timing import STEP_MIN_SPEEDUP
from minigpt.lab.bench import llama_cpp
from minigpt.lab.bench.generation import _targets, minigpt_generate, weight_bytes
from minigpt.lab.bench.reference import gpt2_like_config
from minigpt.lab.bench.report_decoding import (
    format_decode_accuracy,
    format_decode_batch,
    format_default_decode,
    format_speculative,
    format_step_spread,
    render_decoding_doc,
)
from minigpt.lab.bench.step_spread import bench_step_spread
from minigpt.model.factory import build_model
from minigpt.model.int8 import quantize_int8


def _tiny(activation: str = "gelu", tie: bool = True) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = gpt2_like_config(n_layer=2, n_head=4, n_embd=64, vocab_size=101, block_size=64)
    cfg.activation, cfg.tie_weights = activation, tie
    return build_model(cfg).eval()


@pytest.mark.parametrize("tie", [True, False])
def test_an_int8_step_reads_its_int8_matrices_scales_and_float_rest(tie: bool) -> None:
    model = _tiny(tie=tie)
    L, C, V, F = 2, 64, 101, 256
    matrices = L * (3 * C * C + C * C + C * F + F * C) + V * C  # every linear, the head included
    out_rows = L * (3 * C + C + F + C) + V  # one scale per output row of each of them
    biases = L * (3 * C + C + F + C)  # the head has none
    norms = (2 * L + 1) * 2 * C  # LayerNorm weight and bias
    int8 = quantize_int8(copy.deepcopy(model), torch.bfloat16)
    assert weight_bytes(int8) == matrices + 2 * (out_rows + biases + norms)  # int8 + bf16 scales and floats
    assert weight_bytes(model) == 4 * (matrices + biases + norms)  # float32: the same tensors, no scales


@pytest.mark.skipif(not llama_cpp.available(), reason="needs gguf and llama-cpp-python")
def test_the_gguf_file_holds_the_model_and_llama_cpp_decodes_it_as_minigpt_does(tmp_path: Path) -> None:
    import gguf

    model = _tiny("gelu_tanh")  # llama.cpp's GELU is the tanh approximation: the same function then
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(1))
    path = llama_cpp.write_gguf(model, tmp_path / "tiny.gguf", "f32")
    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == 4 + 12 * 2  # tables, final norm; 12 per block; the tied head is token_embd
    qkv = np.asarray(tensors["blk.1.attn_qkv.weight"].data).reshape(3 * 64, 64)
    np.testing.assert_array_equal(qkv, model.transformer.h[1].attn.c_attn.weight.detach().numpy())
    np.testing.assert_array_equal(np.asarray(tensors["token_embd.weight"].data).reshape(101, 64),
                                  model.lm_head.weight.detach().numpy())
    # the position table excluded on both sides; the token table is read whole, as the head
    assert llama_cpp.read_bytes_per_token(path) == weight_bytes(model)
    prompt = [5, 17, 99, 3]
    theirs = llama_cpp.llama_cpp_generate(path, 1, 64)(prompt, 24)
    assert theirs == minigpt_generate(model, prompt, 24)
    q8 = llama_cpp.write_gguf(model, tmp_path / "tiny-q8.gguf", "q8_0")
    assert llama_cpp.read_bytes_per_token(q8) < weight_bytes(model) / 3  # 8.5 bits per weight


def test_targets_take_each_dtypes_best_setting() -> None:
    rows = {"minigpt fp32": {"tokens_per_s": 100.0}, "minigpt fp32 compiled": {"tokens_per_s": 130.0},
            "llama.cpp f32": {"tokens_per_s": 150.0}, "minigpt int8": {"tokens_per_s": 300.0},
            "llama.cpp q8_0": {"tokens_per_s": 500.0}}
    targets = {t["theirs"]: t for t in _targets(rows)}
    assert set(targets) == {"llama.cpp f32", "llama.cpp q8_0"}  # no bf16 rows: no bf16 target
    assert targets["llama.cpp f32"]["ours"] == "minigpt fp32 compiled" and targets["llama.cpp f32"]["met"]
    assert targets["llama.cpp q8_0"]["ratio"] == pytest.approx(0.6) and not targets["llama.cpp q8_0"]["met"]


def _t(median: float) -> dict:
    return {"median": median, "min": median, "max": median, "repeats": 1}


RESULTS = {
    "machine": {"device": "AMD EPYC 9B14 (x86_64, AVX512, 2 cores)", "threads": 2, "torch": "2.13.0",
                "bf16_units": ["avx512_bf16"]},
    "sections": {
        "default_decode": {"model": {"n_layer": 4, "n_head": 3, "n_kv_head": 1, "n_embd": 96,
                                     "vocab_size": 4096, "block_size": 128},
                           "params": 1180512, "prompt_tokens": 16, "new_tokens": 256, "threads": 2,
                           "target_tokens_per_s": 2000.0, "met": True,
                           "rows": {"compiled": {"tokens_per_s": 2500.0, "time_s": _t(0.1),
                                                 "step_s": _t(3e-4)}}},
        "decode_batch": {"shape": {"n_layer": 6, "n_embd": 384, "vocab_size": 50304}, "prompt_tokens": 16,
                         "new_tokens": 64, "compile": True, "batch_sizes": [1, 4],
                         "rows": {"fp32": {"1": {"tokens_per_s": 100.0, "step_s": 0.01},
                                           "4": {"tokens_per_s": 380.0, "step_s": 0.0105},
                                           "saturates_at": 4}}},
        "speculative": {"shape": {"n_layer": 6, "n_embd": 384, "vocab_size": 50304}, "prompt_tokens": 16,
                        "new_tokens": 256, "compile": False,
                        "rows": {"plain": {"tokens_per_s": 100.0},
                                 "int8 copy, k=4": {"tokens_per_s": 180.0, "acceptance_rate": 0.9,
                                                    "tokens_per_forward": 4.1, "speedup": 1.8,
                                                    "same_tokens": True}}},
        "step_spread": {"shape": {"n_layer": 6, "n_embd": 384, "vocab_size": 50304}, "runs": 2, "margin": 1.1,
                        "dtypes": {"bf16": {"kernels": "head out_in, blocks out_in, streamed attention",
                                            "ratios": {"chosen / chosen again": [0.98, 1.02],
                                                       "chosen / streamed": [1.21, 1.17]}}}},
        "decode_accuracy": {"skipped": "no training checkpoint under 'outputs/train'"},
    },
}


def test_the_decoding_tables_show_their_numbers() -> None:
    s = RESULTS["sections"]
    assert "| compiled    | 2500     |" in "\n".join(format_default_decode(s["default_decode"]))
    assert "Target: >= 2000 tokens/s: met" in format_default_decode(s["default_decode"])
    batch = "\n".join(format_decode_batch(s["decode_batch"]))
    assert "| float32 | 100, 10.0 ms | 380, 10.5 ms | 4            |" in batch
    spec = "\n".join(format_speculative(s["speculative"]))
    assert "| int8 copy, k=4 | 180.0    | 90%      | 4.10               | 1.80x    | yes         |" in spec
    spread = "\n".join(format_step_spread(s["step_spread"]))
    assert "| bfloat16 | chosen / streamed     | 1.210, 1.170           | 1.170-1.210 |" in spread
    assert "in 2 runs (the whole-step choice takes a twin at 1.1x)" in spread
    assert format_step_spread({"skipped": "compiled steps only"}) == [
        "Spread of whole-step timings: skipped (compiled steps only)"]
    assert format_decode_accuracy(s["decode_accuracy"]) == [
        "Decoding accuracy: skipped (no training checkpoint under 'outputs/train')"]


def test_the_document_names_the_machine_and_keeps_its_tables_markdown() -> None:
    doc = render_decoding_doc(RESULTS, "python scripts/bench.py --only decoding")
    assert "AMD EPYC 9B14 (x86_64, AVX512, 2 cores)" in doc
    assert "bfloat16 is native there (avx512_bf16)" in doc
    assert "`python scripts/bench.py --only decoding`" in doc and "carry from machine to machine" in doc
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and not lines[i - 1].startswith("|"):
            assert lines[i - 1] == ""  # a table starts after a blank line, as Markdown needs
    emulated = copy.deepcopy(RESULTS)
    emulated["machine"]["bf16_units"] = []
    assert "bfloat16 is not native there" in render_decoding_doc(emulated, "x")


@pytest.mark.slow
def test_the_step_spread_times_real_compiled_steps_and_reports_them() -> None:
    shape = {"n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": 64, "block_size": 32}
    r = bench_step_spread(torch.device("cpu"), runs=1, shape=shape, dtypes=("fp32",))
    ratios = r["dtypes"]["fp32"]["ratios"]
    assert list(ratios) == ["chosen / chosen again", "streamed / streamed again", "chosen / streamed"]
    assert all(len(v) == 1 and 0 < v[0] < math.inf for v in ratios.values())
    assert r["margin"] == STEP_MIN_SPEEDUP
    assert "float32 steps as chosen: head" in "\n".join(format_step_spread(r))
    assert bench_step_spread(torch.device("cpu"), compile=False) == {
        "skipped": "compiled steps only (the bench runs without compile)"}
