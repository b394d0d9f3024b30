"""What docs/ shows is what the tools print today (minigpt/lab/generated_docs.py, scripts/update_docs.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from cli_helpers import run_script
from conftest import ROOT

from minigpt.lab.generated_docs import DOCS, PERFORMANCE, performance_page


@pytest.mark.parametrize("doc", list(DOCS))
def test_checked_in_doc_matches_the_tool(doc: str, capsys, monkeypatch):
    script, args = DOCS[doc]
    monkeypatch.chdir(ROOT)  # the arguments are paths from the project's root
    run = run_script(script, args, capsys)
    assert run.code == 0 and run.out.strip(), f"{script} printed nothing: {run.err}"
    assert (ROOT / doc).read_text() == run.out, f"{doc} is stale: run `make docs` (scripts/update_docs.py)"


@pytest.mark.parametrize(("marker", "sections"), [("bench", {"peak", "train_S", "train_M"}),
                                                  ("busy", {"busy"})])
def test_the_performance_page_shows_the_committed_bench_runs(marker: str, sections: set[str]):
    from minigpt.lab.generated_docs import PERFORMANCE_RUNS, read_results

    results = read_results(ROOT / PERFORMANCE_RUNS[marker])
    assert sections <= set(results["sections"]), "a partial bench run"
    assert not [name for name, r in results["sections"].items() if "error" in r], "a failed bench section"
    assert performance_page(ROOT) == (ROOT / PERFORMANCE).read_text(), f"{PERFORMANCE} is stale: `make docs`"


def test_decoding_doc_renders_the_block_of_any_page_and_refuses_bad_input_in_one_line(tmp_path, capsys):
    page = tmp_path / "page.md"
    page.write_text("# hand-written\n<!-- bench:begin -->\nold\n<!-- bench:end -->\nafter\n")
    results = ROOT / "docs" / "decoding.json"
    run = run_script("decoding_doc", [f"results={results}", f"doc={page}"], capsys)
    decoding = (ROOT / "docs" / "decoding.md").read_text()
    block = decoding.split("<!-- bench:begin -->")[1].split("<!-- bench:end -->")[0]  # the same JSON's
    assert run.code == 0
    assert run.out == f"# hand-written\n<!-- bench:begin -->{block}<!-- bench:end -->\nafter\n"
    (tmp_path / "broken.json").write_text("{")
    for args, message in ([f"doc={tmp_path / 'none.md'}"], f"cannot read {tmp_path / 'none.md'}"), \
            ([f"results={tmp_path / 'broken.json'}"], f"cannot read the bench results {tmp_path}"), \
            ([f"results={results}", f"doc={ROOT / 'README.md'}"], "README.md has no <!-- bench:begin -->"), \
            (["doc_file=x"], "doc_file"):
        run = run_script("decoding_doc", args, capsys)
        assert run.code == 2 and len(run.err_lines) == 1 and message in run.err, (args, run.err)
        assert run.err.startswith("error: ") and "Traceback" not in run.err


def test_update_docs_refuses_a_bad_override_in_one_line(capsys):
    run = run_script("update_docs", ["check=maybe"], capsys)
    assert run.code == 2 and len(run.err_lines) == 1 and "check" in run.err and "Traceback" not in run.err


@pytest.mark.slow  # runs every tool as its own process, as `make docs` does
def test_update_docs_checks_every_generated_file_with_the_real_tools():
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "update_docs.py"), "check=true"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout == "docs/ is current\n", run.stderr[-3000:]
