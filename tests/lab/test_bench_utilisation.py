"""The bench's utilisation arithmetic against independent counts: MFU per dtype (never above 100%), MBU's
bytes per decode step, and the report's new columns (on a synthetic result: nothing is timed)."""

from __future__ import annotations

import pytest
import torch

from minigpt.fast.layouts import lay_out
from minigpt.lab.bench.generation import kv_bytes_per_token, mbu, weight_bytes
from minigpt.lab.bench.peak import dtype_peak_flops, effective_peak
from minigpt.lab.bench.reference import gpt2_like_config
from minigpt.lab.bench.report import format_train
from minigpt.lab.bench.report_decoding import format_generation
from minigpt.lab.bench.train_step import contender_dtype
from minigpt.model.factory import build_model


def test_peak_of_the_dtype_in_use() -> None:
    cpu = {"fp32_flops": 140e9, "bf16_flops": 0.9e9, "datasheet_tflops": None}
    assert dtype_peak_flops(cpu, "float32") == 140e9 and dtype_peak_flops(cpu, "bfloat16") == 0.9e9
    gpu = {"fp32_flops": 50e12, "bf16_flops": 780e12, "datasheet_tflops": 989.0}
    assert dtype_peak_flops(gpu, "bfloat16") == 989e12  # the datasheet, higher than measured
    assert dtype_peak_flops(gpu, "float32") == 50e12
    names = ("minigpt bf16 simple", "reference bf16", "minigpt compile fp32")
    assert [contender_dtype(n) for n in names] == ["bfloat16", "bfloat16", "float32"]


def test_a_rate_above_the_measured_peak_raises_the_peak_so_no_utilisation_passes_one() -> None:
    assert effective_peak(100.0, [40.0, 90.0]) == (100.0, False)
    peak, raised = effective_peak(100.0, [40.0, 117.0])  # without the raise this would report 117%
    assert raised and peak == 117.0 and max(40.0, 117.0) / peak <= 1.0


@pytest.mark.parametrize("tie", [True, False])
def test_decode_bytes_are_every_matrix_once_plus_the_cache(tie: bool) -> None:
    L, C, V, H = 3, 48, 101, 4
    cfg = gpt2_like_config(n_layer=L, n_head=H, n_embd=C, vocab_size=V, block_size=64)
    cfg.tie_weights = tie
    model = build_model(cfg)
    # per block: c_attn 3C^2 + 3C, c_proj C^2 + C, c_fc 4C^2 + 4C, c_proj 4C^2 + C, two LayerNorms 4C
    per_block = 12 * C * C + 13 * C
    head = V * C  # tied: the one matrix; untied: lm_head, while the embedding table is only looked up
    expected = (L * per_block + 2 * C + head) * 4  # + ln_f; float32
    assert weight_bytes(model) == expected
    assert weight_bytes(model.to(torch.bfloat16)) == expected // 2
    # a prepared model's matrices are the same bytes, whatever module computes them
    assert weight_bytes(lay_out(model, "streamed")) == expected // 2
    assert kv_bytes_per_token(model) == 2 * L * C * 2  # K and V, every layer, bf16 now
    assert mbu(120e6, 0.01, 24e9) == pytest.approx(0.5)  # 120 MB per token at 100 tokens/s of 24 GB/s
    assert mbu(120e6, 0.01, None) is None


def _timing(median: float) -> dict:
    return {"median": median, "min": median, "max": median, "repeats": 1}


def test_the_report_shows_mfu_both_ratios_mbu_and_what_make_train_runs() -> None:
    rows = {"minigpt fp32": {"tokens_per_s": 390.0, "step_s": _timing(5.25), "mfu": 0.52,
                             "peak_mem_bytes": 2**29, "speedup_vs_reference": 1.29,
                             "speedup_vs_best_reference": 1.1, "compile_s": None},
            "reference bf16": {"tokens_per_s": 355.0, "step_s": _timing(5.8), "mfu": 0.2,
                               "peak_mem_bytes": None, "speedup_vs_reference": 1.17,
                               "speedup_vs_best_reference": 1.0, "compile_s": None}}
    shape = {"n_layer": 6, "n_embd": 384, "n_head": 6, "vocab_size": 50304, "block_size": 256,
             "batch_size": 8}
    default = {"row": "minigpt fp32", "dtype": "float32", "compile": False, "reason": "auto: x"}
    train = {"shape": shape, "tokens_per_step": 2048, "contenders": rows, "notes": ["a note"],
             "trainer_default": default}
    text = "\n".join(format_train("M", train))
    assert "| vs ref fp32 | vs best ref |" in text and "| 52% " in text and "1.29x" in text
    assert "`make train` runs minigpt fp32: 1.10x the best reference [dtype auto: x; compile False]" in text
    lat = {"minigpt fp32": {"64": {**_timing(0.01), "mbu": 0.45}, "ratio_64_over_64": 1.0},
           "overhead (same ops, ~no weights)": {"64": _timing(0.0025), "ratio_64_over_64": 1.0}}
    gen = {"shape": {"n_layer": 6, "n_embd": 384, "vocab_size": 50304}, "prompt_tokens": 16,
           "new_tokens": 256,
           "weight_bytes": {"fp32": 120e6}, "read_bytes_per_s": 24e9, "latency": lat,
           "contenders": {"minigpt fp32": {"tokens_per_s": 80.0, "time_s": _timing(3.2), "mbu": 0.41,
                                           "vs_reference": 1.5, "vs_minigpt_fp32": 1.0}},
           "prefill": {"tokens": 512, "minigpt fp32": _timing(0.15), "reference fp32": _timing(0.15)},
           "greedy_tokens_equal_reference": 256, "peak_mem_bytes": 2**27}
    text = "\n".join(format_generation(gen))
    assert "MBU against 24.0 GB/s" in text and "| 41% |" in text and "MBU 45%" in text
    assert "2.50 ms (25%) is overhead" in text
