"""What people read while a run trains: a redrawing bar on a terminal, plain lines in files and pipes."""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path

import pytest
from cli_helpers import run_script
from conftest import fast_overrides

from minigpt.training.budget import Budget
from minigpt.training.reporting import ProgressDisplay


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.slow
def test_without_a_tty_the_real_script_prints_plain_lines_and_no_carriage_returns(tmp_path: Path,
                                                                                  corpus_dir: Path, capsys):
    run = tmp_path / "run"
    # no text samples: an untrained byte-level model may well sample a carriage return itself
    args = [*fast_overrides(tmp_path, corpus_dir), "logging.progress_bar=true", "trainer.max_steps=6",
            "logging.log_every=2", "logging.sample_tokens=0", f"hydra.run.dir={run}"]
    result = run_script("train", args, capsys)
    assert result.code == 0, result.err
    log_file = (run / "train.log").read_text()
    for text in (result.out, result.err, log_file):
        assert "\r" not in text
    pattern = (r"step (\d+)/6 \| loss [\d.]+ \| lr [\d.e+-]+ \| [\d,]+ tok/s \| "
               r"[\d,]+ tokens, [\d.e+]+ FLOPs \| \d+:\d\d trained, ~\d+:\d\d left")
    assert [int(s) for s in re.findall(pattern, result.out)] == [2, 4, 6]  # every log_every steps
    assert [int(s) for s in re.findall(pattern, log_file)] == [2, 4, 6]  # and in the run's log file


def test_on_a_terminal_the_bar_redraws_in_place_and_logs_no_lines(caplog):
    terminal = Terminal()
    with caplog.at_level(logging.INFO), ProgressDisplay(True, Budget(4, None), 0, stream=terminal) as display:
        for step in range(1, 5):
            display.step_done()
            display.report(step, 2.5, 1e-3, 1000.0, float(step), 1.0, 100 * step)
    assert "\r" in terminal.getvalue() and "4/4" in terminal.getvalue()
    assert not [r for r in caplog.records if r.name == "minigpt.training.reporting"]


def test_elsewhere_the_display_writes_nothing_on_the_stream_but_logs_each_report(caplog):
    pipe = io.StringIO()
    budget = Budget(None, 60.0, flops_per_token=2e6)
    with caplog.at_level(logging.INFO), ProgressDisplay(True, budget, 0, stream=pipe) as display:
        display.step_done()
        display.report(1, 2.5, 1e-3, 1234.0, 15.0, 15.0, 18_500)
    assert pipe.getvalue() == ""
    assert [r.getMessage() for r in caplog.records if r.name == "minigpt.training.reporting"] == [
        "step 1 | loss 2.5000 | lr 1.00e-03 | 1,234 tok/s | 18,500 tokens, 3.70e+10 FLOPs | 0:15 trained, "
        "~0:45 left"]


def test_a_token_or_flops_budget_shows_the_step_it_ends_at(caplog):
    """1,000 tokens per step: 2,500 tokens end the run after step 3 (the first step at or past them), and
    9e9 FLOPs at 2e6 per token (4,500 tokens) after step 5; the bar and the lines count towards that step."""
    for budget, last in [(Budget(max_tokens=2500, tokens_per_step=1000), 3),
                         (Budget(max_flops=9e9, tokens_per_step=1000, flops_per_token=2e6), 5)]:
        terminal = Terminal()
        with ProgressDisplay(True, budget, 0, stream=terminal) as display:
            display.step_done()
        assert f"1/{last}" in terminal.getvalue()
        caplog.clear()
        with caplog.at_level(logging.INFO), ProgressDisplay(True, budget, 1, 1000, stream=io.StringIO()) as d:
            d.report(2, 2.5, 1e-3, 1000.0, 2.0, 1.0, 2000)
        assert caplog.records[-1].getMessage().startswith(f"step 2/{last} |")


def test_progress_bar_false_shows_neither(caplog):
    terminal = Terminal()
    display = ProgressDisplay(False, Budget(4, None), 0, stream=terminal)
    with caplog.at_level(logging.INFO), display:
        display.step_done()
        display.report(1, 2.5, 1e-3, 1000.0, 1.0, 1.0, 1000)
    assert terminal.getvalue() == "" and not caplog.records
