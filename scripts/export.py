"""Take a trained model elsewhere: `python scripts/export.py checkpoint=<run> format=hf|gguf out=<path>`.

Examples:
    python scripts/export.py checkpoint=outputs/train/<date>/<time> format=hf out=outputs/export/demo-hf
    python scripts/export.py format=gguf gguf_type=q8_0 out=outputs/export/demo.gguf   # the newest run
    python scripts/export.py checkpoint=<a model=recipe run> format=hf out=outputs/export/recipe-hf

format=hf writes a folder transformers loads: as GPT2LMHeadModel, LlamaForCausalLM, Qwen3ForCausalLM or
ArceeForCausalLM with no custom code where one computes the model, else with minigpt's own modeling code
(trust_remote_code=True); with its fast tokenizer and safetensors weights. format=gguf writes one file for
llama.cpp, llama-cpp-python and Ollama (docs/export.md). The one line printed says which it wrote and why. A
model with a feature the format has no equivalent for is refused in one line naming it. Nothing existing is
overwritten, and a failed export leaves nothing behind; bad input: one line on stderr, exit code 2.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from minigpt.cli import reports_user_errors, run_cli, to_object
from minigpt.config import register_configs
from minigpt.interop.config import ExportConfig

register_configs()


@hydra.main(version_base="1.3", config_path="../configs", config_name="export")
@reports_user_errors
def main(cfg: DictConfig) -> None:
    from minigpt.interop.export import export

    config = to_object(cfg, ExportConfig)
    print(export(config))


if __name__ == "__main__":
    run_cli(main)
