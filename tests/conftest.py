"""Shared fixtures: the real Hydra configs composed with the fast debug preset, and a tiny text corpus.

Two tiers: `make test-fast` (`pytest -m "not slow"`) runs every test that starts no process and trains
nothing, the inner loop of an edit; `make test` runs everything. A test outside the `slow` tier that starts a
process (subprocess, multiprocessing, a fork) or runs the trainer fails at once, naming the marker it needs
(`processes_and_training_refused`, checked by tests/project/test_tiers.py).

Order independence: pytest-randomly runs the tests in a random order (the seed is printed at the end; replay
an order with `pytest -p randomly --randomly-seed=<seed>`, or turn it off with `-p no:randomly`), and
`seed_every_test` starts every test from the same RNG state whatever ran before it, so a test's numbers do
not depend on the order or on that seed.
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import random
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from minigpt.cli import to_object
from minigpt.config import register_configs
from minigpt.signals import STOP_SIGNALS
from minigpt.training.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "configs"

# Two CPU cores are shared by the whole suite: one intra-op thread per test process keeps runs predictable.
# OMP_NUM_THREADS is also the most minigpt's measured thread choice uses (device/threads.py), in this process
# and in the commands the tests start, so no command measures the load unless its test asks for it.
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)

TEST_SEED = 0

# The suite sends stop signals to the trainer and to the commands it starts, and checks what they do. A
# suite started in the background of a script (`cmd &`: SIGINT ignored) or under nohup (SIGHUP ignored)
# would hand those dispositions to every process, and minigpt rightly leaves an inherited "ignore" alone
# (minigpt/signals.py), so every stop signal starts from its default here, as in a terminal.
for _sig in STOP_SIGNALS:
    if signal.getsignal(_sig) is signal.SIG_IGN:
        signal.signal(_sig, signal.default_int_handler if _sig == signal.SIGINT else signal.SIG_DFL)


def pytest_configure(config: pytest.Config) -> None:
    # pytest-randomly would reseed `random` and numpy from its order seed before each test body; the seed
    # of the numbers is `seed_every_test`'s alone, so one order seed replays one order and nothing else.
    if hasattr(config.option, "randomly_reset_seed"):
        config.option.randomly_reset_seed = False


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    seed = getattr(config.option, "randomly_seed", None)
    if isinstance(seed, int):  # under `-q` pytest-randomly's own header line is not shown
        terminalreporter.write_line(f"test order: --randomly-seed={seed} "
                                    f"(replay it with: pytest -p randomly --randomly-seed={seed})")


@contextlib.contextmanager
def processes_and_training_refused(test: str) -> Iterator[None]:
    """Inside: starting a process or running the trainer fails the test with the line that says to mark it."""
    from minigpt.training.trainer import Trainer

    def refuse(what: str):
        def refused(*args, **kwargs):
            pytest.fail(f"{test} {what}; mark it @pytest.mark.slow (the fast tier starts no process and "
                        "trains nothing)", pytrace=False)
        return refused

    targets = [(subprocess.Popen, "__init__", "starts a process"),
               (multiprocessing.process.BaseProcess, "start", "starts a process"),
               (os, "fork", "forks a process"), (Trainer, "fit", "trains a model")]
    with contextlib.ExitStack() as stack:
        for owner, name, what in targets:
            stack.enter_context(mock.patch.object(owner, name, refuse(what)))
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    with _tier_guard(item):  # fixtures too: a module-scoped fixture that trains is set up here
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    with _tier_guard(item):
        return (yield)


def _tier_guard(item: pytest.Item) -> contextlib.AbstractContextManager:
    slow = item.get_closest_marker("slow") is not None
    return contextlib.nullcontext() if slow else processes_and_training_refused(item.nodeid)


@pytest.fixture(autouse=True)
def seed_every_test() -> None:
    """Every test starts from seed 0 in torch, numpy and `random`, whichever tests ran before it."""
    random.seed(TEST_SEED)
    np.random.seed(TEST_SEED)
    torch.manual_seed(TEST_SEED)


@pytest.fixture(autouse=True)
def restore_stop_signal_handlers() -> Iterator[None]:
    """Every test leaves the stop signals' handlers as it found them: a command run in this process installs
    minigpt's own (minigpt/signals.py), which a later test must not inherit."""
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def compose_train(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """Compose configs/train.yaml exactly as `scripts/train.py` would, with command-line style overrides."""
    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONFIG_DIR)):
        return compose(config_name="train", overrides=list(overrides))


def write_corpus(folder: Path, n_files: int = 6, lines: int = 120) -> Path:
    """Small, learnable text files: repeated Python-like lines with a little variety."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        body = "".join(
            f"def f{j % 7}(x):\n    return x * {j % 5} + {i}\n\n" if j % 3 else f"# note {j} of file {i}\n"
            for j in range(lines)
        )
        (folder / f"part{i}.txt").write_text(body)
    return folder


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    return write_corpus(tmp_path / "corpus")


def fast_overrides(tmp_path: Path, corpus: Path) -> list[str]:
    """The debug preset on a tmp corpus, with every output under tmp_path."""
    return ["debug=fast", "data=text", f"data.paths=[{corpus}]", f"data.cache_dir={tmp_path / 'data'}"]


@pytest.fixture
def make_train_cfg(tmp_path: Path, corpus_dir: Path):
    """Factory: a validated TrainConfig for the fast preset plus extra overrides."""

    def make(*extra: str) -> TrainConfig:
        return to_object(compose_train([*fast_overrides(tmp_path, corpus_dir), *extra]), TrainConfig)

    return make
