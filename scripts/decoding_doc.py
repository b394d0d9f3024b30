"""docs/decoding.md with its measured part rendered from the bench's JSON:
`python scripts/decoding_doc.py [docs/decoding.json [docs/decoding.md]]` prints the whole document.

The text around the markers is written by hand; between `<!-- bench:begin -->` and `<!-- bench:end -->`
stand the tables of `minigpt/lab/bench/report_decoding.py`, made from the JSON that
`python scripts/bench.py 'only=[decoding]' json_out=docs/decoding.json` writes. `make docs`
(scripts/update_docs.py) rewrites the document; tests/project/test_docs.py fails while it is stale.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from minigpt.lab.bench.report_decoding import render_decoding_doc

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "python scripts/bench.py 'only=[decoding]' json_out=docs/decoding.json"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def main(argv: list[str]) -> None:
    results = Path(argv[0]) if argv else ROOT / "docs" / "decoding.json"
    doc = Path(argv[1]) if len(argv) > 1 else ROOT / "docs" / "decoding.md"
    text = doc.read_text()
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    block = render_decoding_doc(json.loads(results.read_text()), COMMAND)
    print(f"{head}{BEGIN}\n{block}{END}{tail}", end="")


if __name__ == "__main__":
    main(sys.argv[1:])
