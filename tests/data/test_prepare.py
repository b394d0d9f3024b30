"""prepare_dataset: shards that decode to the exact corpus, disjoint splits, the fingerprint cache,
atomic writes, and the script's success and one-line failure (streamed corpora: data/test_streaming.py;
damaged caches: data/test_cache.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tiktoken

from minigpt.data import prepare as prepare_module
from minigpt.data.config import DEFAULT_EXTENSIONS, DataConfig, TokenizerConfig
from minigpt.data.prepare import load_prepared, prepare_dataset
from minigpt.data.tokenizers import EOT, TiktokenTokenizer
from minigpt.errors import UserError

ROOT = Path(__file__).resolve().parents[2]


def make_corpus(folder: Path, n_files: int = 8) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        lines = [f"line {j} of file {i}: {'spam ' * (j % 4)}eggs ✓\n" for j in range(60)]
        (folder / f"doc{i}.txt").write_text("".join(lines), encoding="utf-8")
    return folder


def text_cfg(corpus: Path, **kw) -> DataConfig:
    return DataConfig(source="text", paths=[str(corpus)], val_ratio=0.2, **kw)


def split_tokens(prepared, split: str) -> np.ndarray:
    """A split's tokens read straight from its shard files, in meta.json's order (not through TokenSplit)."""
    dtype = {"uint16": "<u2", "uint32": "<u4"}[prepared.meta["dtype"]]
    files = [prepared.dir / r["file"] for r in prepared.meta["shards"][split]]
    return np.concatenate([np.fromfile(f, dtype=dtype) for f in files])


def decode_split(prepared, split: str) -> str:
    return prepared.tokenizer.decode(split_tokens(prepared, split).tolist())


def expected_split_text(meta: dict, split: str, corpus: Path) -> str:
    """The split's text rebuilt straight from the files on disk, independent of the pipeline."""
    files = [corpus / Path(f["name"]).name for f in meta["files"][split]]
    return "".join(EOT + f.read_text(encoding="utf-8") for f in files)


@pytest.mark.parametrize(("kind", "vocab"), [("bpe", 300), ("char", 0), ("byte", 0)])
def test_bins_decode_to_the_exact_corpus(tmp_path: Path, kind: str, vocab: int) -> None:
    corpus = make_corpus(tmp_path / "corpus")
    tok_cfg = TokenizerConfig(kind=kind, vocab_size=vocab or None)
    # a small shard size: every split spans several shards, documents cross shard boundaries (small enough
    # for any vocabulary: rustbpe's merges, and so the token count, may differ from one training to the next)
    cfg = text_cfg(corpus, shard_tokens=300)
    prepared = prepare_dataset(cfg, tok_cfg, tmp_path / "cache", progress=False)
    meta = prepared.meta
    assert prepared.dir.name.startswith(f"text-{kind}-") and prepared.dir.parent == tmp_path / "cache"
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == prepared.tokenizer.vocab_size

    train_names = {f["name"] for f in meta["files"]["train"]}
    val_names = {f["name"] for f in meta["files"]["val"]}
    assert train_names and val_names and not train_names & val_names
    assert {Path(n).name for n in train_names | val_names} == {p.name for p in corpus.iterdir()}

    for split in ("train", "val"):
        tokens = split_tokens(prepared, split)
        shards = meta["shards"][split]
        assert [r["file"] for r in shards] == [f"{split}_{i:03d}.bin" for i in range(len(shards))]
        assert all(r["tokens"] == 300 for r in shards[:-1]) and 0 < shards[-1]["tokens"] <= 300
        assert len(tokens) == meta["tokens"][split] == len(prepared.split(split))
        assert np.array_equal(prepared.split(split).read(0, len(tokens)), tokens)
        assert tokens[0] == prepared.tokenizer.eot_id
        n_docs = (tokens == prepared.tokenizer.eot_id).sum()  # one boundary per document
        assert n_docs == len(meta["files"][split]) == meta["documents"][split]
        expected = expected_split_text(meta, split, corpus)
        assert decode_split(prepared, split) == expected
        assert meta["bytes"][split] == len(expected.replace(EOT, "").encode("utf-8"))
    assert len(meta["shards"]["train"]) > 3
    if kind == "bpe":
        assert prepared.tokenizer.vocab_size == 300


def test_shard_size_and_workers_change_files_not_tokens(tmp_path: Path) -> None:
    corpus = make_corpus(tmp_path / "corpus")
    tok = TokenizerConfig(kind="bpe", vocab_size=300)
    one = prepare_dataset(text_cfg(corpus), tok, tmp_path / "a", progress=False)
    # rustbpe's merges, and so the token count (~700 train tokens), can differ between processes: 150 keeps
    # the train split at 4+ shards for any of them
    cfg = text_cfg(corpus, shard_tokens=150, num_workers=1)
    many = prepare_dataset(cfg, tok, tmp_path / "b", progress=False)
    assert one.dir.name == many.dir.name  # same fingerprint: neither setting shapes the tokens
    assert [len(one.meta["shards"][s]) for s in ("train", "val")] == [1, 1]
    assert len(many.meta["shards"]["train"]) > 3
    for split in ("train", "val"):
        assert np.array_equal(split_tokens(one, split), split_tokens(many, split))


def test_cache_reuses_unchanged_and_refreshes_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = make_corpus(tmp_path / "corpus")
    cache = tmp_path / "cache"
    tok = TokenizerConfig(kind="bpe", vocab_size=300)
    first = prepare_dataset(text_cfg(corpus), tok, cache, progress=False)

    def no_rebuild(*args, **kwargs):
        raise AssertionError("an unchanged dataset was rebuilt")

    with monkeypatch.context() as m:
        m.setattr(prepare_module, "build_tokenizer", no_rebuild)
        again = prepare_dataset(text_cfg(corpus, num_workers=1, shard_tokens=100), tok, cache,
                                progress=False)  # files and speed, not tokens: the same dataset
    assert again.dir == first.dir

    bigger_vocab = prepare_dataset(text_cfg(corpus), TokenizerConfig(kind="bpe", vocab_size=310), cache,
                                   progress=False)
    (corpus / "doc0.txt").write_text("changed content\n" * 20)
    edited = prepare_dataset(text_cfg(corpus), tok, cache, progress=False)
    folders = {first.dir, bigger_vocab.dir, edited.dir}
    assert len(folders) == 3 and set(cache.iterdir()) == folders  # and no temporary folders left


def test_large_vocabularies_use_uint32(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A byte-level encoding whose special token sits at 70000, as in tiktoken's big named encodings.
    big = tiktoken.Encoding("big", pat_str=r"\s+|\S+", mergeable_ranks={bytes([b]): b for b in range(256)},
                            special_tokens={EOT: 70_000})
    fake = TiktokenTokenizer("cl100k", big)
    monkeypatch.setattr(prepare_module, "build_tokenizer", lambda cfg, texts: fake)
    corpus = make_corpus(tmp_path / "corpus", n_files=3)
    tok_cfg = TokenizerConfig(kind="cl100k")
    prepared = prepare_dataset(text_cfg(corpus), tok_cfg, tmp_path / "cache", progress=False)
    assert prepared.meta["dtype"] == "uint32" and prepared.vocab_size == 70_001
    tokens = split_tokens(prepared, "train")
    assert tokens.dtype == np.dtype("<u4") and prepared.meta["shards"]["train"][0]["bytes"] == 4 * len(tokens)
    assert tokens[0] == 70_000 and len(tokens) == prepared.meta["tokens"]["train"]
    assert decode_split(prepared, "train") == expected_split_text(prepared.meta, "train", corpus)


def test_interrupted_prepare_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = make_corpus(tmp_path / "corpus")
    cache = tmp_path / "cache"

    def crash(tagged_docs, tokenizer, tokenizer_dir, writers, **kwargs):
        writers["train"].write(np.zeros(10, dtype=np.uint16))  # a half-written shard...
        raise KeyboardInterrupt  # ...then the user presses Ctrl-C

    monkeypatch.setattr(prepare_module, "encode_corpus", crash)
    with pytest.raises(KeyboardInterrupt):
        prepare_dataset(text_cfg(corpus), TokenizerConfig(kind="byte"), cache, progress=False)
    assert list(cache.iterdir()) == []


@pytest.mark.parametrize(
    ("files", "paths", "message"),
    [
        ({"a.txt": b"", "b.txt": b""}, ["."], "no non-empty documents"),
        ({"a.txt": b"fine\n", "bad.txt": b"\xff\xfe\n"}, ["."], r"bad\.txt is not UTF-8"),
        ({"a.txt": b"fine\n"}, ["*.md"], "matched nothing"),
    ],
)
def test_bad_corpora_fail_clearly_and_leave_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict, paths: list[str], message: str
) -> None:
    (tmp_path / "corpus").mkdir()
    for name, content in files.items():
        (tmp_path / "corpus" / name).write_bytes(content)
    monkeypatch.chdir(tmp_path / "corpus")
    cfg = DataConfig(source="text", paths=paths)
    with pytest.raises(UserError, match=message):
        prepare_dataset(cfg, TokenizerConfig(kind="byte"), tmp_path / "cache", progress=False)
    assert not (tmp_path / "cache").exists() or list((tmp_path / "cache").iterdir()) == []


def test_real_pystdlib_subset(tmp_path: Path) -> None:
    """The one test on the real default corpus; the size cap keeps it to a few hundred small files."""
    cfg = DataConfig(max_file_bytes=1_500)
    prepared = prepare_dataset(cfg, TokenizerConfig(kind="bpe", vocab_size=300), tmp_path, progress=False)
    meta = prepared.meta
    from minigpt.data.sources import pystdlib_root

    root = pystdlib_root()
    train, val = ({f["name"] for f in meta["files"][split]} for split in ("train", "val"))
    assert len(train) > 20 and val and not train & val
    for name in train | val:  # only .py files, none from test suites, IDLE, site-packages, ...
        assert name.endswith(".py") and not set(Path(name).parts[:-1]) & set(cfg.exclude), name
    expected = "".join(EOT + (root / f["name"]).read_text(encoding="utf-8") for f in meta["files"]["val"])
    assert decode_split(prepared, "val") == expected
    assert load_prepared(prepared.dir).meta == meta


@pytest.mark.slow
def test_prepare_script_succeeds_then_fails_in_one_line(tmp_path: Path) -> None:
    """One interpreter start for both paths: a two-job multirun whose second job names a missing path."""
    corpus = make_corpus(tmp_path / "corpus", n_files=4)
    args = ["-m", f"data.paths=[{corpus}],[nowhere]", "data=text", "tokenizer=byte",
            f"data.cache_dir={tmp_path}/cache", f"hydra.sweep.dir={tmp_path}/multirun"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "prepare_data.py"), *args],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    (folder,) = (tmp_path / "cache").iterdir()  # the first job's dataset, and nothing from the second
    assert f"prepared:  {tmp_path}/cache/{folder.name}" in run.stdout, run.stdout + run.stderr
    assert json.loads((folder / "meta.json").read_text())["tokenizer"]["kind"] == "byte"
    assert run.returncode == 2
    expected = "error: data.paths entry 'nowhere' does not exist; give a file, folder or glob"
    assert run.stderr.strip() == expected


@pytest.mark.parametrize(  # every option of both groups at least once (composing costs ~0.3 s)
    ("data", "tokenizer"),
    [("pystdlib", "bpe"), ("shakespeare", "char"), ("text", "byte"), ("pystdlib", "gpt2"),
     ("text", "cl100k"), ("files", "bpe")],
)
def test_every_data_and_tokenizer_preset_composes(data: str, tokenizer: str) -> None:
    from hydra import compose, initialize_config_dir

    from minigpt.cli import to_object
    from minigpt.config import PrepareConfig, register_configs

    register_configs()
    overrides = [f"data={data}", f"tokenizer={tokenizer}"]
    if data in ("text", "files"):
        overrides.append("data.paths=[notes]")
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "configs")):
        cfg = to_object(compose(config_name="prepare", overrides=overrides), PrepareConfig)
    assert (cfg.data.source, cfg.tokenizer.kind) == (data, tokenizer)
    assert cfg.data.cache_dir == "outputs/data"
    if data in ("text", "files"):  # data.extensions: null means the source's own list
        assert cfg.data.extensions is None and cfg.data.file_extensions() == DEFAULT_EXTENSIONS[data]
