"""Sample from a trained model: `python scripts/generate.py [key=value ...]` (see configs/generate.yaml).

Thin on purpose: compose the config, convert it once, and call the library (minigpt/generation/cli.py).
Samples go to stdout (streamed), the summary line to stderr; the samples are also saved in the run folder.
Bad input ends with one line on stderr and exit code 2; HYDRA_FULL_ERROR=1 shows Hydra's full report instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from minigpt.config import register_configs, to_object
from minigpt.errors import USER_ERROR_EXIT_CODE, UserError
from minigpt.generation.config import GenerateConfig

register_configs()


def _read_line() -> str | None:
    try:
        return input("> ")
    except EOFError:  # Ctrl-D
        return None


@hydra.main(version_base="1.3", config_path="../configs", config_name="generate")
def main(cfg: DictConfig) -> None:
    from minigpt.generation.cli import load_model, run_interactive, run_samples

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        config = to_object(cfg, GenerateConfig)
        model, tokenizer, _ = load_model(config.checkpoint, config.device)
        if config.interactive:
            run_interactive(config, model, tokenizer, _read_line, sys.stdout, sys.stderr)
            return
        texts, _ = run_samples(config, model, tokenizer, sys.stdout, sys.stderr)
    except UserError as e:
        _fail(str(e))
    except KeyboardInterrupt:
        sys.exit(130)
    (out_dir / "samples.txt").write_text("".join(f"--- sample {i}\n{t}\n" for i, t in enumerate(texts)))


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(USER_ERROR_EXIT_CODE)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0].strip()


if __name__ == "__main__":
    # As in train.py: turn Hydra's multi-line config reports into one line unless HYDRA_FULL_ERROR=1.
    full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        main()
    except (HydraException, OmegaConfBaseException) as e:
        if full_error:
            raise
        cause = f": {_first_line(e.__cause__)}" if e.__cause__ is not None else ""
        _fail(f"{_first_line(e).rstrip('.')}{cause} (`--cfg job` shows every key)")
