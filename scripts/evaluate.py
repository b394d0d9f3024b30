"""Exact loss and perplexity of a checkpoint: `python scripts/evaluate.py [data=<option>] [key=value ...]`.

Examples:
    python scripts/evaluate.py                                    # newest run, its own corpus, val split
    python scripts/evaluate.py checkpoint=outputs/train/<date>/<time> split=train max_tokens=100000
    python scripts/evaluate.py text_file=notes.md stride=32
    python scripts/evaluate.py data=text 'data.paths=[docs/*.md]'

Every token is scored once with a sliding window of the model's context (minigpt/inspect/perplexity.py).
Prints one line and writes results.json into the run folder; bad input: one line on stderr, exit code 2.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from minigpt.config import to_object
from minigpt.errors import USER_ERROR_EXIT_CODE, UserError
from minigpt.inspect.perplexity import EvaluateConfig

ConfigStore.instance().store(name="evaluate_schema", node=EvaluateConfig)


@hydra.main(version_base="1.3", config_path="../configs", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    from minigpt.inspect.perplexity import evaluate

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        result, source = evaluate(to_object(cfg, EvaluateConfig))
    except UserError as e:
        _fail(str(e))
    print(f"{source}: {result.summary()}")
    record = {"source": source, "loss": result.loss, "perplexity": result.perplexity, "tokens": result.tokens,
              "window": result.window, "stride": result.stride}
    (out_dir / "results.json").write_text(json.dumps(record, indent=2) + "\n")


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(USER_ERROR_EXIT_CODE)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0].strip()


if __name__ == "__main__":
    # Config errors become one line unless HYDRA_FULL_ERROR=1 asks for Hydra's full report (as in train.py).
    full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        main()
    except (HydraException, OmegaConfBaseException) as e:
        if full_error:
            raise
        cause = f": {_first_line(e.__cause__)}" if e.__cause__ is not None else ""
        _fail(f"{_first_line(e).rstrip('.')}{cause} (`--cfg job` shows every key)")
