"""What the tools write under docs/, and how `scripts/update_docs.py` (`make docs`) makes it again.

    DOCS           whole files: what a tool prints for a fixed command (`python scripts/<tool>.py <args>`)
    PERFORMANCE    docs/performance.md's blocks between their markers: the bench's own report of each
                   committed run, docs/bench.json (`python scripts/bench.py json_out=docs/bench.json`) and
                   docs/busy.json (its busy section); the rest of the page is written by hand

docs/decoding.md is of the first kind: `scripts/decoding_doc.py` prints the page with its own block between
the bench markers rendered from docs/decoding.json (`decoding_page`). tests/project/test_docs.py fails when a
checked-in file no longer matches, so docs/ never shows what the tools stopped printing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from minigpt.errors import UserError

# docs file -> (tool, arguments), run from the project's root
DOCS = {
    # the Llama-style block (model=demo), 20 tokens (not 16: D/2 = 16 would read as T)
    "docs/shape_walk.txt": ("shape_walk", ["seq_len=20"]),
    # a textbook-sized example: batch 4, 8 tokens, 512 wide, 16 heads of 32, the original
    # Transformer's block (model=seed: sinusoidal positions, post-norm, ReLU), one layer
    "docs/shape_walk_transformer.txt": ("shape_walk", ["model=seed", "model.n_embd=512", "model.n_head=16",
                                                       "model.n_layer=1", "batch_size=4", "seq_len=8"]),
    # decoding: the hand-written text, and the tables rendered from the bench's checked-in JSON
    "docs/decoding.md": ("decoding_doc", ["results=docs/decoding.json", "doc=docs/decoding.md"]),
}
BENCH_JSON, PERFORMANCE = "docs/bench.json", "docs/performance.md"
# docs/performance.md's generated blocks: marker name -> the committed bench run it shows
PERFORMANCE_RUNS = {"bench": BENCH_JSON, "busy": "docs/busy.json"}
DECODING_COMMAND = "python scripts/bench.py 'only=[decoding]' json_out=docs/decoding.json"


def with_block(page: str, block: str, name: str, marker: str = "bench") -> str:
    """`page` with the text between its `marker` markers replaced by `block`; UserError naming the page
    `name` where the markers are not there."""
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    start, stop = page.find(begin), page.find(end)
    if start < 0 or stop < start:
        raise UserError(f"{name} has no {begin} ... {end} block to write the bench's numbers into")
    return page[:start + len(begin)] + block + page[stop:]


def read_results(file: Path) -> dict:
    """A bench JSON; UserError naming the file when it is missing or damaged."""
    try:
        results = json.loads(Path(file).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        why = getattr(e, "strerror", None) or e
        raise UserError(f"cannot read the bench results {file}: {why}") from None
    if not isinstance(results, dict) or "sections" not in results:
        raise UserError(f"{file} is not a bench JSON (python scripts/bench.py json_out=...)")
    return results


def decoding_page(results: Path, doc: Path) -> str:
    """`doc` (docs/decoding.md) with the tables of the bench's decoding sections in `results` between its
    markers."""
    from minigpt.lab.bench.report_decoding import render_decoding_doc

    try:
        page = Path(doc).read_text(encoding="utf-8")
    except OSError as e:
        raise UserError(f"cannot read {doc}: {e.strerror or e}") from None
    return with_block(page, "\n" + render_decoding_doc(read_results(results), DECODING_COMMAND), str(doc))


def performance_page(root: Path) -> str:
    """docs/performance.md with the bench's report of each of PERFORMANCE_RUNS between its markers."""
    from minigpt.lab.bench.report import format_report

    page = (root / PERFORMANCE).read_text(encoding="utf-8")
    for marker, run in PERFORMANCE_RUNS.items():
        note = f"<!-- written by scripts/update_docs.py from {run}; do not edit by hand -->"
        block = "\n".join(["", note, "", "```", format_report(read_results(root / run)), "```", ""])
        page = with_block(page, block, PERFORMANCE, marker)
    return page


def tool_output(root: Path, tool: str, args: list[str]) -> str:
    """What `python scripts/<tool>.py <args>` prints, run from `root` as a user would run it."""
    cmd = [sys.executable, str(root / "scripts" / f"{tool}.py"), *args]
    run = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or [f"exit code {run.returncode}"])[-1]
        raise UserError(f"scripts/{tool}.py {' '.join(args)} failed: {last}")
    return run.stdout


def update_docs(root: Path, check: bool = False) -> list[str]:
    """Every generated file made afresh; written where it changed (nothing is written when `check`). Returns
    the files that were stale; with `check`, a UserError naming them if any was."""
    fresh = {doc: tool_output(root, tool, args) for doc, (tool, args) in DOCS.items()}
    fresh[PERFORMANCE] = performance_page(root)
    stale = [doc for doc, text in fresh.items() if (root / doc).read_text(encoding="utf-8") != text]
    if check and stale:
        raise UserError(f"stale under docs/: {', '.join(stale)} (run `make docs`)")
    if not check:
        for doc in stale:
            (root / doc).write_text(fresh[doc], encoding="utf-8")
    return stale
