"""Finding a checkpoint and loading it: the one loader behind generate, evaluate and every inspection tool.

`checkpoint=` accepts a checkpoint folder or a run folder (its `checkpoints/last`); left out, it means the
newest training run under `outputs/train`. What comes back is always a plain `GPT` in eval mode on the asked
device and dtype, the tokenizer that travelled with it, and its meta.json.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from minigpt.checkpoint.format import META, TOKENIZER, WEIGHTS, read_meta, read_weights, verify_tokenizer
from minigpt.data.tokenizers import Tokenizer, load_tokenizer
from minigpt.device.runtime import inference_device
from minigpt.errors import UserError
from minigpt.model.config import ModelConfig
from minigpt.model.factory import build_model
from minigpt.model.gpt import GPT


def resolve_checkpoint(path: str | Path) -> Path:
    """The checkpoint folder meant by `path`: itself, or a run folder's `checkpoints/last`; else UserError."""
    path = Path(path).expanduser()
    if not path.exists():
        raise UserError(f"checkpoint path {str(path)!r} does not exist (give a checkpoint or run folder)")
    # `.last.old` is what a crash between the two renames of a checkpoint swap leaves (format.py)
    candidates = [path, path / "checkpoints" / "last", path / "checkpoints" / ".last.old", path / "last"]
    for c in candidates:
        if (c / META).is_file():
            return c
    raise UserError(
        f"{str(path)!r} is neither a checkpoint folder (with {META}) nor a run folder with checkpoints/last"
    )


def find_latest_checkpoint(outputs_root: Path = Path("outputs")) -> Path:
    """The `last` checkpoint of the most recently written training run under `outputs_root`."""
    root = Path(outputs_root) / "train"
    metas = list(root.glob("**/checkpoints/last/" + META)) if root.is_dir() else []
    if not metas:
        raise UserError(
            f"no training checkpoint under {str(root)!r} "
            "(train one with `make train`, or pass checkpoint=<path>)"
        )
    return max(metas, key=lambda m: m.stat().st_mtime).parent


def model_config_of(meta: dict[str, Any], ckpt: Path) -> ModelConfig:
    """The ModelConfig recorded in a checkpoint's meta.json (validated like a user's)."""
    try:
        return ModelConfig(**meta["model_config"])
    except (KeyError, TypeError) as e:
        raise UserError(f"checkpoint {str(ckpt)!r} has no usable model_config in {META} ({e})") from None


def read_checkpoint(path: str | Path) -> tuple[GPT, Tokenizer, dict[str, Any]]:
    """(model on the CPU in float32 and training mode, tokenizer, meta) from a checkpoint or run folder.

    Everything is read from the folder and checked first; then the model is built with its weights."""
    ckpt = resolve_checkpoint(path)
    meta = read_meta(ckpt)
    config = model_config_of(meta, ckpt)
    weights = read_weights(ckpt)
    if not (ckpt / TOKENIZER).is_dir():
        raise UserError(f"checkpoint {str(ckpt)!r} has no {TOKENIZER}/ folder; it is incomplete")
    verify_tokenizer(ckpt, meta)
    tokenizer = load_tokenizer(ckpt / TOKENIZER)
    model = build_model(config, weights=weights, source=str(ckpt / WEIGHTS))
    return model, tokenizer, meta


def load_model(
    checkpoint: str | Path | None, device: str = "auto", weights_dtype: str = "float32"
) -> tuple[GPT, Tokenizer, dict[str, Any]]:
    """(model in eval mode, tokenizer, meta) for inference: from `checkpoint`, or the newest run under
    outputs/; `device` and `weights_dtype` are the tools' keys (see `device/runtime.inference_device`)."""
    torch_device, dtype = inference_device(device, weights_dtype)
    model, tokenizer, meta = read_checkpoint(checkpoint or find_latest_checkpoint(Path("outputs")))
    return model.to(device=torch_device, dtype=dtype).eval(), tokenizer, meta
