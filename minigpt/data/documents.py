"""What every corpus is made of: documents, the hash that splits them, and the files `data.paths` names.

    Document        one unit of text and its name (the name decides its split)
    unit_hash       name -> [0, 1): a document is in val when this falls below data.val_ratio
    collect_files   data.paths (files, folders, globs) -> the files, each with the folder it was found in
    SourceMissing   the UserError for a corpus that is not there (prepare can fall back to its cache)
"""

from __future__ import annotations

import glob
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from minigpt.data.config import DataConfig
from minigpt.errors import UserError

SPLITS = ("train", "val")


@dataclass(frozen=True)
class Document:
    """One unit of text: `name` is its relative path (recorded in meta.json), `text` its content."""

    name: str
    text: str


class SourceMissing(UserError):
    """The corpus' files are not there (a path, glob or download that is gone). `prepare_dataset` can then
    still serve an intact cache prepared from them earlier."""


def unit_hash(name: str) -> float:
    """A number in [0, 1) fixed by the name alone (hashlib, not hash(): that is salted per process)."""
    return int(hashlib.sha256(name.encode("utf-8")).hexdigest()[:16], 16) / 2**64


def walk_files(folder: Path, exclude: set[str] | frozenset[str] = frozenset()) -> list[Path]:
    """Every file under `folder`, sorted, pruning excluded and hidden folders before descending
    (the interpreter's site-packages can be far larger than the library itself)."""
    files = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if d not in exclude and not d.startswith("."))
        files += [Path(dirpath) / f for f in sorted(filenames) if not f.startswith(".")]
    return files


def collect_files(cfg: DataConfig) -> list[tuple[Path, Path]]:
    """(file, root) for every file of `cfg.paths`, in order, without duplicates: files named explicitly
    (always), plus files under named folders and glob matches whose names end in one of `cfg.extensions`
    (any file if the list is empty). `root` is the folder the entry names (a glob's fixed prefix, a named
    file's parent), so `file.relative_to(root)` does not change when the whole corpus moves."""
    wanted = tuple(cfg.file_extensions())

    def accepted(p: Path) -> bool:
        return not wanted or p.name.endswith(wanted)

    found: list[tuple[Path, Path]] = []
    for entry in cfg.paths:
        pattern = os.path.expanduser(entry)
        if glob.has_magic(pattern):
            matches = [Path(m) for m in sorted(glob.glob(pattern, recursive=True))]
            if not matches:
                raise SourceMissing(
                    f"data.paths glob {entry!r} matched nothing; check the pattern and quoting")
            root = _glob_root(pattern)
            for m in matches:
                found += [(f, root) for f in (walk_files(m) if m.is_dir() else [m]) if accepted(f)]
        elif Path(pattern).is_dir():
            found += [(f, Path(pattern)) for f in walk_files(Path(pattern)) if accepted(f)]
        elif Path(pattern).is_file():
            found.append((Path(pattern), Path(pattern).parent))  # named explicitly: taken whatever its name
        else:
            raise SourceMissing(f"data.paths entry {entry!r} does not exist; give a file, folder or glob")
    unique: dict[Path, tuple[Path, Path]] = {}
    for f, root in found:  # drop duplicates, keep the first order
        unique.setdefault(f.resolve(), (f.resolve(), root.resolve()))
    if not unique:
        ext = "/".join(wanted) or "any extension"
        raise SourceMissing(
            f"data.paths={list(cfg.paths)} contains no files ending in {ext}; "
            "fix the paths or set data.extensions (e.g. 'data.extensions=[.txt,.py]', [] for all)"
        )
    return list(unique.values())


def _glob_root(pattern: str) -> Path:
    """The folder a glob searches: its leading parts without wildcards ("data/**/*.jsonl" -> "data")."""
    parts = Path(pattern).parts
    fixed = next((i for i, part in enumerate(parts) if glob.has_magic(part)), len(parts))
    return Path(*parts[:fixed]) if fixed else Path(".")
