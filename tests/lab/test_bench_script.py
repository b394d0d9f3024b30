"""scripts/bench.py end to end: a cheap quick run writes valid JSON and a table; a bad key is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_helpers import run_script

from minigpt.lab.bench.generation import minigpt_generate, reference_generate
from minigpt.lab.bench.reference import gpt2_like_config, reference_model
from minigpt.lab.bench.report import format_report
from minigpt.model.factory import build_model

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench.py"


@pytest.mark.slow
def test_quick_bench_writes_json_and_table(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "quick=true", "only=[peak,attention]", "threads=1", f"json_out={out}"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())
    assert results["machine"]["quick"] is True and results["machine"]["threads"] == 1
    assert set(results["sections"]) == {"peak", "attention"}
    peak = results["sections"]["peak"]
    assert peak["fp32_flops"] > 0 and peak["bf16_flops"] > 0 and peak["read_bytes_per_s"] > 0
    lengths = results["sections"]["attention"]["lengths"]
    assert set(lengths) == {"512", "2048"}
    for row in lengths.values():
        for backend in ("math", "online", "sdpa"):
            assert row[backend]["time_s"]["median"] > 0
    assert "Attention forward" in proc.stdout and "| 2048 |" in proc.stdout
    assert format_report(results) in proc.stdout


def test_unknown_section_is_one_line_and_exit_2(capsys) -> None:
    run = run_script("bench", ["only=[speed]"], capsys)
    assert run.code == 2 and len(run.err_lines) == 1 and "only='speed' is not a section" in run.err


def test_generation_contenders_emit_the_same_greedy_tokens() -> None:
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = gpt2_like_config(n_layer=2, n_head=2, n_embd=32, vocab_size=101, block_size=48)
    model = build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    ref = reference_model(model).eval()
    prompt = [5, 17, 99, 3]
    ours = minigpt_generate(model, prompt, 20)
    uncached = minigpt_generate(model, prompt, 20, use_cache=False)
    theirs = reference_generate(ref, torch.tensor([prompt]), 20)
    assert len(theirs) == 20  # no early stop: eos is off and min_new_tokens is set
    assert ours == uncached == theirs
