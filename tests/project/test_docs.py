"""The text outputs checked in under docs/ are what the tools print today (scripts/update_docs.py)."""

from __future__ import annotations

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
