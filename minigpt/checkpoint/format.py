"""The checkpoint format: one folder, self-describing, written atomically.

    <ckpt>/model.safetensors   weights of the unwrapped module (no torch.compile / DDP name prefixes)
    <ckpt>/state.pt            optimizer, scheduler, scaler, step, tokens seen, RNG states, loader state;
                               plain tensors and containers only, so it loads with `weights_only=True`
    <ckpt>/meta.json           format_version, resolved model config, full resolved config, step, tokens,
                               best val loss
    <ckpt>/tokenizer/          the tokenizer's own files, so a checkpoint always decodes its tokens

A run folder keeps `checkpoints/last/` and `checkpoints/best/`. A checkpoint is first written completely into
a temporary sibling folder, its files fsync'ed, and only then renamed into place, so a crash mid-write leaves
the previous checkpoint intact.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model
from torch import nn

from minigpt.errors import UserError

FORMAT_VERSION = 1
SUPPORTED_VERSIONS = (1,)
WEIGHTS, STATE, META, TOKENIZER = "model.safetensors", "state.pt", "meta.json", "tokenizer"


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under torch.compile (`_orig_mod`) and DDP/FSDP-style wrappers (`module`)."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(getattr(model, "module", None), nn.Module):
            model = model.module
        else:
            return model


# ---------------------------------------------------------------------------------------------------- RNG


def rng_state() -> dict[str, Any]:
    """Every random stream this process draws from, as tensors and plain Python (safe for `weights_only`).

    CUDA: the generator of the current device only (under torchrun each rank has its own device and saves
    its own state; reading every device's would open a CUDA context on each of them from every rank), and
    only once CUDA is in use, so a CPU run never initialises it. The trainer saves one of these per rank.
    """
    np_state = np.random.get_state(legacy=False)
    state = {
        "python": random.getstate(),
        "numpy": {"key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
                  "pos": int(np_state["state"]["pos"]), "has_gauss": int(np_state["has_gauss"]),
                  "gauss": float(np_state["gauss"])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()  # the current device's
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` captured (in the process, and on the current CUDA device, it describes)."""
    random.setstate(_as_tuple(state["python"]))
    n = state["numpy"]
    np.random.set_state({"bit_generator": "MT19937", "has_gauss": n["has_gauss"], "gauss": n["gauss"],
                         "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]}})
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if isinstance(cuda, list):  # older checkpoints: one state per visible device
            torch.cuda.set_rng_state_all(cuda)
        else:
            torch.cuda.set_rng_state(cuda)


def _as_tuple(x: Any) -> Any:
    """`random.setstate` wants tuples; a round trip through some serialisers turns them into lists."""
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x


# ---------------------------------------------------------------------------------------------------- save


def save_checkpoint(
    path: Path, model: nn.Module, state: dict[str, Any], meta: dict[str, Any], tokenizer: Any | None = None
) -> Path:
    """Write a checkpoint folder at `path` atomically, replacing any previous one there.

    `state` holds the resumable training state (tensors, numbers, strings, nested dicts/lists); `meta` the
    JSON description (the format version is added here); `tokenizer` anything with `.save(folder)`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.tmp-*"):  # left by a process killed mid-write
        shutil.rmtree(stale, ignore_errors=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.mkdir()
    save_model(unwrap(model), str(tmp / WEIGHTS))  # handles tied weights (one stored copy)
    torch.save(state, tmp / STATE)
    meta_text = json.dumps({"format_version": FORMAT_VERSION, **meta}, indent=2, default=str)
    (tmp / META).write_text(meta_text + "\n")
    if tokenizer is not None:
        tokenizer.save(tmp / TOKENIZER)
    _fsync_tree(tmp)
    # Swap: old -> .old, tmp -> path, drop .old. A crash between the two renames leaves `.old` complete,
    # and `resolve_checkpoint` falls back to it. A `.old` is only deleted once `path` is complete again (a
    # crash may have left `.old` as the only checkpoint).
    old = path.with_name(f".{path.name}.old")
    if path.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    shutil.rmtree(old, ignore_errors=True)
    return path


def _fsync_tree(folder: Path) -> None:
    for f in sorted(folder.rglob("*")):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    for d in [folder, *[p for p in folder.rglob("*") if p.is_dir()]]:
        _fsync_dir(d)


def _fsync_dir(folder: Path) -> None:
    """Persist a folder's entries (the renames); not every platform lets you open a directory."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------------- load


def read_meta(ckpt: Path) -> dict[str, Any]:
    """The checkpoint's meta.json, with its format version checked."""
    try:
        meta = json.loads((ckpt / META).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"checkpoint {str(ckpt)!r} has an unreadable {META} ({e}); it is corrupt") from None
    version = meta.get("format_version") if isinstance(meta, dict) else None
    if version not in SUPPORTED_VERSIONS:
        supported = ", ".join(map(str, SUPPORTED_VERSIONS))
        raise UserError(
            f"checkpoint {str(ckpt)!r} has format_version {version!r}; this minigpt reads {supported} "
            "(use the minigpt version that wrote it)"
        )
    return meta


def load_weights(model: nn.Module, ckpt: Path) -> None:
    """Load model.safetensors into `model` (unwrapped), strictly: every name and shape must match."""
    file = ckpt / WEIGHTS
    if not file.is_file():
        raise UserError(f"checkpoint {str(ckpt)!r} has no {WEIGHTS}; it is incomplete")
    try:
        missing, unexpected = load_model(unwrap(model), str(file), strict=False)
    except (SafetensorError, OSError, RuntimeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(
            f"cannot load {str(file)!r}: {first} (corrupt file or a different model config)"
        ) from None
    if missing or unexpected:
        raise UserError(
            f"{str(file)!r} does not match the model: missing {sorted(missing)[:3]}, unexpected "
            f"{sorted(unexpected)[:3]} (was it written with a different model config?)"
        )


def load_state(ckpt: Path, map_location: str | torch.device = "cpu", mmap: bool = False) -> dict[str, Any]:
    """state.pt, loaded with `weights_only=True` (no arbitrary code runs while unpickling); `mmap`: the
    tensors stay in the file until used (a cheap look at the keys)."""
    file = ckpt / STATE
    if not file.is_file():
        raise UserError(f"checkpoint {str(ckpt)!r} has no {STATE}; it cannot be resumed from")
    try:
        return torch.load(file, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        if "weights only load failed" not in str(e).lower():
            first = str(e).splitlines()[0][:200]
            raise UserError(f"cannot load {str(file)!r}: {first} (the file is corrupt)") from None
        # torch's restricted unpickler met something besides tensors and plain containers (a code-running
        # global, an opcode it does not allow): never fall back to full unpickling.
        raise UserError(
            f"refused to load {str(file)!r}: it holds something other than plain tensors and containers "
            "(tampered with, corrupt, or not written by minigpt) and unpickling it could run code; "
            "use only checkpoints you trust"
        ) from None
    except Exception as e:  # torch raises several types for truncated or tampered files
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"cannot load {str(file)!r}: {first[:200]} (the file is corrupt)") from None
