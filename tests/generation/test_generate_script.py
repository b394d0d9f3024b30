"""`scripts/generate.py`: the real configs composed, a checkpoint written by the trainer's own save
function, one real CLI run, and every bad input ending in one clear line."""

from __future__ import annotations

import dataclasses
import importlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_helpers import run_script
from hydra import compose, initialize_config_dir
from model_helpers import tiny_config

from minigpt.checkpoint.format import save_checkpoint
from minigpt.cli import to_object
from minigpt.config import register_configs
from minigpt.data.tokenizers import CharTokenizer
from minigpt.errors import UserError
from minigpt.generation.config import GenerateConfig
from minigpt.generation.run import load_for_generation, run_interactive, run_samples
from minigpt.model.factory import build_model

ROOT = Path(__file__).resolve().parents[2]
ALPHABET = "abcdefgh ijklmnop\n():=+-"


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    """A random tiny model with a char tokenizer, saved as a training run would save it."""
    tok = CharTokenizer.from_texts([ALPHABET])
    torch.manual_seed(0)
    model = build_model(tiny_config(n_layer=2, n_head=2, n_embd=32, block_size=16), vocab_size=tok.vocab_size)
    meta = {"model_config": dataclasses.asdict(model.config), "step": 0}
    return save_checkpoint(tmp_path / "ckpt", model, {"step": 0}, meta, tok)


@pytest.fixture(autouse=True)
def own_cache_dir(tmp_path: Path, monkeypatch) -> None:
    """Each test's decode-step cache in its own folder: none reads or writes the repository's."""
    monkeypatch.setattr(sys.modules[__name__], "CACHE_DIR", tmp_path / "cache")


CACHE_DIR = ROOT / "outputs" / "data"  # replaced by each test's own (own_cache_dir)


def config(*overrides: str) -> GenerateConfig:
    """configs/generate.yaml composed exactly as the script composes it (the test's own cache folder)."""
    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "configs")):
        overrides = (f"cache_dir={CACHE_DIR}", *overrides)
        return to_object(compose(config_name="generate", overrides=list(overrides)), GenerateConfig)


def generate_in_process(*overrides: str) -> tuple[str, str]:
    """What the script does after composing: (stdout, stderr)."""
    cfg = config(*overrides)
    loaded = load_for_generation(cfg)
    out, err = io.StringIO(), io.StringIO()
    run_samples(cfg, loaded, out, err)
    return out.getvalue(), err.getvalue()


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    env.pop("HYDRA_FULL_ERROR", None)
    script = [sys.executable, str(ROOT / "scripts" / "generate.py"), f"cache_dir={CACHE_DIR}"]
    return subprocess.run([*script, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


@pytest.mark.slow
def test_cli_samples_stream_and_summarise(ckpt: Path, tmp_path: Path):
    # prompt='ab(': Hydra's override grammar needs quotes around parentheses and other symbols
    args = [f"checkpoint={ckpt}", "prompt='ab('", "max_new_tokens=30", "num_samples=2", "seed=3",
            "device=cpu"]
    proc = run_cli(*args, f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stderr
    out, err = generate_in_process(*args)  # the library with the same config: the same samples
    assert proc.stdout == out and proc.stdout.startswith("ab(")
    summary = proc.stderr.strip().splitlines()[-1]
    assert summary.split("|")[0].strip() == "prompt tokens: 6" and "tokens/s" in summary  # 3 tokens x 2 rows
    assert (tmp_path / "run" / "samples.txt").read_text().count("--- sample") == 2


@pytest.mark.slow
def test_cli_bad_input_is_one_line(ckpt: Path, tmp_path: Path):
    """One subprocess for the error path (every bad input below raises the same UserError the script
    turns into one line); a checkpoint without its tokenizer fails only after loading has begun."""
    for f in (ckpt / "tokenizer").iterdir():
        f.unlink()
    proc = run_cli(f"checkpoint={ckpt}", "prompt=a", "device=cpu", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ") and "tokenizer" in proc.stderr


@pytest.mark.parametrize(
    "override,match",
    [("temperature=-0.5", "temperature"), ("top_p=0", "top_p"), ("top_p=1.01", "top_p"),
     ("top_k=-3", "top_k"), ("max_new_tokens=-1", "max_new_tokens"), ("num_samples=0", "num_samples"),
     ("weights_dtype=fp8", "weights_dtype"), ("window_keep_ratio=0", "window_keep_ratio"),
     ("num_draft_tokens=0", "num_draft_tokens")],
)  # fmt: skip
def test_bad_values_are_user_errors(override: str, match: str):
    with pytest.raises(UserError, match=match) as e:
        config(override)
    assert "\n" not in str(e.value)


def _break(ckpt: Path, how: str) -> str:
    if how == "missing":
        return str(ckpt.parent / "nowhere")
    if how == "corrupt":
        (ckpt / "model.safetensors").write_bytes(b"not a safetensors file")
    if how == "no tokenizer":
        for f in (ckpt / "tokenizer").iterdir():
            f.unlink()
    if how == "bad meta":
        (ckpt / "meta.json").write_text("{ truncated")
    return str(ckpt)


@pytest.mark.parametrize("how", ["missing", "corrupt", "no tokenizer", "bad meta"])
def test_bad_checkpoints_are_user_errors(ckpt: Path, how: str):
    with pytest.raises(UserError) as e:
        generate_in_process(f"checkpoint={_break(ckpt, how)}", "prompt=a", "device=cpu")
    assert "\n" not in str(e.value)


def test_bad_prompts_are_user_errors(ckpt: Path, tmp_path: Path):
    with pytest.raises(UserError, match="'Z'"):  # not in the char tokenizer's alphabet
        generate_in_process(f"checkpoint={ckpt}", "prompt=abZ", "device=cpu")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(UserError, match="empty"):  # a prompt file must hold a prompt
        generate_in_process(f"checkpoint={ckpt}", f"prompt_file={empty}", "device=cpu")
    with pytest.raises(UserError, match="either"):
        config("prompt=a", f"prompt_file={empty}")


def test_empty_prompt_is_unconditional_and_cache_flag_is_honoured(ckpt: Path):
    base = (f"checkpoint={ckpt}", "max_new_tokens=20", "temperature=0", "device=cpu", "stream=false")
    cached, _ = generate_in_process(*base)
    naive, err = generate_in_process(*base, "kv_cache=false")
    assert cached == naive and "prompt tokens: 1 " in err  # started from the end-of-text token alone


def test_interactive_session_reports_rebuilds_and_survives_typos(ckpt: Path):
    cfg = config(f"checkpoint={ckpt}", "interactive=true", "max_new_tokens=10", "device=cpu", "stop=[]")
    loaded = load_for_generation(cfg)
    tok = loaded.tokenizer
    lines = iter(["abc", "Zzz", "def gh", "ijk", ""])
    out, err = io.StringIO(), io.StringIO()
    session = run_interactive(cfg, loaded, lambda: next(lines), out, err)
    log = err.getvalue()
    assert "'Z'" in log and "cache rebuilt" in log  # the typo is reported, 3 turns pass block_size 16
    assert session.history[:3] == tok.encode("abc") and len(session.history) > 16
    assert next(lines, None) is None  # the empty line ended it


def test_streamed_output_stops_before_the_stop_string(ckpt: Path):
    base = (f"checkpoint={ckpt}", "prompt=ab", "max_new_tokens=30", "device=cpu", "seed=5")
    free, _ = generate_in_process(*base)
    stop = free[8:10]  # two characters the free run prints
    want = free[: free.index(stop, 2)]  # everything before their first occurrence after the prompt
    stopped, _ = generate_in_process(*base, f"stop=[{stop!r}]")
    assert stopped.rstrip("\n") == want


@pytest.mark.parametrize("override", ["num_samples=2", "kv_cache=false", "interactive=true"])
def test_a_draft_decodes_one_cached_sample_outside_interactive_mode(override: str):
    with pytest.raises(UserError, match=override.split("=")[0]) as e:
        config("draft=some/checkpoint", override)
    assert "\n" not in str(e.value)


def test_int8_weights_are_offered_by_generate_only():
    assert config("weights_dtype=int8").weights_dtype == "int8"
    from minigpt.inspect.config import EvaluateConfig

    with pytest.raises(UserError, match="weights_dtype='int8'"):
        EvaluateConfig(weights_dtype="int8")


def test_int8_weights_generate_and_report_their_setup(ckpt: Path, caplog):
    import logging

    base = (f"checkpoint={ckpt}", "prompt=ab", "max_new_tokens=12", "temperature=0", "device=cpu")
    with caplog.at_level(logging.DEBUG, logger="minigpt.fast"):
        loaded = load_for_generation(config(*base, "weights_dtype=int8"))
    assert "int8 weights" in caplog.text and "activations" in caplog.text
    from minigpt.model.int8 import Int8Linear

    assert any(isinstance(m, Int8Linear) for m in loaded.step.model.modules())
    out, err = generate_in_process(*base, "weights_dtype=int8")
    assert out.startswith("ab") and len(out) > 3 and "new tokens: 12" in err


def test_a_model_drafting_for_itself_gives_its_own_tokens_all_accepted(ckpt: Path):
    base = (f"checkpoint={ckpt}", "prompt=ab", "max_new_tokens=30", "temperature=0", "device=cpu",
            "stream=false")
    plain, _ = generate_in_process(*base)
    drafted, err = generate_in_process(*base, f"draft={ckpt}", "num_draft_tokens=3")
    assert drafted == plain and "drafts accepted: 100%" in err and "tokens per forward" in err


def test_a_draft_with_another_tokenizer_is_refused(ckpt: Path, tmp_path: Path):
    tok = CharTokenizer.from_texts(["xyz"])
    model = build_model(tiny_config(n_layer=1, n_head=2, n_embd=32, block_size=16), vocab_size=tok.vocab_size)
    meta = {"model_config": dataclasses.asdict(model.config), "step": 0}
    other = save_checkpoint(tmp_path / "other", model, {"step": 0}, meta, tok)
    with pytest.raises(UserError, match="tokenizer"):
        generate_in_process(f"checkpoint={ckpt}", f"draft={other}", "prompt=ab", "device=cpu")


def test_compile_without_a_cpp_compiler_warns_in_one_line_and_decodes(ckpt: Path, tmp_path: Path, capsys,
                                                                       monkeypatch):
    """The script run in this process (cli_helpers.py): the warning is its console's, as the user sees it."""
    importlib.import_module("torch._inductor.config")  # it reads CXX once, on import: the real one
    monkeypatch.setenv("CXX", "/nonexistent/c++")  # what compile=true's check reads, in this process
    args = [f"cache_dir={CACHE_DIR}", f"checkpoint={ckpt}", "prompt=ab", "max_new_tokens=8", "device=cpu",
            "compile=true", f"hydra.run.dir={tmp_path / 'run'}"]
    run = run_script("generate", args, capsys)
    assert run.code == 0, run.err
    warnings = [line for line in run.err.splitlines() if "compile" in line]
    assert len(warnings) == 1 and "C++ compiler" in warnings[0] and "Traceback" not in run.err
    assert run.out.startswith("ab")


@pytest.mark.slow
def test_compile_true_compiles_before_the_prompt_and_decodes_as_eager(ckpt: Path):
    """The summary's speed is decoding's: the steps are compiled on load (said in the summary), and the
    generation itself then compiles nothing; the samples are the eager ones. Plain decoding first, which
    chooses the model's step and keeps it; then speculative decoding with the model as its own draft, whose
    two steps are that kept one, and whose verification rounds must be compiled on load as well."""
    for draft in (False, True):
        args = [f"checkpoint={ckpt}", "prompt=ab", "max_new_tokens=40", "num_samples=1", "seed=3",
                "device=cpu", "temperature=0", *([f"draft={ckpt}", "num_draft_tokens=3"] if draft else [])]
        eager_out, eager_err = generate_in_process(*args)
        cfg = config(*args, "compile=true")
        loaded = load_for_generation(cfg)
        assert loaded.compile_s > 0 and loaded.step.compiled and (loaded.draft is not None) == draft
        out, err = io.StringIO(), io.StringIO()
        with torch.compiler.set_stance("fail_on_recompile"):  # raises if the decoding compiles anything
            run_samples(cfg, loaded, out, err)
        assert out.getvalue() == eager_out, draft  # 40 tokens: past the 16-token context, windows rebuilt
        assert "compiled in" in err.getvalue() and "compiled in" not in eager_err
        assert len(list((CACHE_DIR / "decode").glob("decode-*.json"))) == 1  # one model, one step kept


def test_compile_auto_says_in_the_summary_what_it_chose_and_why(ckpt: Path):
    """Nothing compiled on this machine yet (an empty cache folder): eager, and the summary says why."""
    _, err = generate_in_process(f"checkpoint={ckpt}", "prompt=ab", "max_new_tokens=4", "device=cpu",
                                 "compile=auto")
    summary = err.strip().splitlines()[-1]
    assert summary.endswith("| compile=auto: eager: nothing compiled on this machine yet to say what "
                            "compiling costs (compile=true)")
    assert "compiled in" not in summary and not (CACHE_DIR / "decode").exists()
