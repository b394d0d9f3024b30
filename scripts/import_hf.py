"""Bring a Hugging Face model in: `python scripts/import_hf.py source=<HF folder> out=<new checkpoint>`.

Examples:
    python scripts/import_hf.py source=outputs/export/demo-hf out=outputs/imported/demo     # a round trip
    python scripts/import_hf.py source=path/to/gpt2 out=outputs/imported/gpt2 tokenizer_dir=<folder>

source holds config.json (model_type gpt2 or llama) and model.safetensors (or pytorch_model.bin, read with
weights_only=True). The checkpoint's tokenizer is the folder's tokenizer.json (a byte-level or character BPE),
or `tokenizer_dir=` a minigpt tokenizer folder, or for a GPT-2 folder without one tiktoken's gpt2 encoding.
`scripts/generate.py checkpoint=<out>` samples from it and `trainer.init_from=<out>` fine-tunes it.
Nothing existing is overwritten; bad input: one line on stderr, exit code 2.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from minigpt.cli import reports_user_errors, run_cli, to_object
from minigpt.config import register_configs
from minigpt.interop.config import ImportHFConfig

register_configs()


@hydra.main(version_base="1.3", config_path="../configs", config_name="import_hf")
@reports_user_errors
def main(cfg: DictConfig) -> None:
    from minigpt.interop.hf_import import import_hf

    config = to_object(cfg, ImportHFConfig)
    source, out = config.paths()
    print(f"imported to {import_hf(source, out, config.tokenizer_dir)}")


if __name__ == "__main__":
    run_cli(main)
