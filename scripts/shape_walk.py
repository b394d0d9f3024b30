"""Print every tensor shape of a forward pass: `python scripts/shape_walk.py [model=<option>] [key=value]`.

Examples:
    python scripts/shape_walk.py                          # the default tiny model
    python scripts/shape_walk.py model=modern seq_len=16  # RoPE, RMSNorm, SwiGLU, grouped-query attention
    python scripts/shape_walk.py checkpoint=outputs/train/<date>/<time>

The walk is observed with forward hooks on the real model (minigpt/inspect/shape_walk.py). Nothing is
written to disk. Bad input ends with one line on stderr and exit code 2.
"""

from __future__ import annotations

import os
import sys

import hydra
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from minigpt.config import to_object
from minigpt.errors import USER_ERROR_EXIT_CODE, UserError
from minigpt.inspect.shape_walk import ShapeWalkConfig

ConfigStore.instance().store(name="shape_walk_schema", node=ShapeWalkConfig)


@hydra.main(version_base="1.3", config_path="../configs", config_name="shape_walk")
def main(cfg: DictConfig) -> None:
    from minigpt.inspect.shape_walk import format_walk, walk_shapes
    from minigpt.model import build_model
    from minigpt.training.checkpoint import load_checkpoint_for_inference

    try:
        config = to_object(cfg, ShapeWalkConfig)
        if config.checkpoint:
            model, _, _ = load_checkpoint_for_inference(config.checkpoint)
        else:
            model = build_model(config.model, vocab_size=config.vocab_size)
        print(format_walk(walk_shapes(model, config.batch_size, config.seq_len)))
    except UserError as e:
        _fail(str(e))


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
