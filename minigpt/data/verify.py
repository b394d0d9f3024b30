"""Is a prepared folder still exactly what its meta.json describes? Checked every time a cache is reused.

    meta.json      readable, this format_version, and it lists every shard and tokenizer file
    tokenizer/     every file present with the sha256 recorded (a few MB at most: always hashed)
    shards         present, with the byte size recorded (always: a stat); and the content hash:
                   verify=hash   every shard hashed on every reuse
                   verify=stamp  (default) a shard is hashed once, then trusted while its size, mtime and
                                 inode are those recorded in `verified.json` when it last matched

Why stamps by default: hashing reads every byte of every shard, which is nothing for the default corpus
(a few MB of bins) but many seconds for a corpus of billions of tokens, paid by every rank of every job on
every start (`make bench` measures both ways, docs/performance.md). Anything that writes a shard changes
its mtime (and a copy, its inode), which sends it back to a full hash; only an edit that restores size and
mtime afterwards goes unseen, and `data.verify=hash` catches that too. `verified.json` is written
atomically and only when it changes; if the folder is read-only it is simply not written (every reuse then
hashes).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any

from minigpt.data.shards import HASH

log = logging.getLogger(__name__)

META_FILE = "meta.json"
STAMP_FILE = "verified.json"
TOKENIZER_DIR = "tokenizer"
HASH_BLOCK = 1 << 18  # bytes per read: 256 KiB already hashes at full speed, in one reused buffer


def file_digest(path: Path) -> str:
    """The hex sha256 of a file, read in blocks (constant memory whatever its size)."""
    h = hashlib.new(HASH)
    buffer = memoryview(bytearray(HASH_BLOCK))
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            h.update(buffer[:n])
    return h.hexdigest()


def folder_digests(folder: Path) -> dict[str, str]:
    """Relative path -> hex sha256 of every file under `folder` (a tokenizer folder, say), sorted by path."""
    return {p.relative_to(folder).as_posix(): file_digest(p) for p in sorted(Path(folder).rglob("*"))
            if p.is_file()}


def read_meta(folder: Path, format_version: int) -> tuple[dict[str, Any] | None, str | None]:
    """(meta, None) when meta.json is readable and of this format, else (None, what is wrong)."""
    path = Path(folder) / META_FILE
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, f"no {META_FILE}"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"{META_FILE} is unreadable ({type(e).__name__})"
    if not isinstance(meta, dict) or meta.get("format_version") != format_version:
        found = meta.get("format_version") if isinstance(meta, dict) else None
        return None, f"{META_FILE} has format_version {found}, this minigpt writes {format_version}"
    return meta, None


def find_damage(folder: Path, meta: dict[str, Any], mode: str) -> str | None:
    """None when every file matches `meta`; else a short phrase naming the first mismatch found."""
    folder = Path(folder)
    try:
        tokenizer_files = meta["tokenizer"]["files"]
        shards = [record for split in ("train", "val") for record in meta["shards"][split]]
    except (KeyError, TypeError):
        return f"{META_FILE} does not list its shards and tokenizer files"
    for name, digest in tokenizer_files.items():
        path = folder / TOKENIZER_DIR / name
        if not path.is_file():
            return f"{TOKENIZER_DIR}/{name} is missing"
        if file_digest(path) != digest:
            return f"{TOKENIZER_DIR}/{name} does not match its {HASH}"
    stamps = _read_stamps(folder)
    fresh: dict[str, list[int]] = {}
    for record in shards:
        path = folder / record["file"]
        try:
            st = path.stat()
        except OSError:
            return f"{record['file']} is missing"
        if st.st_size != record["bytes"]:
            return f"{record['file']} has {st.st_size} bytes, {META_FILE} records {record['bytes']}"
        stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
        if mode == "stamp" and stamps.get(record["file"]) == stamp:
            fresh[record["file"]] = stamp
            continue
        if file_digest(path) != record[HASH]:
            return f"{record['file']} does not match its {HASH} (its content was changed)"
        fresh[record["file"]] = stamp
    if fresh != stamps:
        write_stamps(folder, fresh)
    return None


def stamp_now(folder: Path, meta: dict[str, Any]) -> None:
    """Record the shards just written (and hashed while writing) as verified."""
    fresh = {}
    for split in ("train", "val"):
        for record in meta["shards"][split]:
            st = (Path(folder) / record["file"]).stat()
            fresh[record["file"]] = [st.st_size, st.st_mtime_ns, st.st_ino]
    write_stamps(folder, fresh)


def _read_stamps(folder: Path) -> dict[str, list[int]]:
    try:
        stamps = json.loads((folder / STAMP_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}  # none yet, or damaged: every shard is hashed, and the file rewritten
    return stamps if isinstance(stamps, dict) else {}


def write_stamps(folder: Path, stamps: dict[str, list[int]]) -> None:
    """Atomically (a unique temporary name, then rename): ranks that verify at once never see half a file."""
    tmp = Path(folder) / f".{STAMP_FILE}.{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.write_text(json.dumps(stamps, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, Path(folder) / STAMP_FILE)
    except OSError as e:  # a read-only cache (e.g. shared, prepared by someone else): hash again next time
        log.debug("cannot record verified shards in %s (%s)", folder, e)
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
