"""Regenerate what the tools write under docs/: `python scripts/update_docs.py [check=true]` (or `make docs`).

Each generated file (minigpt/lab/generated_docs.py lists them) is made afresh by running its tool as a user
would, and written where it changed; `check=true` writes nothing and fails in one line naming the stale ones.
`tests/project/test_docs.py` checks the same, so docs/ never shows what the tools stopped printing.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from minigpt.cli import reports_user_errors, run_cli, to_object
from minigpt.config import register_configs
from minigpt.lab.config import UpdateDocsConfig

register_configs()
ROOT = Path(__file__).resolve().parents[1]


@hydra.main(version_base="1.3", config_path="../configs", config_name="update_docs")
@reports_user_errors
def main(cfg: DictConfig) -> None:
    from minigpt.lab.generated_docs import update_docs

    c = to_object(cfg, UpdateDocsConfig)
    stale = update_docs(ROOT, check=c.check)
    if not c.check:
        print("\n".join(f"wrote {doc}" for doc in stale) or "docs/ is current: nothing to write")
    else:
        print("docs/ is current")


if __name__ == "__main__":
    run_cli(main)
