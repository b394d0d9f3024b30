"""Every stop signal, as a user or a scheduler sends it: Ctrl-C (SIGINT), `kill` (SIGTERM), a closed terminal
(SIGHUP), SLURM's time-limit warning (SIGUSR1/SIGUSR2, `#SBATCH --signal`).

A training stops after the current step with a `last` checkpoint, prints the resume command and exits 128+N;
the printed command, pasted into a shell, continues the run bit for bit (from a folder whose name holds a
space and a non-ASCII letter). Every other command ends with one `interrupted by ...` line, 128+N, and
leaves no temporary folder; one killed outright (SIGKILL) leaves one, which the next start removes. Trainings
are real processes sent real signals; the other commands run in this process and signal themselves at a chosen
point.
"""

from __future__ import annotations

import importlib
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cli_helpers import run_script
from cluster_helpers import weights
from conftest import ROOT, compose_train, fast_overrides

from minigpt import signals
from minigpt.checkpoint import format as ckpt
from minigpt.checkpoint.load import load_model
from minigpt.cli import to_object
from minigpt.data import prepare as prepare_module
from minigpt.data.temporaries import this_host
from minigpt.runs.train import train
from minigpt.training.config import TrainConfig

STOPPED = "stopped before the end, nothing half-written kept"
STEPS = 400  # long enough that a signal sent at step 4 arrives well before the end
RUN = ("trainer.eval_every=100000", "trainer.ckpt_every=100000", "logging.sample_tokens=0",
       "logging.progress_bar=true", "logging.log_every=2")


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return env


def _start(run: Path, args: list[str]) -> tuple[subprocess.Popen, Path]:
    """`python scripts/train.py args` in the background, its output into files beside the run folder."""
    out = run.parent / f"{run.name}.out"
    with out.open("w") as o, (run.parent / f"{run.name}.err").open("w") as e:
        proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "train.py"), *args,
                                 f"hydra.run.dir='{run}'"], cwd=ROOT, env=_env(), stdout=o, stderr=e)
    return proc, out


def _when_printed(out: Path, text: str, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while text not in out.read_text():
        assert proc.poll() is None, f"ended before printing {text!r}: {out.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"no {text!r} in {out}"
        time.sleep(0.02)


@pytest.mark.slow
def test_every_stop_signal_checkpoints_and_the_printed_command_resumes_bitwise(tmp_path, corpus_dir):
    common = [*fast_overrides(tmp_path, corpus_dir), *RUN]
    straight = to_object(compose_train([*common, f"trainer.max_steps={STEPS}"]), TrainConfig)
    train(straight, tmp_path / "straight")  # the reference; it also prepares the data the runs reuse
    runs = {sig: tmp_path / f"run é {sig.name}" for sig in signals.STOP_SIGNALS}  # a space and an é
    started = {sig: _start(run, [*common, f"trainer.max_steps={STEPS}"]) for sig, run in runs.items()}
    for sig, (proc, out) in started.items():
        _when_printed(out, f"step 4/{STEPS} |", proc)
        proc.send_signal(sig)
    for sig, (proc, out) in started.items():
        assert proc.wait(timeout=240) == 128 + sig, out.read_text()[-2000:]
        run, err = runs[sig], (runs[sig].parent / f"{runs[sig].name}.err").read_text()
        printed = out.read_text()
        assert err == "" and "Traceback" not in printed, (sig, err)
        assert f"{sig.name} received: stopping after this step" in printed
        step = int(printed.split("stopped at step ")[1].split(";")[0])
        assert 4 <= step < STEPS
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last"]  # no temporary left
        model, _, meta = load_model(run / "checkpoints" / "last", "cpu")
        assert meta["step"] == ckpt.load_state(run / "checkpoints" / "last")["step"] == step
        assert not (run / "train.lock").exists()

    # The resume command as printed, pasted into a shell: it continues the run to the very same weights.
    sig = signal.SIGHUP
    printed = started[sig][1].read_text()
    command = printed.split("resume with:  ")[1].splitlines()[0]
    assert command.startswith("python scripts/train.py ")
    command = shlex.quote(sys.executable) + command[len("python"):]
    resumed = subprocess.run(["bash", "-c", command], cwd=ROOT, env=_env(), capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got, want = weights(runs[sig]), weights(tmp_path / "straight")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.slow
def test_a_signal_before_the_loop_ends_the_training_in_one_line_and_no_run_folder(tmp_path, corpus_dir,
                                                                                  capsys, monkeypatch):
    """While the data is being prepared there is no step to finish: the run stops at once, unaccepted."""
    real = prepare_module.encode_corpus

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(prepare_module, "encode_corpus", terminated)
    run = tmp_path / "runs" / "run"
    result = run_script("train", [*fast_overrides(tmp_path, corpus_dir), f"hydra.run.dir={run}"], capsys)
    assert result.code == 128 + signal.SIGTERM
    assert result.err_lines == [f"interrupted by SIGTERM: {STOPPED}"]
    assert not (tmp_path / "runs").exists()  # the run folder Hydra made for it is gone again
    assert [p.name for p in (tmp_path / "data").iterdir()] == []  # no half-built dataset


def _interrupt_at(monkeypatch, module, name: str, sig: signal.Signals) -> None:
    """The next call of module.name first sends `sig` to this process (which handles it at once)."""
    real = getattr(module, name)

    def interrupted(*args, **kwargs):
        os.kill(os.getpid(), sig)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, interrupted)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_prepare_interrupted_mid_build_ends_in_one_line_and_leaves_no_temporary(sig, tmp_path, corpus_dir,
                                                                                capsys, monkeypatch):
    _interrupt_at(monkeypatch, prepare_module, "encode_corpus", sig)  # the temporary folder exists by now
    cache = tmp_path / "cache"
    args = ["data=text", f"data.paths=[{corpus_dir}]", "tokenizer=byte", f"data.cache_dir={cache}",
            f"hydra.run.dir={tmp_path / 'out'}"]
    result = run_script("prepare_data", args, capsys)
    assert result.code == 128 + sig
    assert result.err_lines == [f"interrupted by {sig.name}: {STOPPED}"]
    assert "Traceback" not in result.out + result.err
    assert list(cache.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("script, module, name, args", [
    ("evaluate", "minigpt.inspect.perplexity", "score_batches", ["stride=8"]),
    ("generate", "minigpt.generation.run", "stream_tokens", ["max_new_tokens=50", "device=cpu"]),
])
def test_the_other_commands_end_in_one_interrupted_line(script, module, name, args, tmp_path, corpus_dir,
                                                        capsys, monkeypatch):
    run = tmp_path / "run"
    trained = run_script("train", [*fast_overrides(tmp_path, corpus_dir), "trainer.max_steps=2",
                                   "logging.sample_tokens=0", f"hydra.run.dir={run}"], capsys)
    assert trained.code == 0, trained.err
    _interrupt_at(monkeypatch, importlib.import_module(module), name, signal.SIGINT)
    result = run_script(script, [f"checkpoint={run}", *args, f"hydra.run.dir={tmp_path / 'out'}"], capsys)
    assert result.code == 130
    assert result.err_lines == [f"interrupted by SIGINT: {STOPPED}"]
    assert "Traceback" not in result.out + result.err
    assert not list((tmp_path / "out").glob("*.txt")) and not list((tmp_path / "out").glob("*.json"))


@pytest.mark.slow
def test_a_prepare_killed_outright_leaves_a_temporary_that_the_next_start_removes(tmp_path, corpus_dir):
    """SIGKILL cannot be caught: the half-built folder stays, until the next prepare of any dataset in that
    cache sweeps the temporaries of processes that are gone (and only those)."""
    cache = tmp_path / "cache"
    env = {**_env(), "PYTHONFAULTHANDLER": ""}
    # pystdlib with a bpe tokenizer: seconds between the temporary folder's creation and its rename
    prepare = [sys.executable, str(ROOT / "scripts" / "prepare_data.py")]
    proc = subprocess.Popen([*prepare, f"data.cache_dir={cache}", f"hydra.run.dir={tmp_path / 'out'}"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not list(cache.glob(".tmp-*")):
        assert proc.poll() is None and time.monotonic() < deadline, "the prepare ended before its kill"
        time.sleep(0.01)
    proc.kill()
    assert proc.wait() == -signal.SIGKILL
    left = list(cache.glob(".tmp-*"))
    assert len(left) == 1 and f"-{this_host()}-{proc.pid}-" in left[0].name
    name = f".tmp-text-byte-{'0' * 12}"
    alive = cache / f"{name}-{this_host()}-{os.getpid()}-0123abcd"  # this process: it runs
    elsewhere = cache / f"{name}-otherhost-{proc.pid}-0123abcd"  # a PID of another host means nothing here
    alive.mkdir()
    elsewhere.mkdir()
    result = subprocess.run([*prepare, "data=text",
                             f"data.paths=[{corpus_dir}]", "tokenizer=byte", f"data.cache_dir={cache}",
                             f"hydra.run.dir={tmp_path / 'out2'}"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in cache.glob(".tmp-*")) == sorted([alive.name, elsewhere.name])


# ------------------------------------------------------------------------------------------- the policy


def test_the_policy_raises_interrupted_and_keeps_an_inherited_ignore(monkeypatch):
    saved = {sig: signal.getsignal(sig) for sig in signals.STOP_SIGNALS}
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # what `nohup` hands down
        signals.install_policy()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        with pytest.raises(signals.Interrupted) as stopped:
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(1)  # the handler runs at the next bytecode; never reached
        assert isinstance(stopped.value, KeyboardInterrupt) and stopped.value.exit_code == 138
        with signals.GracefulStop() as stop:
            os.kill(os.getpid(), signal.SIGUSR2)
            os.kill(os.getpid(), signal.SIGTERM)  # a second one changes nothing
            assert stop.requested and stop.signal_name == "SIGUSR2"
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN  # still nohup's
        assert signal.getsignal(signal.SIGUSR2) is not signal.SIG_IGN  # the policy's handler is back
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_resend_hands_the_signal_to_its_previous_owner_after_ignoring():
    """A launcher's handler (submitit's) gets the signal after the checkpoint; the policy's own does not."""
    saved = {sig: signal.getsignal(sig) for sig in signals.STOP_SIGNALS}
    got = []
    try:
        signals.install_policy()
        signal.signal(signal.SIGUSR2, lambda signum, frame: got.append(signum))
        signals.ignore_until_exit()
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGUSR2)  # ignored now
        signals.resend(signal.SIGUSR2)
        signals.resend(signal.SIGTERM)  # the policy's handler: not called (it would raise Interrupted)
        assert got == [signal.SIGUSR2]
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        signals.install_policy()
        for sig, handler in saved.items():
            signal.signal(sig, handler)
