"""Print every tensor shape of a forward pass: `python scripts/shape_walk.py [model=<option>] [key=value]`.

Examples:
    python scripts/shape_walk.py                          # the Llama-style block (model=demo)
    python scripts/shape_walk.py model=modern seq_len=16  # RoPE, RMSNorm, SwiGLU, grouped-query attention
    python scripts/shape_walk.py checkpoint=outputs/train/<date>/<time>

The walk is observed with forward hooks on the real model (minigpt/lab/shape_walk.py). Nothing is
written to disk. Bad input ends with one line on stderr and exit code 2.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from minigpt.cli import reports_user_errors, run_cli, to_object
from minigpt.config import register_configs
from minigpt.lab.config import ShapeWalkConfig

register_configs()


@hydra.main(version_base="1.3", config_path="../configs", config_name="shape_walk")
@reports_user_errors
def main(cfg: DictConfig) -> None:
    from minigpt.checkpoint.load import read_checkpoint
    from minigpt.lab.shape_walk import format_walk, walk_shapes
    from minigpt.model.factory import build_model

    config = to_object(cfg, ShapeWalkConfig)
    if config.checkpoint:
        model, _, _ = read_checkpoint(config.checkpoint)
    else:
        model = build_model(config.model, vocab_size=config.vocab_size)
    print(format_walk(walk_shapes(model, config.batch_size, config.seq_len)))


if __name__ == "__main__":
    run_cli(main)
