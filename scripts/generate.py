"""Sample from a trained model: `python scripts/generate.py [key=value ...]` (see configs/generate.yaml).

Thin on purpose: compose the config, convert it once, and call the library (minigpt/generation/run.py).
Samples go to stdout (streamed), the summary line to stderr; the samples are also saved in the run folder.
Bad input ends with one line on stderr and exit code 2; HYDRA_FULL_ERROR=1 shows Hydra's full report instead.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from minigpt.cli import reports_user_errors, run_cli, to_object
from minigpt.config import register_configs
from minigpt.generation.config import GenerateConfig

register_configs()


def _read_line() -> str | None:
    try:
        return input("> ")
    except EOFError:  # Ctrl-D
        return None


@hydra.main(version_base="1.3", config_path="../configs", config_name="generate")
@reports_user_errors
def main(cfg: DictConfig) -> None:
    from minigpt.device.threads import set_threads
    from minigpt.generation.run import load_for_generation, run_interactive, run_samples

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    config = to_object(cfg, GenerateConfig)
    set_threads(config.device.threads)  # one per free core (the summary line says how many)
    loaded = load_for_generation(config)
    if config.interactive:
        run_interactive(config, loaded, _read_line, sys.stdout, sys.stderr)
        return
    texts, _ = run_samples(config, loaded, sys.stdout, sys.stderr)
    (out_dir / "samples.txt").write_text("".join(f"--- sample {i}\n{t}\n" for i, t in enumerate(texts)))


if __name__ == "__main__":
    run_cli(main)
