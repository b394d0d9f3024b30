"""`scripts/export.py`: one route from a checkpoint to any format. The checkpoint is read once, here, and each
writer is handed the model (float32, CPU, eval mode), its tokenizer and what the format records of it:

    format=hf     hf_export.export_hf      a Hugging Face folder
    format=gguf   gguf_export.export_gguf  one GGUF file, named after the run
"""

from __future__ import annotations

from pathlib import Path

from minigpt.checkpoint.load import find_latest_checkpoint, read_checkpoint, resolve_checkpoint
from minigpt.interop.config import ExportConfig
from minigpt.interop.gguf_export import export_gguf
from minigpt.interop.hf_export import export_hf


def export(cfg: ExportConfig) -> Path:
    """Write the export `cfg` asks for; returns the path written. Nothing is written when it is refused."""
    out = Path(cfg.out_path()).expanduser()
    ckpt = resolve_checkpoint(cfg.checkpoint) if cfg.checkpoint else find_latest_checkpoint(Path("outputs"))
    model, tokenizer, _ = read_checkpoint(ckpt)
    model.eval()
    if cfg.format == "hf":
        return export_hf(model, tokenizer, out)
    run = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt  # a run's checkpoints/last
    return export_gguf(model, tokenizer, out, cfg.tensor_type, name=f"minigpt-{run.name}")
