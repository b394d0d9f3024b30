"""docs/decoding.md from the bench's JSON: `python scripts/decoding_doc.py [docs/decoding.json]` prints it.

The JSON is what `python scripts/bench.py --only decoding --json-out docs/decoding.json` writes (the command
named in the document); `make docs` (scripts/update_docs.py) renders the checked-in document from it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from minigpt.lab.bench.report_decoding import render_decoding_doc

COMMAND = "python scripts/bench.py --only decoding --threads 2 --json-out docs/decoding.json"


def main(argv: list[str]) -> None:
    path = Path(argv[0]) if argv else Path(__file__).resolve().parents[1] / "docs" / "decoding.json"
    print(render_decoding_doc(json.loads(path.read_text()), COMMAND), end="")


if __name__ == "__main__":
    main(sys.argv[1:])
