"""Plot a checkpoint's next-token distribution at several temperatures, and its entropy against T:
`python scripts/temperature.py prompt="'def '" temperatures=[0.1,1,10]` (see configs/temperature.yaml).

Prints the entropy at each temperature and the PNG's path. Bad input: one line on stderr, exit code 2.
"""

from __future__ import annotations

import math
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from minigpt.cli import reports_user_errors, run_cli, to_object
from minigpt.config import register_configs
from minigpt.lab.config import TemperatureConfig

register_configs()


@hydra.main(version_base="1.3", config_path="../configs", config_name="temperature")
@reports_user_errors
def main(cfg: DictConfig) -> None:
    from minigpt.checkpoint.load import load_model
    from minigpt.device.threads import set_threads
    from minigpt.generation.text import encode_prompt
    from minigpt.lab.temperature import (
        entropy_curve,
        next_token_logits,
        temperature_figure,
        token_label,
    )

    config = to_object(cfg, TemperatureConfig)
    set_threads(config.device.threads)  # one per free core
    model, tokenizer, _ = load_model(config.checkpoint, config.device.type, config.weights_dtype)
    logits = next_token_logits(model, encode_prompt(tokenizer, config.prompt))[: tokenizer.vocab_size]
    out = Path(config.out) if config.out else Path(HydraConfig.get().runtime.output_dir) / "temperature.png"
    title = f"next token after {config.prompt[-40:]!r}" if config.prompt else "first token of a document"
    temperature_figure(logits, token_label(tokenizer.decode), out, config.temperatures, config.top, title)
    for t, h in zip(config.temperatures, entropy_curve(logits, config.temperatures).tolist(), strict=True):
        print(f"T = {t:<8g} entropy {h:.3f} nats")
    print(f"limits: 0 at T -> 0, log V = {math.log(len(logits)):.3f} at T -> inf")
    print(f"figure: {out}")


if __name__ == "__main__":
    run_cli(main)
