"""What docs/ shows is what the tools print today (scripts/update_docs.py)."""

from __future__ import annotations

import json
import runpy

import pytest
from conftest import ROOT

DOCS = runpy.run_path(str(ROOT / "scripts" / "update_docs.py"))


@pytest.mark.parametrize("doc", list(DOCS["DOCS"]))
def test_checked_in_doc_matches_the_tool(doc: str):
    script, args = DOCS["DOCS"][doc]
    fresh = DOCS["render"](script, args)
    assert fresh.strip(), f"{script} printed nothing"
    assert (ROOT / doc).read_text() == fresh, f"{doc} is stale: run `make docs` (scripts/update_docs.py)"


@pytest.mark.parametrize(("name", "sections"), [("bench", {"peak", "train_S", "train_M"}),
                                                ("busy", {"busy"})])
def test_the_performance_page_shows_the_committed_bench_runs(name: str, sections: set[str]):
    results = json.loads((ROOT / DOCS["BENCH_RUNS"][name]).read_text())
    assert sections <= set(results["sections"]), "a partial bench run"
    assert not [name for name, r in results["sections"].items() if "error" in r], "a failed bench section"
    page = (ROOT / DOCS["PERFORMANCE"]).read_text()
    assert DOCS["with_bench_block"](page, results, name) == page, "docs/performance.md is stale: `make docs`"
