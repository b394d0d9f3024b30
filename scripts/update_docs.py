"""Regenerate what the tools write under docs/: `python scripts/update_docs.py` (or `make docs`).

Two kinds of output, both checked by `tests/project/test_docs.py`, which fails when a checked-in file no
longer matches, so docs/ never shows what the tools stopped printing:
    DOCS           whole files: a tool's own output for a fixed command
    BENCH_RUNS     docs/performance.md's blocks between their markers: the bench's own report of each
                   committed run, docs/bench.json (`python scripts/bench.py json_out=docs/bench.json`) and
                   docs/busy.json (its busy section); the rest of the page is written by hand
"""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# docs file -> (script, arguments)
DOCS = {
    # the default model (the demo block), 20 tokens (not 16: D/2 = 16 would read as T)
    "docs/shape_walk.txt": ("shape_walk", ["seq_len=20"]),
    # a textbook-sized example: batch 4, 8 tokens, 512 wide, 16 heads of 32, the original
    # Transformer's block (model=seed: sinusoidal positions, post-norm, ReLU), one layer
    "docs/shape_walk_transformer.txt": ("shape_walk", ["model=seed", "model.n_embd=512", "model.n_head=16",
                                                       "model.n_layer=1", "batch_size=4", "seq_len=8"]),
    # decoding: the hand-written text, and the tables rendered from the bench's checked-in JSON
    "docs/decoding.md": ("decoding_doc", ["docs/decoding.json", "docs/decoding.md"]),
}

PERFORMANCE = "docs/performance.md"
# the page's generated blocks: marker name -> the committed bench run it shows
BENCH_RUNS = {"bench": "docs/bench.json", "busy": "docs/busy.json"}


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def render(script: str, args: list[str]) -> str:
    """What `python scripts/<script>.py <args>` prints, run in this process."""
    saved = sys.argv
    sys.argv = [str(ROOT / "scripts" / f"{script}.py"), *args]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            runpy.run_path(sys.argv[0], run_name="__main__")
    finally:
        sys.argv = saved
    return out.getvalue()


def render_bench(results: dict, name: str) -> str:
    """The performance page's block `name`, markers included: the bench's text report of `results`."""
    from minigpt.lab.bench.report import format_report

    begin, end = markers(name)
    return "\n".join([begin, f"<!-- written by scripts/update_docs.py from {BENCH_RUNS[name]}; do not edit "
                      "by hand -->", "", "```", format_report(results), "```", end])


def with_bench_block(page: str, results: dict, name: str) -> str:
    """`page` with the block between `name`'s markers replaced by `render_bench(results, name)`."""
    begin, end = markers(name)
    start, stop = page.find(begin), page.find(end)
    if start < 0 or stop < start:
        raise SystemExit(f"error: {PERFORMANCE} has no {begin} ... {end} block")
    return page[:start] + render_bench(results, name) + page[stop + len(end):]


def main() -> None:
    for doc, (script, args) in DOCS.items():
        (ROOT / doc).write_text(render(script, args))
        print(f"wrote {doc}")
    page = ROOT / PERFORMANCE
    text = page.read_text()
    for name, run in BENCH_RUNS.items():
        text = with_bench_block(text, json.loads((ROOT / run).read_text()), name)
    page.write_text(text)
    print(f"wrote {PERFORMANCE} (from {', '.join(BENCH_RUNS.values())})")


if __name__ == "__main__":
    main()
