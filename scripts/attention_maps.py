"""Draw a model's attention maps for a prompt: `python scripts/attention_maps.py [key=value ...]`.

Examples:
    python scripts/attention_maps.py prompt='for i in range(10):'   # the newest run under outputs/train
    python scripts/attention_maps.py checkpoint=outputs/train/<date>/<time> layers=[0,3] out=attn.png

One heatmap per layer and head (rows: layers, columns: heads), the prompt's tokens on both axes
(minigpt/inspect/attention_maps.py). Writes a PNG; bad input ends with one line on stderr and exit code 2.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from minigpt.cli import reports_user_errors, run_cli, to_object
from minigpt.config import register_configs
from minigpt.inspect.config import AttentionMapsConfig

register_configs()


@hydra.main(version_base="1.3", config_path="../configs", config_name="attention_maps")
@reports_user_errors
def main(cfg: DictConfig) -> None:
    from minigpt.checkpoint.load import load_model
    from minigpt.device.threads import set_threads
    from minigpt.inspect.attention_maps import attention_figure, select
    from minigpt.inspect.plotting import save_png

    config = to_object(cfg, AttentionMapsConfig)
    set_threads(config.device.threads)  # one per free core
    model, tokenizer, _ = load_model(config.checkpoint, config.device.type, config.weights_dtype)
    ids = [tokenizer.eot_id, *tokenizer.encode(config.prompt)][-config.max_tokens :]
    layers = select(config.layers, model.config.n_layer, "layers")
    heads = select(config.heads, model.config.n_head, "heads")
    fig = attention_figure(model, ids, tokenizer, layers=layers, heads=heads)
    out = Path(config.out) if config.out else Path(HydraConfig.get().runtime.output_dir) / "attention.png"
    print(f"attention maps: {save_png(fig, out)}")


if __name__ == "__main__":
    run_cli(main)
