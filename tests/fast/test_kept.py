"""The decode-step cache (fast/kept.py): a kept step is the one chosen before and decodes as the eager step
does, packaged, in a later process; its key changes with torch, the CPU, the model and its dtype; a damaged
record or artifact file is chosen again with one line, never used; two processes writing at once leave a
whole record."""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch._dynamo
from model_helpers import tiny_config

from minigpt.device.runtime import compile_problem
from minigpt.fast import fastest
from minigpt.fast.gate import TOLERANCE
from minigpt.fast.kept import Kept, StepCache
from minigpt.fast.step import DEFAULT, Plan
from minigpt.model.factory import build_model

MACHINE = {"torch": "2.13.0", "cpu": "AMD EPYC 9R14", "isa": "AVX512", "cpu_flags": "0123456789abcdef"}
KEPT = Kept(Plan("in_out", "packed", onednn=False, attention="math"), ["products in_out"], 12.5,
            {"eager": 2e-3, "compiled": 5e-4})


def _tiny(n_embd: int = 32, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    config = tiny_config(n_layer=2, n_head=2, n_embd=n_embd, block_size=24, vocab_size=61)
    return build_model(config).eval().to(dtype)


def _cache(folder: Path, **machine) -> StepCache:
    return StepCache(folder, lambda: {**MACHINE, **machine})


def test_a_kept_record_reads_back_as_written(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    key = cache.key(_tiny(), 2, True)
    assert cache.read(key) is None  # nothing kept yet: a quiet miss
    cache.write(key, KEPT, b"artifacts")
    record = json.loads(next(tmp_path.glob("decode-*.json")).read_text())
    assert record["key"]["model"]["n_embd"] == 32 and record["key"]["rows"] == 2
    kept = cache.peek(key)
    assert kept == dataclasses.replace(KEPT, artifacts=kept.artifacts)
    assert (tmp_path / kept.artifacts["file"]).read_bytes() == b"artifacts"


@pytest.mark.parametrize("change", [
    {"torch": "2.14.0"}, {"cpu": "Intel Xeon Platinum 8488C"}, {"isa": "AVX2"}, {"cpu_flags": "fedcba98"},
    {"n_embd": 48}, {"dtype": torch.bfloat16}, {"rows": 3}, {"compile": False},
])  # fmt: skip
def test_the_key_changes_with_torch_the_cpu_the_model_and_its_dtype(change: dict, tmp_path: Path) -> None:
    machine = {k: v for k, v in change.items() if k in MACHINE}
    _cache(tmp_path).write(_cache(tmp_path).key(_tiny(), 2, True), KEPT)  # no artifacts: none to load
    model = _tiny(change.get("n_embd", 32), change.get("dtype", torch.float32))
    key = _cache(tmp_path, **machine).key(model, change.get("rows", 2), change.get("compile", True))
    assert _cache(tmp_path, **machine).read(key) is None
    assert _cache(tmp_path).peek(_cache(tmp_path).key(_tiny(), 2, True)) == KEPT  # the first one is intact


def _choose_once(monkeypatch, plan: Plan = DEFAULT) -> list:
    """fastest.choose_plan replaced by one that records its calls and chooses `plan` at once."""
    calls = []
    monkeypatch.setattr(fastest, "choose_plan", lambda m, rows, compile: calls.append(rows) or (
        dataclasses.replace(plan, compiled=compile), ["ok"]))
    return calls


@pytest.mark.parametrize("damage", ["record", "key", "artifacts"])
def test_a_damaged_cache_is_chosen_again_with_one_line_and_rewritten(damage: str, monkeypatch, caplog,
                                                                     tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    key = cache.key(_tiny(), 1, False)
    cache.write(key, Kept(Plan("in_out", "in_out"), ["kept"], 1.0), b"artifacts")
    record = next(tmp_path.glob("decode-*.json"))
    if damage == "record":
        record.write_text(record.read_text()[:40])  # half a file
    elif damage == "key":  # a record filed under another key's name
        record.write_text(record.read_text().replace('"rows": 1', '"rows": 5'))
    else:
        next(tmp_path.glob("decode-*.inductor")).write_bytes(b"artifactz")
    calls = _choose_once(monkeypatch)
    with caplog.at_level(logging.INFO, logger="minigpt.fast"):
        step = fastest.fastest_step(_tiny(), rows=1, cache=cache)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert len(lines) == 1 and f"decode cache {record} is damaged" in lines[0], lines
    assert calls == [1] and step.plan == DEFAULT  # chosen again, not taken from the damaged file
    assert cache.peek(key) == Kept(DEFAULT, ["ok"], cache.peek(key).choose_s)  # and kept whole again


def test_a_kept_plan_is_not_measured_again(monkeypatch, tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    cache.write(cache.key(_tiny(), 2, False), Kept(Plan("in_out", "in_out"), ["products in_out"], 1.0))
    calls = _choose_once(monkeypatch)
    step = fastest.fastest_step(_tiny(), rows=2, cache=cache)
    assert calls == [] and step.plan == Plan("in_out", "in_out") and "kept" in step.notes


# One run of `generate compile=true`'s choosing in a process of its own, with the choice injected (the math
# attention) and Inductor's disk cache in a folder of its own: the decode-step cache is all two runs share.
RUN = """
import json, sys, torch
from model_helpers import tiny_config
from minigpt.fast import fastest
from minigpt.fast.kept import StepCache
from minigpt.fast.step import Plan
from minigpt.model.factory import build_model
from minigpt.sampling.decode import decode_forward
torch.set_num_threads(1)
torch.manual_seed(0)
model = build_model(tiny_config(n_layer=2, n_head=2, n_embd=32, block_size=24, vocab_size=61)).eval()
chosen = []
plan = lambda compile: Plan(attention="math", compiled=compile)
fastest.choose_plan = lambda m, rows, compile: chosen.append(rows) or (plan(compile), [])
cache = StepCache(sys.argv[1], lambda: json.loads(sys.argv[2]))
step = fastest.fastest_step(model, rows=1, compile=True, cache=cache,
                            measure_steps=lambda steps, rows: {name: [1e-3] for name in steps})
tokens = torch.randint(0, 61, (1, 12), generator=torch.Generator().manual_seed(1))
caches, errors = [model.new_kv_cache(1), model.new_kv_cache(1)], []
with torch.no_grad():
    for cache in caches:
        model(tokens[:, :8], kv_cache=cache)  # a prompt prefilled, as generation and the gate's probe do
    for t in range(8, tokens.shape[1]):
        token = tokens[:, t:t + 1].clone()  # (1, 1) contiguous, as generation feeds it
        want = decode_forward(model, token, caches[0])  # (1, 1, V)
        errors.append(((step(token, caches[1]) - want).abs().max() / want.std()).item())
print(json.dumps({"chosen": chosen, "plan": step.plan.to_dict(), "notes": step.notes, "error": max(errors),
                  "traced": "torch._dynamo" in sys.modules}))
"""


@pytest.mark.slow
def test_a_step_packaged_by_one_process_starts_the_next_untraced_and_decodes_as_eager(tmp_path: Path):
    """The round trip, in two processes: the first chooses (injected), packages, gates and keeps the step; the
    second, its Inductor disk cache empty, loads the package without choosing, tracing or even importing the
    compiler (no Dynamo), passes the gate and gives the eager logits within the gate's tolerance."""
    if compile_problem(torch.device("cpu")):
        pytest.skip(compile_problem(torch.device("cpu")))
    tests = Path(__file__).resolve().parents[1]
    run = lambda name: json.loads(subprocess.run(
        [sys.executable, "-c", RUN, str(tmp_path / "cache"), json.dumps(MACHINE)],
        env={**os.environ, "PYTHONPATH": str(tests), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / name)},
        capture_output=True, text=True, check=True, timeout=600).stdout.splitlines()[-1])
    first, second = run("inductor-first"), run("inductor-second")
    assert first["chosen"] == [1] and first["notes"][-1].startswith("decode step packaged")
    assert len(list((tmp_path / "cache").glob("*.pt2"))) == 1
    assert second["chosen"] == [] and "kept, packaged" in second["notes"] and not second["traced"]
    assert second["plan"] == first["plan"] and second["plan"]["attention"] == "math"
    assert max(first["error"], second["error"]) <= TOLERANCE[torch.float32]


def _write_many(folder: str, n: int, tag: str) -> None:
    cache = _cache(Path(folder))
    key = cache.key(_tiny(), 1, True)
    for i in range(n):
        cache.write(key, Kept(DEFAULT, [f"{tag} {i}"], float(i)), f"{tag} {i}".encode() * 1000)


@pytest.mark.slow
def test_two_processes_writing_at_once_leave_a_whole_record(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_write_many, args=(str(tmp_path), 40, tag)) for tag in ("a", "b")]
    for writer in writers:
        writer.start()
    cache = _cache(tmp_path)
    key = cache.key(_tiny(), 1, True)
    seen = [cache.peek(key) for _ in range(200)]  # read while they write: a whole record or none
    for writer in writers:
        writer.join()
        assert writer.exitcode == 0
    assert all(kept is None or kept.notes[0].split()[0] in "ab" for kept in seen)
    kept = cache.peek(key)
    assert kept is not None and kept.notes in (["a 39"], ["b 39"])
    artifacts = (tmp_path / kept.artifacts["file"]).read_bytes()
    assert artifacts == f"{kept.notes[0]}".encode() * 1000  # the artifacts its record names: the writer's own
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary file left behind
