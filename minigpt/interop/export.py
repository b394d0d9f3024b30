"""`scripts/export.py`: a minigpt checkpoint -> a Hugging Face folder (hf_checkpoint.py) or a GGUF file
(gguf_export.py)."""

from __future__ import annotations

from pathlib import Path

from minigpt.checkpoint.load import find_latest_checkpoint, read_checkpoint, resolve_checkpoint
from minigpt.interop.config import ExportConfig
from minigpt.interop.gguf_export import export_gguf
from minigpt.interop.hf_checkpoint import export_hf


def export(cfg: ExportConfig) -> Path:
    """Write the export `cfg` asks for; returns the path written. Nothing is written when it is refused."""
    out = Path(cfg.out_path()).expanduser()
    ckpt = resolve_checkpoint(cfg.checkpoint) if cfg.checkpoint else find_latest_checkpoint(Path("outputs"))
    if cfg.format == "hf":
        return export_hf(ckpt, out)
    model, tokenizer, _ = read_checkpoint(ckpt)
    run = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt  # a run's checkpoints/last
    return export_gguf(model, tokenizer, out, cfg.tensor_type, name=f"minigpt-{run.name}")
