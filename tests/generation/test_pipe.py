"""`scripts/generate.py` at the edges people hit first: a reader that closes the pipe, prompts with `\\n`,
and a prompt Hydra's grammar refuses."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import run_script
from test_generate_script import ckpt as ckpt  # noqa: F401 -- the fixture: a random tiny checkpoint
from test_generate_script import config, generate_in_process

from minigpt.generation.output import ClosableOutput
from minigpt.generation.run import load_for_generation, run_samples
from minigpt.generation.text import read_prompt

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_reader_that_closes_the_pipe_ends_the_command_quietly_with_every_sample_saved(ckpt: Path,
                                                                                         tmp_path: Path):
    """`generate.py ... | head -0`: the pipe's read end is closed before the first sample is written, so
    every write to stdout fails (a reader that leaves after two lines meets the same, only later)."""
    args = [f"checkpoint={ckpt}", "prompt=ab", "max_new_tokens=40", "num_samples=3", "seed=7", "device=cpu"]
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    try:
        proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "generate.py"), *args,
                               f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, env=env, stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write_end)
    assert proc.returncode == 0, proc.stderr
    for noise in ("error", "Broken pipe", "BrokenPipeError", "Exception ignored", "Traceback"):
        assert noise not in proc.stderr, proc.stderr
    assert "tokens/s" in proc.stderr  # the summary line still reached stderr
    cfg = config(*args)  # the same samples, generated here
    texts, _ = run_samples(cfg, load_for_generation(cfg), io.StringIO(), io.StringIO())
    want = "".join(f"--- sample {i}\n{t}\n" for i, t in enumerate(texts))
    assert (tmp_path / "run" / "samples.txt").read_text() == want and len(texts) == 3


def test_closable_output_on_a_real_pipe_drops_the_rest_and_closes_cleanly():
    read_end, write_end = os.pipe()
    stream = os.fdopen(write_end, "w")
    out = ClosableOutput(stream)
    out.write("first\n")
    assert os.read(read_end, 100) == b"first\n" and not out.reader_gone
    os.close(read_end)
    out.write("second\n")  # EPIPE: the reader is gone
    assert out.reader_gone
    out.write("third\n")  # dropped, no error
    stream.close()  # the buffered bytes go to /dev/null: no BrokenPipeError at close (or at exit)


def test_prompt_escapes_become_characters(ckpt: Path):
    # As typed: prompt='ab\n\nc(' -- Hydra keeps the backslashes, the generator turns them into line breaks.
    assert config(r"prompt='ab\n\nc('").prompt == r"ab\n\nc("
    out, _ = generate_in_process(f"checkpoint={ckpt}", r"prompt='ab\n\nc('", "max_new_tokens=5", "device=cpu")
    assert out.startswith("ab\n\nc(")
    assert read_prompt(r"tab\there", None) == "tab\there"
    assert read_prompt(r"keep \\n literal, and \d too", None) == r"keep \n literal, and \d too"


def test_prompt_files_are_taken_literally(tmp_path: Path):
    f = tmp_path / "p.txt"
    f.write_text(r"print('\n')" + "\n")
    assert read_prompt("", str(f)) == "print('\\n')\n"


@pytest.mark.slow
@pytest.mark.parametrize("value", ["def main(", "it's (x)", 'say "hi"(, $HOME'])
def test_an_unparsable_prompt_says_how_to_quote_it_and_the_quoted_form_works(value: str, capsys):
    bad = run_script("generate", [f"prompt={value}", "--cfg", "job"], capsys)
    assert bad.code == 2 and len(bad.err_lines) == 1, bad.err
    line = bad.err_lines[0]
    assert line.startswith("error: cannot parse the override") and "Traceback" not in bad.err
    suggested = line.split("e.g. ", 1)[1]
    # What a real shell passes on when the suggestion is pasted into it:
    override = subprocess.run(["sh", "-c", f"printf %s {suggested}"], capture_output=True, text=True).stdout
    good = run_script("generate", [override, "--cfg", "job"], capsys)
    assert good.code == 0, good.err
    import yaml

    assert yaml.safe_load(good.out)["prompt"] == value
