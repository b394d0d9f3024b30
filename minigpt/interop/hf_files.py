"""The files of a Hugging Face model folder, and how every export is written without half-written output.

    config.json              the architecture (`model_type`) and its sizes
    model.safetensors        the weights (or a sharded `model.safetensors.index.json`, or the older pickled
                             `pytorch_model.bin`, read here with `weights_only=True` so no code runs)
    generation_config.json   the ids generation starts and stops with
    tokenizer.json           the fast tokenizer (+ tokenizer_config.json): hf_tokenizer.py

`staged_output` is the one way an exporter writes: into a hidden sibling first, renamed into place only
when complete, and never over something that exists.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from minigpt.errors import UserError, unwritable_path_message

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


def load_converted_weights(model: torch.nn.Module, sd: dict[str, torch.Tensor], what: str) -> torch.nn.Module:
    """Copy `sd` into `model` strictly (every name and shape), converting fp16/bf16 files to float32;
    UserError naming the first mismatch. Returns the model in eval mode."""
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(sd)), sorted(set(sd) - set(expected))
    if missing or unexpected:
        raise UserError(
            f"the {what} weights do not match config.json: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    for name, tensor in sd.items():
        if tensor.shape != expected[name].shape:
            raise UserError(
                f"{name} has shape {tuple(tensor.shape)}; config.json needs {tuple(expected[name].shape)}"
            )
    model.load_state_dict(sd)
    return model.eval()


def write_json(file: Path, content: dict) -> None:
    file.write_text(json.dumps(content, indent=2) + "\n")


def write_weights(file: Path, tensors: dict[str, torch.Tensor]) -> None:
    """float32 safetensors; the `format: pt` tag tells transformers the tensors are in PyTorch layout."""
    save_file({k: v.detach().float().cpu().contiguous() for k, v in tensors.items()}, str(file),
              metadata={"format": "pt"})


@contextlib.contextmanager
def staged_output(out: Path, folder: bool) -> Iterator[Path]:
    """Yield a hidden temporary path beside `out` (a folder when `folder`) to write the export into; on
    success it is renamed to `out`, on any failure removed, so `out` is either complete or absent.

    `out` must not exist: nothing is ever overwritten. A write that fails for lack of space or permission
    becomes a one-line UserError naming the path.
    """
    out = Path(out).expanduser()
    if out.exists():
        raise UserError(f"{out} already exists; choose a new output path (nothing was overwritten)")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        _remove(tmp)  # what a killed export by a process of the same id left
        if folder:
            tmp.mkdir()
        yield tmp
        _rename_without_clobbering(tmp, out)
    except OSError as e:
        raise UserError(f"nothing exported: {unwritable_path_message(e)}") from None
    finally:
        _remove(tmp)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists():
        path.unlink()


def _rename_without_clobbering(tmp: Path, out: Path) -> None:
    """A folder cannot replace a non-empty folder; a file is linked, which fails if `out` has appeared."""
    if tmp.is_dir():
        os.rename(tmp, out)
        return
    try:
        os.link(tmp, out)
    except FileExistsError:
        raise UserError(f"{out} appeared while exporting; nothing was overwritten") from None
    except OSError:  # a filesystem without hard links: the existence check above is the guard
        os.replace(tmp, out)
