"""docs/decoding.md with its measured part rendered from the bench's JSON: `python scripts/decoding_doc.py
[results=docs/decoding.json] [doc=docs/decoding.md]` prints the whole page.

The text around the markers is written by hand; between `<!-- bench:begin -->` and `<!-- bench:end -->`
stand the tables of `minigpt/lab/bench/report_decoding.py`, made from the JSON that
`python scripts/bench.py 'only=[decoding]' json_out=docs/decoding.json` writes. `make docs`
(scripts/update_docs.py) rewrites the page; tests/project/test_docs.py fails while it is stale. Bad input ends
with one line on stderr and exit code 2.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from minigpt.cli import reports_user_errors, run_cli, to_object
from minigpt.config import register_configs
from minigpt.lab.config import DecodingDocConfig

register_configs()


@hydra.main(version_base="1.3", config_path="../configs", config_name="decoding_doc")
@reports_user_errors
def main(cfg: DictConfig) -> None:
    from minigpt.lab.generated_docs import decoding_page

    c = to_object(cfg, DecodingDocConfig)
    print(decoding_page(Path(c.results), Path(c.doc)), end="")


if __name__ == "__main__":
    run_cli(main)
