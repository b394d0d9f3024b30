"""The checkpoint format: one folder, self-describing, written atomically.

    <ckpt>/model.safetensors   weights of the unwrapped module (no torch.compile / DDP name prefixes)
    <ckpt>/state.pt            everything a resumed step depends on (contents.py); plain tensors and
                               containers only, so it loads with `weights_only=True`
    <ckpt>/meta.json           format_version, the resolved model config and full config, step, val loss
                               (contents.py), and the SHA-256 of every tokenizer file (`tokenizer_files`)
    <ckpt>/tokenizer/          the tokenizer's own files, so a checkpoint always decodes its tokens

A run folder keeps `checkpoints/last/` and `checkpoints/best/`. A checkpoint is first written completely into
a temporary sibling folder, its files fsync'ed, and only then renamed into place, so a crash mid-write leaves
the previous checkpoint intact; a failed write (a full disk) removes its temporary folder and says so in one
line. The tokenizer is not derived data that could be rebuilt: a tokenizer/ folder whose files no longer
match their recorded hashes is refused, never silently used (it would decode every token wrongly).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_model
from torch import nn

from minigpt.data.verify import folder_digests
from minigpt.errors import UserError, unwritable_path_message
from minigpt.model.factory import put_weights, unwrap

FORMAT_VERSION = 1
SUPPORTED_VERSIONS = (1,)
WEIGHTS, STATE, META, TOKENIZER = "model.safetensors", "state.pt", "meta.json", "tokenizer"
TOKENIZER_HASHES = "tokenizer_files"  # meta.json: tokenizer/ file -> SHA-256, checked on load


# ---------------------------------------------------------------------------------------------------- save


def save_checkpoint(
    path: Path, model: nn.Module, state: dict[str, Any], meta: dict[str, Any], tokenizer: Any | None = None,
    elsewhere: str = "hydra.run.dir=...",
) -> Path:
    """Write a checkpoint folder at `path` atomically, replacing any previous one there.

    `state` holds the resumable training state (tensors, numbers, strings, nested dicts/lists); `meta` the
    JSON description (the format version and the tokenizer files' hashes are added here); `tokenizer`
    anything with `.save(folder)`. A failed write (a full disk, lost permissions, a deleted folder) raises a
    one-line UserError naming the file, the cause and the keys that choose another place (`elsewhere`), and
    leaves no temporary folder and the previous checkpoint at `path` as it was.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_folder(tmp, model, state, meta, tokenizer)
        _swap_in(tmp, path)
    except OSError as e:
        if e.filename is not None and Path(e.filename).is_relative_to(tmp):  # name where it was going
            e = OSError(e.errno, e.strerror, str(path / Path(e.filename).relative_to(tmp)))
        kept = f"the previous checkpoint {path} is intact" if existed else "no earlier checkpoint was there"
        raise UserError(f"checkpoint not saved: {unwritable_path_message(e, elsewhere)}; {kept}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # nothing there after a successful swap
    return path


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Delete what a process killed mid-save left in a checkpoints folder; returns what was deleted.

    `.<name>.tmp-<pid>` folders are never complete checkpoints; `.<name>.old` is stale once `<name>` is
    complete again (before that it may be the only checkpoint: `resolve_checkpoint` falls back to it).
    Only for a folder no other process writes to (training holds the run folder's lock).
    """
    folder = Path(folder)
    stale = [p for p in folder.glob(".*.tmp-*") if p.is_dir()] if folder.is_dir() else []
    stale += [p for p in folder.glob(".*.old") if (folder / p.name[1:-len(".old")] / META).is_file()]
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    return stale


def _write_folder(tmp: Path, model: nn.Module, state: dict[str, Any], meta: dict[str, Any],
                  tokenizer: Any | None) -> None:
    tmp.mkdir()
    _save_weights(unwrap(model), tmp / WEIGHTS)  # handles tied weights (one stored copy)
    # Through a buffer: torch's own file writer reports a full disk as "unexpected pos 704 vs 598".
    buffer = io.BytesIO()
    torch.save(state, buffer)
    _write_file(tmp / STATE, buffer.getbuffer())
    if tokenizer is not None:
        tokenizer.save(tmp / TOKENIZER)
        meta = {**meta, TOKENIZER_HASHES: folder_digests(tmp / TOKENIZER)}
    meta_text = json.dumps({"format_version": FORMAT_VERSION, **meta}, indent=2, default=str)
    _write_file(tmp / META, (meta_text + "\n").encode())
    _fsync_tree(tmp)


def _save_weights(model: nn.Module, file: Path) -> None:
    try:
        save_model(model, str(file))
    except SafetensorError as e:
        # safetensors reports a failed write as text ("... File too large (os error 27)"): the OSError it was
        code = re.search(r"os error (\d+)", str(e))
        if code is None:
            raise UserError(f"cannot write {file}: {str(e).splitlines()[0]}") from None
        raise OSError(int(code[1]), os.strerror(int(code[1])), str(file)) from None


def _write_file(file: Path, data: bytes | memoryview) -> None:
    with open(file, "wb") as f:
        f.write(data)


def _swap_in(tmp: Path, path: Path) -> None:
    """Swap: old -> .old, tmp -> path, drop .old.

    A crash between the two renames leaves `.old` complete, and `resolve_checkpoint` falls back to it; a
    failed second rename puts `.old` back. A `.old` is only deleted once `path` is complete again.
    """
    old = path.with_name(f".{path.name}.old")
    if path.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
    try:
        os.replace(tmp, path)
    except OSError:
        if old.exists() and not path.exists():
            os.replace(old, path)
        raise
    _fsync_dir(path.parent)
    shutil.rmtree(old, ignore_errors=True)


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


def verify_tokenizer(ckpt: Path, meta: dict[str, Any]) -> None:
    """The tokenizer/ folder must be the one saved with the checkpoint (meta.json's hashes); else UserError.

    Checkpoints from before the hashes were recorded carry none and are used as they are.
    """
    recorded = meta.get(TOKENIZER_HASHES)
    if not isinstance(recorded, dict):
        return
    folder = ckpt / TOKENIZER
    found = folder_digests(folder) if folder.is_dir() else {}
    damaged = sorted(name for name, digest in recorded.items() if found.get(name) != digest)
    if damaged:
        raise UserError(
            f"checkpoint {str(ckpt)!r} has a damaged {TOKENIZER}/ folder ({', '.join(damaged[:3])} changed "
            f"or missing since it was saved, per {META}); restore the folder from a copy of the checkpoint, "
            "or use another checkpoint"
        )


def read_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    """model.safetensors as a state dict under every name the model has: the file holds each shared tensor
    (the tied embedding and head) once, under one name, and records the others in its metadata."""
    file = ckpt / WEIGHTS
    if not file.is_file():
        raise UserError(f"checkpoint {str(ckpt)!r} has no {WEIGHTS}; it is incomplete")
    try:
        weights = load_file(file)
        with safe_open(file, "pt") as f:
            shared = f.metadata() or {}  # dropped name -> the name it is kept under
    except (SafetensorError, OSError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"cannot load {str(file)!r}: {first} (corrupt file)") from None
    return weights | {name: weights[kept] for name, kept in shared.items() if kept in weights}


def load_weights(model: nn.Module, ckpt: Path) -> None:
    """Load model.safetensors into `model` (unwrapped), strictly: every name and shape must match."""
    put_weights(model, read_weights(ckpt), str(ckpt / WEIGHTS))


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
