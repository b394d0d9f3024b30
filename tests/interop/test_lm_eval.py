"""The lm-evaluation-harness model: loglikelihoods, rolling loglikelihoods and generations equal an
independent computation from the model's logits (one sequence per forward, no batching, padding or KV cache),
and the shipped task scores what those logits say, through scripts/evaluate.py and lm_eval's real command
line."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cli_helpers import run_script
from conftest import ROOT
from interop_helpers import SHAPES, make_checkpoint, save_model, small_bpe, stdlib_texts, wide_model

from minigpt.data.documents import Document
from minigpt.errors import UserError
from minigpt.inspect.perplexity import sliding_window_loss

pytest.importorskip("lm_eval")
from lm_eval.api.instance import Instance  # noqa: E402

from minigpt.interop.harness import run_harness  # noqa: E402
from minigpt.interop.harness_task import ITEMS_FILE, N_CHOICES, next_line_items, read_items  # noqa: E402
from minigpt.interop.lm_eval_model import MinigptLM  # noqa: E402

TASK_YAML = ROOT / "minigpt" / "interop" / "tasks" / "stdlib_next_line.yaml"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    return make_checkpoint(tmp_path_factory.mktemp("lm_eval") / "ckpt", "demo")


@pytest.fixture(scope="module")
def short_context(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    """The demo block with a 24-token context: most of the shipped task's contexts and many of its lines do
    not fit (as with the `debug=fast` smoke model)."""
    model = wide_model(dataclasses.replace(SHAPES["demo"], block_size=24), small_bpe().vocab_size)
    return save_model(tmp_path_factory.mktemp("lm_eval") / "short", model, small_bpe()), model


def _request(kind: str, *args) -> Instance:
    return Instance(request_type=kind, doc={}, arguments=args, idx=0)


def _scored(model, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """Sum of log p(continuation | context) and whether each token is the argmax, log-softmax in float64. The
    continuation's ids are taken L = block_size at a time, each group predicted by one forward of the L ids
    before its last id: one forward of the last L ids when it fits, lm-eval's rolling windows when not."""
    L, seq, start = model.config.block_size, context + continuation, len(context)
    total, greedy = 0.0, True
    for a in range(0, len(continuation), L):
        b = min(a + L, len(continuation))  # continuation[a:b], the ids seq[start + a : start + b]
        window = seq[max(0, start + b - 1 - L):start + b - 1]
        with torch.no_grad():
            logprobs = model(torch.tensor([window]))[0][0].double().log_softmax(-1)  # (T, V)
        rows, target = logprobs[len(window) - (b - a):], torch.tensor(continuation[a:b])
        total += rows.gather(1, target[:, None]).sum().item()
        greedy &= bool((rows.argmax(-1) == target).all())
    return total, greedy


def _split(tok, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """What is scored: trailing spaces of the context join the continuation (a newline stays), the
    continuation is the whole text's ids after the context's, or its own where those do not start with the
    context's; an empty context is <|endoftext|>."""
    if not context:
        return [tok.eot_id], tok.encode(continuation)
    stripped = context.rstrip(" ")
    context, continuation = stripped, context[len(stripped):] + continuation
    whole, ids = tok.encode(context + continuation), tok.encode(context)
    return ids, whole[len(ids):] if whole[: len(ids)] == ids else tok.encode(continuation)


def test_loglikelihoods_equal_the_models_log_softmax(checkpoint) -> None:
    ckpt, model = checkpoint
    lm = MinigptLM(checkpoint=str(ckpt), device="cpu", batch_size=3)  # 3: batches of unequal rows
    tok = small_bpe()
    text = stdlib_texts()[0]
    pairs = [("def f(x):\n", "    return x\n"), ("", "import os"), ("class A:", " pass"), ("x = ", "1"),
             (text[: text.index("\n", 3000) + 1], "    pass\n"),
             ("import json\n", "\n\nclass A:\n")]  # "\n\n\n" is one piece: the two are encoded apart
    got = lm.loglikelihood([_request("loglikelihood", c, x) for c, x in pairs])
    for (context, continuation), (logprob, is_greedy) in zip(pairs, got, strict=True):
        want, want_greedy = _scored(model, *_split(tok, context, continuation))
        assert logprob == pytest.approx(want, abs=1e-4) and is_greedy == want_greedy, context[:20]
        assert logprob < 0


def test_what_does_not_fit_the_context_is_scored_in_windows_and_noted_once(short_context, caplog) -> None:
    """A context longer than the model's is cut to its tail, a continuation longer than it is scored in
    rolling windows, both against `_scored`; each kind is noted once, with how many requests it concerns."""
    ckpt, model = short_context
    lm = MinigptLM(checkpoint=str(ckpt), device="cpu", batch_size=2)
    tok, L = small_bpe(), model.config.block_size
    text = tok.encode(stdlib_texts()[0])
    pairs = [(text[:5], text[5:9]),  # fits
             (text[:3 * L], text[3 * L:3 * L + 4]),  # the context cut
             (text[:2], text[2:2 + 2 * L + 5]),  # the continuation in three windows
             (text[:L], text[L:2 * L]),  # both, the continuation exactly one window
             (text[:40], text[40:41 + L])]  # both, one id more than a window
    with caplog.at_level(logging.WARNING, logger="minigpt.interop.lm_eval_model"):
        got = lm._loglikelihood_tokens([(("c", "x"), ctx, cont) for ctx, cont in pairs])
    for (ctx, cont), (logprob, is_greedy) in zip(pairs, got, strict=True):
        want, want_greedy = _scored(model, ctx, cont)
        assert logprob == pytest.approx(want, abs=1e-4) and is_greedy == want_greedy, (len(ctx), len(cont))
    notes = [r.getMessage() for r in caplog.records]
    assert notes == [f"note: 4 of 5 requests have more context than the model's {L} tokens; each was scored "
                     "from the last tokens that fit",
                     f"note: 2 of 5 continuations are longer than the model's {L} tokens; each was scored in "
                     f"windows of {L} tokens, as a rolling log-likelihood is"], notes


def test_a_continuation_greedy_decoding_produces_is_flagged_greedy(checkpoint) -> None:
    ckpt, model = checkpoint
    lm = MinigptLM(checkpoint=str(ckpt), device="cpu")
    tok = small_bpe()
    context = tok.encode("def decode(self, s):\n")
    ids = list(context)
    with torch.no_grad():
        for _ in range(6):  # greedy by hand: the argmax of the last position, fed back
            ids.append(int(model(torch.tensor([ids]))[0][0, -1].argmax()))
    ((_, is_greedy), (_, other)) = lm._loglikelihood_tokens(
        [(None, context, ids[len(context):]), (None, context, [*ids[len(context):-1], (ids[-1] + 1) % 500])])
    assert is_greedy and not other


def test_rolling_loglikelihood_scores_every_token_once(checkpoint) -> None:
    """Short text: sum of log p(t_i | <|endoftext|>, t_<i>). Long text: the sliding-window loss of
    inspect/perplexity.py with disjoint windows (stride = block_size) scores the same windows."""
    ckpt, model = checkpoint
    lm = MinigptLM(checkpoint=str(ckpt), device="cpu")
    tok = small_bpe()
    short, long = "def f(x):\n    return x * 2\n", stdlib_texts()[1][:4000]
    requests = [_request("loglikelihood_rolling", t) for t in (short, long)]
    got_short, got_long = lm.loglikelihood_rolling(requests)
    assert got_short == pytest.approx(_scored(model, [tok.eot_id], tok.encode(short))[0], abs=1e-4)
    tokens = torch.tensor([tok.eot_id, *tok.encode(long)])
    assert len(tokens) > 3 * model.config.block_size
    windows = sliding_window_loss(model, tokens, stride=model.config.block_size)
    assert got_long == pytest.approx(-windows.score.nats, rel=1e-5)


def test_generate_until_is_greedy_decoding_cut_at_the_stop_string(checkpoint) -> None:
    """Batched, KV-cached decoding against a loop that re-reads the whole window for every token."""
    ckpt, model = checkpoint
    lm = MinigptLM(checkpoint=str(ckpt), device="cpu", batch_size=2)
    tok = small_bpe()
    contexts = ["def decode(self, s):\n", "import", "class JSONDecoder(object):\n    def __init__(self"]
    kwargs = {"until": ["\n\n", ")"], "max_gen_toks": 40}
    got = lm.generate_until([_request("generate_until", c, dict(kwargs)) for c in contexts])
    for context, text in zip(contexts, got, strict=True):
        ids = tok.encode(context)
        new: list[int] = []
        with torch.no_grad():
            while len(new) < 40 and not any(s in tok.decode(new) for s in kwargs["until"]):
                token = int(model(torch.tensor([(ids + new)[-model.config.block_size:]]))[0][0, -1].argmax())
                if token == tok.eot_id:  # the end of a document ends the generation
                    break
                new.append(token)
        want = tok.decode(new)
        cut = min([want.find(s) for s in kwargs["until"] if s in want], default=len(want))
        assert text == want[:cut]


def test_the_next_line_items_are_built_from_real_functions() -> None:
    docs = [Document(f"m{i}.py", t) for i, t in enumerate(stdlib_texts())]
    items = next_line_items(docs, 30, seed=0)
    assert len(items) == 30 and items == next_line_items(docs, 30, seed=0)
    for item in items:
        choices, gold = item["choices"], item["gold"]
        assert len(set(choices)) == N_CHOICES and all(c.endswith("\n") for c in choices)
        assert item["context"].lstrip().startswith(("def ", "async def "))
        name, line = item["source"].split(":")
        lines = docs[int(name[1:-3])].text.splitlines(keepends=True)
        start = int(line) - 1
        n = item["context"].count("\n")
        assert "".join(lines[start:start + n]) == item["context"] and lines[start + n] == choices[gold]
        indent = len(choices[gold]) - len(choices[gold].lstrip(" "))
        assert all(len(c) - len(c.lstrip(" ")) == indent for c in choices)  # no clue in the indentation
    shipped = read_items(ITEMS_FILE)
    assert len(shipped) == 200 and all(len(set(i["choices"])) == N_CHOICES for i in shipped)


@pytest.mark.slow  # lm-eval's simple_evaluate asks `git` for the version it records
def test_evaluate_script_scores_the_shipped_task_as_the_logits_say(short_context, tmp_path: Path, capsys):
    """On a model whose context most items do not fit (the crash of a `debug=fast` model): each request
    scored as `_scored` says, and what did not fit said once."""
    ckpt, model = short_context
    run = run_script("evaluate", [f"checkpoint={ckpt}", "harness_tasks=[stdlib_next_line]", "device=cpu",
                                  f"hydra.run.dir={tmp_path}"], capsys)
    assert run.code == 0, run.err
    assert "stdlib_next_line" in run.out and "acc_norm" in run.out
    notes = [line for line in run.out.splitlines() if line.startswith("note: ")]
    assert [n.split(" of 800 ")[1].split(" ")[0] for n in notes] == ["requests", "continuations"], notes
    scores = json.loads((tmp_path / "results.json").read_text())["harness"]["stdlib_next_line"]
    tok = small_bpe()
    right = right_norm = 0
    items = read_items()
    for item in items:
        logprobs = [_scored(model, *_split(tok, item["context"], c))[0] for c in item["choices"]]
        normed = [lp / len(c) for lp, c in zip(logprobs, item["choices"], strict=True)]  # lm-eval: characters
        right += max(range(N_CHOICES), key=logprobs.__getitem__) == item["gold"]
        right_norm += max(range(N_CHOICES), key=normed.__getitem__) == item["gold"]
    assert scores["acc,none"] == pytest.approx(right / len(items))
    assert scores["acc_norm,none"] == pytest.approx(right_norm / len(items))


def test_bad_harness_input_is_one_line(checkpoint, tmp_path: Path, capsys) -> None:
    ckpt, _ = checkpoint
    (tmp_path / "not_yaml.yaml").write_text("task: [\n")
    (tmp_path / "no_task.yaml").write_text("metric_list: []\n")
    cases = [(["harness_tasks=[]"], "names no task"),
             (["harness_tasks=[stdlib_next_line]", "stride=4"], "stride= does not apply"),
             ([f"harness_tasks=[{tmp_path / 'nowhere.yaml'}]"], f"file {tmp_path / 'nowhere.yaml'} does not"),
             ([f"harness_tasks=[{tmp_path / 'not_yaml.yaml'}]"], f"cannot read the task file {tmp_path}"),
             ([f"harness_tasks=[{tmp_path / 'no_task.yaml'}]"], "is not an lm-eval task file"),
             (["harness_tasks=[stdlib_next_line]", f"checkpoint={tmp_path / 'none'}"], "does not exist")]
    for args, message in cases:
        args = [f"checkpoint={ckpt}", *args, f"hydra.run.dir={tmp_path / 'run'}"]
        run = run_script("evaluate", args, capsys)
        assert run.code == 2 and len(run.err_lines) == 1 and message in run.err, run.err
        assert run.err.startswith("error: ") and "Traceback" not in run.err + run.out
        assert not (tmp_path / "run").exists()  # a refused command leaves no run folder


@pytest.mark.parametrize(("model_args", "message"), [
    ("checkpoint={ckpt},weights_dtype=float16", "weights_dtype=float16 is not supported on CPU"),
    ("checkpoint={ckpt},weights_dtype=int4", "weights_dtype='int4' is not one of"),
    ("checkpoint={ckpt},batch_size=many", "batch_size='many' is not a whole number"),
    ("checkpoint={ckpt},chekpoint=x", "no key chekpoint (the keys: checkpoint, device"),
])
def test_bad_model_args_of_lm_evals_command_line_are_one_line(model_args, message, checkpoint, capsys):
    """What `lm_eval --model minigpt --model_args ...` calls (the real command: the slow test below)."""
    with pytest.raises(SystemExit) as ended:
        MinigptLM.create_from_arg_string(model_args.format(ckpt=checkpoint[0]), {"device": "cuda:0"})
    err = capsys.readouterr().err
    assert ended.value.code == 2 and err == f"error: --model_args: {err.split('--model_args: ')[1]}"
    assert message in err and err.count("\n") == 1, err


@pytest.mark.slow  # indexes lm-eval's own task files (~20 s) to know the name is none of them
def test_an_unknown_task_is_one_line(checkpoint, tmp_path: Path, capsys) -> None:
    ckpt, _ = checkpoint
    with pytest.raises(UserError, match="knows no task no_such_task"):
        run_harness(str(ckpt), ["no_such_task"])


@pytest.mark.slow  # starts lm_eval's own command line (it indexes lm-eval's task files first: ~30 s)
def test_lm_eval_command_line_runs_the_shipped_task_offline(checkpoint, tmp_path: Path) -> None:
    """`lm_eval --model minigpt --model_args checkpoint=... --tasks <the shipped YAML>`, with the network off
    for Hugging Face's libraries, from another folder; the score is the one the library API gives."""
    ckpt, _ = checkpoint
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cli = Path(sys.executable).with_name("lm_eval")
    args = [str(cli), "--model", "minigpt", "--model_args", f"checkpoint={ckpt},device=cpu", "--tasks",
            str(TASK_YAML), "--limit", "40", "--batch_size", "8", "--output_path", str(tmp_path / "results")]
    run = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    (result_file,) = (tmp_path / "results").rglob("results_*.json")
    cli_acc = json.loads(result_file.read_text())["results"]["stdlib_next_line"]["acc,none"]
    api = run_harness(str(ckpt), ["stdlib_next_line"], device="cpu", limit=40)
    assert cli_acc == api["results"]["stdlib_next_line"]["acc,none"]
    assert "|stdlib_next_line|" in run.stdout


def _progress(line: str) -> bool:
    """A line of one of lm-eval's progress bars, which it draws on stderr while it works."""
    return "%|" in line or line.startswith("fatal: not a git repository")


@pytest.mark.slow  # starts lm_eval's own command line (it indexes lm-eval's task files first: ~30 s)
def test_lm_evals_command_line_with_a_missing_checkpoint_is_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cli = Path(sys.executable).with_name("lm_eval")
    args = [str(cli), "--model", "minigpt", "--model_args", f"checkpoint={tmp_path / 'nowhere'}", "--tasks",
            str(TASK_YAML), "--limit", "4"]
    run = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    ours = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    assert run.returncode == 2 and "Traceback" not in run.stderr + run.stdout, run.stderr[-3000:]
    assert ours == [f"error: --model_args: checkpoint path '{tmp_path / 'nowhere'}' does not exist (give a "
                    "checkpoint or run folder)"], run.stderr[-3000:]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # a real process, sent a real Ctrl-C
def test_ctrl_c_while_lm_eval_bootstraps_its_error_bars_is_one_line(short_context, tmp_path: Path) -> None:
    """The shipped task with its scores aggregated by the median, whose error bar lm-eval bootstraps in a pool
    of worker processes: Ctrl-C reaches the whole process group there. One line (no worker's traceback),
    exit code 130, and no run folder."""
    task = tmp_path / "median.yaml"
    task.write_text(TASK_YAML.read_text().replace("task: stdlib_next_line", "task: next_line_median")
                    .replace("aggregation: mean", "aggregation: median"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    cmd = [sys.executable, str(ROOT / "scripts" / "evaluate.py"), f"checkpoint={short_context[0]}",
           f"harness_tasks=[{task}]", "device=cpu", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # a process group of its own, as a terminal gives it
    for line in proc.stdout:
        if line.startswith("bootstrapping for stddev"):
            time.sleep(0.5)  # the pool's workers are at work
            os.killpg(proc.pid, signal.SIGINT)
            break
    out, err = proc.communicate(timeout=300)
    lines = [line for line in err.splitlines() if line.strip() and not _progress(line)]
    assert proc.returncode == 130, (proc.returncode, err[-3000:])
    assert lines == ["interrupted by SIGINT: stopped before the end, nothing half-written kept"], err[-3000:]
    assert "Traceback" not in err + out and not (tmp_path / "run").exists()
