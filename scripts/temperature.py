"""Plot a checkpoint's next-token distribution at several temperatures, and its entropy against T:
`python scripts/temperature.py prompt="'def '" temperatures=[0.1,1,10]` (see configs/temperature.yaml).

Prints the entropy at each temperature and the PNG's path. Bad input: one line on stderr, exit code 2.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from minigpt.config import register_configs, to_object
from minigpt.errors import USER_ERROR_EXIT_CODE, UserError
from minigpt.generation.temperature import TemperatureConfig

register_configs()  # the `device` group's schema comes with the others
ConfigStore.instance().store(name="temperature_schema", node=TemperatureConfig)


@hydra.main(version_base="1.3", config_path="../configs", config_name="temperature")
def main(cfg: DictConfig) -> None:
    from minigpt.generation.cli import load_model
    from minigpt.generation.temperature import (
        entropy_curve,
        next_token_logits,
        temperature_figure,
        token_label,
    )
    from minigpt.generation.text import encode_prompt

    try:
        config = to_object(cfg, TemperatureConfig)
        model, tokenizer, _ = load_model(config.checkpoint, config.device)
        logits = next_token_logits(model, encode_prompt(tokenizer, config.prompt))[: tokenizer.vocab_size]
    except UserError as e:
        _fail(str(e))
    out = Path(config.out) if config.out else Path(HydraConfig.get().runtime.output_dir) / "temperature.png"
    title = f"next token after {config.prompt[-40:]!r}" if config.prompt else "first token of a document"
    temperature_figure(logits, token_label(tokenizer.decode), out, config.temperatures, config.top, title)
    for t, h in zip(config.temperatures, entropy_curve(logits, config.temperatures).tolist(), strict=True):
        print(f"T = {t:<8g} entropy {h:.3f} nats")
    print(f"limits: 0 at T -> 0, log V = {math.log(len(logits)):.3f} at T -> inf")
    print(f"figure: {out}")


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(USER_ERROR_EXIT_CODE)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0].strip()


if __name__ == "__main__":
    full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        main()
    except (HydraException, OmegaConfBaseException) as e:
        if full_error:
            raise
        cause = f": {_first_line(e.__cause__)}" if e.__cause__ is not None else ""
        _fail(f"{_first_line(e).rstrip('.')}{cause} (`--cfg job` shows every key)")
