"""The verified cache: real damage to real files (truncated, edited, deleted shards; damaged tokenizer and
meta files) is found and rebuilt with one warning; a cache whose corpus is gone is served when intact and
refused in one line when damaged; processes preparing one dataset at once all end with one intact folder."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import run_script
from test_prepare import decode_split, expected_split_text, make_corpus, text_cfg

from minigpt.data import prepare as prepare_module
from minigpt.data import verify
from minigpt.data.config import TokenizerConfig
from minigpt.data.prepare import prepare_dataset
from minigpt.errors import UserError

BPE = TokenizerConfig(kind="bpe", vocab_size=300)


@pytest.fixture
def built(tmp_path: Path):
    """A text corpus prepared into several shards per split: (corpus, cache root, prepared)."""
    corpus = make_corpus(tmp_path / "corpus")
    cache = tmp_path / "cache"
    return corpus, cache, prepare_dataset(text_cfg(corpus, shard_tokens=800), BPE, cache, progress=False)


def warnings_in(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def again(corpus: Path, cache: Path, **kw):
    return prepare_dataset(text_cfg(corpus, shard_tokens=800, **kw), BPE, cache, progress=False)


def _truncate(path: Path, n_bytes: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(n_bytes)


def _edit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF
    path.write_bytes(bytes(data))


DAMAGE = {  # name -> (what to do to the folder, the phrase the warning gives)
    "shard truncated to an even size": (lambda d: _truncate(d / "train_001.bin", 800), "has 800 bytes"),
    "shard truncated to an odd size": (lambda d: _truncate(d / "train_001.bin", 801), "has 801 bytes"),
    "shard edited": (lambda d: _edit(d / "train_000.bin"), "train_000.bin does not match its sha256"),
    "shard deleted": (lambda d: (d / "val_000.bin").unlink(), "val_000.bin is missing"),
    "tokenizer ranks edited": (lambda d: _edit(d / "tokenizer" / "ranks.tiktoken"),
                               "tokenizer/ranks.tiktoken does not match"),
    "tokenizer spec deleted": (lambda d: (d / "tokenizer" / "tokenizer.json").unlink(),
                               "tokenizer/tokenizer.json is missing"),
    "meta.json not JSON": (lambda d: (d / "meta.json").write_text("{ oops"), "meta.json is unreadable"),
    "meta.json deleted": (lambda d: (d / "meta.json").unlink(), "no meta.json"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_damage_is_found_and_rebuilt_with_one_warning(built, case: str, caplog) -> None:
    corpus, cache, first = built
    expected = {s: decode_split(first, s) for s in ("train", "val")}
    damage, phrase = DAMAGE[case]
    damage(first.dir)
    with caplog.at_level(logging.WARNING, logger="minigpt.data"):
        rebuilt = again(corpus, cache)
    warnings = warnings_in(caplog)
    assert len(warnings) == 1 and phrase in warnings[0] and "rebuilding it" in warnings[0], warnings
    assert "\n" not in warnings[0]
    assert rebuilt.dir == first.dir and set(cache.iterdir()) == {first.dir}  # nothing temporary left
    for split in ("train", "val"):
        assert decode_split(rebuilt, split) == expected[split]
        assert expected[split] == expected_split_text(rebuilt.meta, split, corpus)
    caplog.clear()
    again(corpus, cache)  # and now it verifies
    assert not warnings_in(caplog)


def test_hash_once_then_stamps_and_verify_hash_catches_what_stamps_cannot(
    built, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    corpus, cache, first = built
    hashed: list[str] = []
    real_digest = verify.file_digest

    def counting(path: Path) -> str:
        hashed.append(Path(path).name)
        return real_digest(path)

    monkeypatch.setattr(verify, "file_digest", counting)
    again(corpus, cache)
    shards = {r["file"] for s in ("train", "val") for r in first.meta["shards"][s]}
    assert len(shards) > 4 and not set(hashed) & shards  # stamped when written: no shard hashed on reuse
    assert set(hashed) == {"ranks.tiktoken", "tokenizer.json"}  # the small tokenizer files always are

    hashed.clear()
    path = first.dir / "val_000.bin"
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched, not changed
    again(corpus, cache)
    assert set(hashed) & shards == {"val_000.bin"}  # hashed again, matched, re-stamped
    hashed.clear()
    again(corpus, cache)
    assert not set(hashed) & shards

    # An edit that puts size and mtime back is what stamps cannot see; verify=hash hashes every shard.
    st = path.stat()
    _edit(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with caplog.at_level(logging.WARNING, logger="minigpt.data"):
        again(corpus, cache)
        assert not warnings_in(caplog)
        again(corpus, cache, verify="hash")
    (warning,) = warnings_in(caplog)
    assert "val_000.bin does not match its sha256" in warning


def test_a_damaged_stamp_file_means_hashing_again_not_rebuilding(built, caplog) -> None:
    corpus, cache, first = built
    (first.dir / verify.STAMP_FILE).write_text("garbage")
    with caplog.at_level(logging.WARNING, logger="minigpt.data"):
        assert again(corpus, cache).dir == first.dir
    assert not warnings_in(caplog)
    assert json.loads((first.dir / verify.STAMP_FILE).read_text()).keys() >= {"train_000.bin", "val_000.bin"}


def test_a_cache_whose_corpus_is_gone(built, caplog) -> None:
    corpus, cache, first = built
    expected = decode_split(first, "val")
    for p in corpus.iterdir():
        p.unlink()
    corpus.rmdir()
    with caplog.at_level(logging.WARNING, logger="minigpt.data"):
        kept = again(corpus, cache)  # intact: served as it is, with a warning
    assert kept.dir == first.dir and decode_split(kept, "val") == expected
    (message,) = warnings_in(caplog)
    assert "does not exist" in message and str(first.dir) in message

    _truncate(first.dir / "train_000.bin", 999)
    with pytest.raises(UserError) as err:
        again(corpus, cache)
    line = str(err.value)
    assert "\n" not in line and str(first.dir) in line and "has 999 bytes" in line
    assert "restore the corpus files" in line and "does not exist" in line
    with pytest.raises(UserError, match="does not exist"):  # other settings: no cache to fall back on
        prepare_dataset(text_cfg(corpus), TokenizerConfig(kind="byte"), cache, progress=False)


def test_the_script_rebuilds_in_one_warning_and_refuses_in_one_line(built, tmp_path: Path, capsys) -> None:
    corpus, cache, first = built
    args = ["data=text", f"data.paths=[{corpus}]", "data.val_ratio=0.2", "data.shard_tokens=800",
            "tokenizer.vocab_size=300", f"data.cache_dir={cache}", f"hydra.run.dir={tmp_path / 'run'}"]
    _truncate(first.dir / "train_001.bin", 801)
    run = run_script("prepare_data", args, capsys)
    assert run.code == 0 and "Traceback" not in run.out + run.err
    warning = [line for line in run.out.splitlines() if "damaged" in line]
    assert len(warning) == 1 and "train_001.bin has 801 bytes" in warning[0] and "rebuilding it" in warning[0]

    _truncate(first.dir / "val_000.bin", 7)
    for p in corpus.iterdir():
        p.unlink()
    run = run_script("prepare_data", args, capsys)
    assert run.code == 2 and len(run.err_lines) == 1 and "Traceback" not in run.out + run.err
    expected = f"error: the prepared data in {first.dir} is damaged (val_000.bin has 7 bytes"
    assert run.err_lines[0].startswith(expected)


def test_losing_the_race_keeps_the_winners_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    corpus, cache = make_corpus(tmp_path / "corpus"), tmp_path / "cache"
    real_build = prepare_module._build
    rivals = []

    def build_while_a_rival_finishes(*args, **kwargs):
        meta = real_build(*args, **kwargs)
        if not rivals:  # another process finishes the same dataset while this one is still writing
            rivals.append(None)
            rivals[0] = prepare_dataset(text_cfg(corpus), BPE, cache, progress=False)
        return meta

    monkeypatch.setattr(prepare_module, "_build", build_while_a_rival_finishes)
    ours = prepare_dataset(text_cfg(corpus), BPE, cache, progress=False)
    assert ours.dir == rivals[0].dir and set(cache.iterdir()) == {ours.dir}
    assert decode_split(ours, "val") == expected_split_text(ours.meta, "val", corpus)


# One process of the race: it imports only the data layer (not torch), waits for the common start signal,
# prepares, and prints the folder it got.
RACER = """
import sys, time
from pathlib import Path
from minigpt.data.config import DataConfig, TokenizerConfig
from minigpt.data.prepare import prepare_dataset
corpus, cache, go = sys.argv[1:]
cfg = DataConfig(source="text", paths=[corpus], val_ratio=0.2)
while not Path(go).exists():
    time.sleep(0.005)
print(prepare_dataset(cfg, TokenizerConfig(kind="byte"), Path(cache), progress=False).dir)
"""


@pytest.mark.slow
def test_processes_preparing_at_once_end_with_one_intact_folder(tmp_path: Path) -> None:
    corpus, cache, go = make_corpus(tmp_path / "corpus", n_files=30), tmp_path / "cache", tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(corpus), str(cache), str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    time.sleep(1.0)  # let all three import and wait at the line
    go.touch()
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in outputs]
    dirs = {out.strip() for out, _ in outputs}
    assert len(dirs) == 1 and list(cache.iterdir()) == [Path(dirs.pop())]  # no temporary folder left
    prepared = prepare_dataset(text_cfg(corpus), TokenizerConfig(kind="byte"), cache, progress=False)
    assert prepare_module._damage(prepared.dir, "hash") is None
    assert decode_split(prepared, "train") == expected_split_text(prepared.meta, "train", corpus)
