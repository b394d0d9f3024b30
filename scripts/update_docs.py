"""Regenerate the text outputs checked in under docs/: `python scripts/update_docs.py` (or `make docs`).

Each entry is a tool's own output for a fixed command; `tests/project/test_docs.py` runs the same commands
and fails when a checked-in file no longer matches, so docs/ never shows what the tools stopped printing.
"""

from __future__ import annotations

import contextlib
import io
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
    "docs/shape_walk_notes.txt": ("shape_walk", ["model=seed", "model.n_embd=512", "model.n_head=16",
                                                 "model.n_layer=1", "batch_size=4", "seq_len=8"]),
}


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


def main() -> None:
    for doc, (script, args) in DOCS.items():
        (ROOT / doc).write_text(render(script, args))
        print(f"wrote {doc}")


if __name__ == "__main__":
    main()
