"""The files of a Hugging Face model folder, read (an import) and written (an export).

    config.json              the architecture (`model_type`) and its sizes
    model.safetensors        the weights (or a sharded `model.safetensors.index.json`, or the older pickled
                             `pytorch_model.bin`, read here with `weights_only=True` so no code runs)
    generation_config.json   the ids generation starts and stops with
    tokenizer.json           the fast tokenizer (+ tokenizer_config.json): hf_tokenizer.py
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save

from minigpt.errors import UserError

CONFIG, WEIGHTS, GENERATION_CONFIG = "config.json", "model.safetensors", "generation_config.json"


def read_hf_config(folder: Path) -> dict:
    """config.json of a HF folder as a dict; UserError when there is none or it is not JSON."""
    file = Path(folder) / CONFIG
    if not file.is_file():
        raise UserError(f"{folder} has no {CONFIG}; pass a Hugging Face model folder (config.json + weights)")
    try:
        hf = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{file} is not valid JSON ({e})") from None
    if not isinstance(hf, dict):
        raise UserError(f"{file} holds no JSON object; it is not a Hugging Face config")
    return hf


def config_number(hf: dict, key: str, default: float | None = None, whole: bool = True,
                  file: str | Path = CONFIG) -> int | float:
    """config.json's `key` (`default` where it is absent): a whole number >= 1, or with whole=False any number
    > 0; UserError naming the file and the key for anything else."""
    value = hf.get(key, default)
    if value is None:
        raise UserError(f"{file} has no {key}; it is not a complete Hugging Face config")
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not value > 0 or (whole and value != int(value)):
        raise UserError(f"{file} has {key}={value!r}; it must be {'a whole number >= 1' if whole else '> 0'}")
    return int(value) if whole else float(value)


def read_hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of a HF folder: model.safetensors, its sharded index, or pytorch_model.bin."""
    folder = Path(folder)
    try:
        if (folder / WEIGHTS).is_file():
            return load_file(str(folder / WEIGHTS))
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            return {k: v for shard in shards for k, v in load_file(str(folder / shard)).items()}
        if (folder / "pytorch_model.bin").is_file():
            return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    except Exception as e:  # safetensors, torch.load and json raise several types for corrupt files
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"cannot read the weights in {folder}: {first[:200]} (corrupt file?)") from None
    raise UserError(f"{folder} has no model.safetensors or pytorch_model.bin; download the full model folder")


def load_converted_weights(model: torch.nn.Module, sd: dict[str, torch.Tensor], what: str,
                           folder: Path) -> torch.nn.Module:
    """Copy `sd` (the `what` weights of `folder`) into `model` strictly (every name and shape), converting
    fp16/bf16 files to float32; UserError naming the first mismatch. Returns the model in eval mode."""
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(sd)), sorted(set(sd) - set(expected))
    if missing or unexpected:
        raise UserError(f"the {what} weights in {folder} do not match its {CONFIG}: missing {missing[:3]}, "
                        f"unexpected {unexpected[:3]}")
    for name, tensor in sd.items():
        if tensor.shape != expected[name].shape:
            raise UserError(f"the {what} weights in {folder} do not match its {CONFIG}: {name} has shape "
                            f"{tuple(tensor.shape)} where it needs {tuple(expected[name].shape)}")
    model.load_state_dict(sd)
    return model.eval()


def write_json(file: Path, content: dict) -> None:
    _write(file, (json.dumps(content, indent=2) + "\n").encode())


def write_text(file: Path, text: str) -> None:
    _write(file, text.encode())


def write_weights(file: Path, tensors: dict[str, torch.Tensor]) -> None:
    """float32 safetensors; the `format: pt` tag tells transformers the tensors are in PyTorch layout. Made in
    memory and written as plain bytes: a failed write is then an OSError, not safetensors' text about one."""
    tensors = {k: v.detach().float().cpu().contiguous() for k, v in tensors.items()}
    _write(file, save(tensors, metadata={"format": "pt"}))


def _write(file: Path, data: bytes) -> None:
    """`data` as `file`; a write that fails names the file (Python's OSError for a write to an open file
    names none)."""
    try:
        file.write_bytes(data)
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(file)) from None
