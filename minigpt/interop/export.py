"""`scripts/export.py`: one route from a checkpoint to any format. The checkpoint is read once, here, and each
writer is handed the model (float32, CPU, eval mode), its tokenizer and what the format records of it:

    format=hf     hf_export.export_hf      a Hugging Face folder, as the class hf_family chooses
    format=gguf   gguf_export.export_gguf  one GGUF file for the llama.cpp graph gguf_family chooses

The script prints the one line `export` returns: where it wrote what, and why that form.
"""

from __future__ import annotations

from pathlib import Path

from minigpt.checkpoint.load import find_latest_checkpoint, read_checkpoint, resolve_checkpoint
from minigpt.interop.config import ExportConfig
from minigpt.interop.gguf_export import export_gguf, gguf_family
from minigpt.interop.hf_export import export_hf, hf_family


def export(cfg: ExportConfig) -> str:
    """Write the export `cfg` asks for; returns the summary line (the path written, the class or graph, and
    why). Nothing is written when it is refused."""
    out = Path(cfg.out_path()).expanduser()
    ckpt = resolve_checkpoint(cfg.checkpoint) if cfg.checkpoint else find_latest_checkpoint(Path("outputs"))
    model, tokenizer, _ = read_checkpoint(ckpt)
    model.eval()
    if cfg.format == "hf":
        family, why = hf_family(model.config, cfg.hf_family)
        return f"exported to {export_hf(model, tokenizer, out, family)}: {why}"
    run = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt  # a run's checkpoints/last
    path = export_gguf(model, tokenizer, out, cfg.tensor_type, name=f"minigpt-{run.name}")
    return f"exported to {path}: llama.cpp's {gguf_family(model.config)} graph, {cfg.tensor_type} weights"
