"""data=files: parquet / jsonl / txt corpora streamed into many shards, decoded back to the exact input text.

Every document carries a unique id, so the decoded splits can be matched to the input without
re-implementing the split rule: train and val must each be the input documents in input order, together
all of them, with nothing shared.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import sys
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from minigpt.data import encode as encode_module
from minigpt.data import streaming
from minigpt.data.config import DataConfig, TokenizerConfig
from minigpt.data.prepare import prepare_dataset
from minigpt.data.tokenizers import EOT
from minigpt.errors import UserError

WORDS = ["alpha", "beta", "gamma", "héllo", "naïve", "✓", "🐍", "日本語", "x = 1", "\n", "  ", "\t"]


def make_texts(n: int, seed: int, start_id: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [f"doc {start_id + k}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40))) + "\n"
            for k in range(n)]


def write_jsonl(path: Path, texts: list[str], *, gz: bool = False) -> None:
    lines = [json.dumps({"id": i, "text": t, "meta": {"n": len(t)}}, ensure_ascii=i % 2 == 0) for i, t in
             enumerate(texts)]
    data = ("\n".join(lines) + "\n").encode("utf-8")
    path.write_bytes(gzip.compress(data) if gz else data)


def write_parquet(path: Path, texts: list[str]) -> None:
    table = pa.table({"id": list(range(len(texts))), "text": texts})
    pq.write_table(table, path, row_group_size=37)  # several row groups, unaligned with the read batches


def write_corpus(folder: Path, fmt: str, n_files: int = 3, per_file: int = 120, first_id: int = 0
                 ) -> list[str]:
    """`n_files` files of `fmt`; returns every document's text in corpus (sorted file, then row) order."""
    folder.mkdir(parents=True, exist_ok=True)
    texts: list[str] = []
    for i in range(n_files):
        start = first_id + i * per_file
        part = make_texts(per_file, seed=start, start_id=start)
        if fmt == "txt":
            part = ["".join(part)]  # a text file is one document
            (folder / f"part{i:02d}.txt").write_text(part[0], encoding="utf-8")
        elif fmt == "parquet":
            write_parquet(folder / f"part{i:02d}.parquet", part)
        else:
            write_jsonl(folder / f"part{i:02d}.{fmt}", part, gz=fmt == "jsonl.gz")
        texts += part
    return texts


def files_cfg(paths: list[str], **kw) -> DataConfig:
    return DataConfig(source="files", paths=paths, **{"val_ratio": 0.2, "shard_tokens": 1500, **kw})


def decoded_docs(prepared, split: str) -> list[str]:
    tokens = prepared.split(split).read(0, len(prepared.split(split)))
    text = prepared.tokenizer.decode(tokens.tolist())
    assert text.startswith(EOT)
    return text[len(EOT):].split(EOT)


def check_exact_split(prepared, texts: list[str]) -> None:
    """train and val are the input documents in input order, disjoint, together all of them."""
    index = {t: i for i, t in enumerate(texts)}
    assert len(index) == len(texts)  # unique documents, so each decoded one has one place
    got = {split: [index[d] for d in decoded_docs(prepared, split)] for split in ("train", "val")}
    for split, order in got.items():
        assert order == sorted(order) and order, split
        assert prepared.meta["documents"][split] == len(order)
    assert sorted(got["train"] + got["val"]) == list(range(len(texts)))


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "txt", "jsonl.gz"])
def test_each_format_streams_into_many_shards_and_decodes_exactly(tmp_path: Path, fmt: str) -> None:
    n_files = 12 if fmt == "txt" else 3  # txt: one document per file, so more files for both splits
    texts = write_corpus(tmp_path / "corpus", fmt, n_files=n_files)
    prepared = prepare_dataset(files_cfg([str(tmp_path / "corpus")]), TokenizerConfig(kind="byte"),
                               tmp_path / "cache", progress=False)
    assert len(prepared.meta["shards"]["train"]) >= 5 and prepared.dir.name.startswith("files-byte-")
    check_exact_split(prepared, texts)
    names = sorted(p.name for p in (tmp_path / "corpus").iterdir())
    assert [s["name"] for s in prepared.meta["sources"]] == names
    assert sum(prepared.meta["bytes"].values()) == sum(len(t.encode("utf-8")) for t in texts)


def test_mixed_formats_with_bpe_and_a_glob(tmp_path: Path) -> None:
    texts = []
    for k, fmt in enumerate(("jsonl", "parquet", "txt")):
        texts += write_corpus(tmp_path / "corpus" / fmt, fmt, n_files=2, per_file=80, first_id=1000 * k)
    (tmp_path / "corpus" / "notes.md").write_text("not matched by the glob\n")
    cfg = files_cfg([str(tmp_path / "corpus" / "**" / "*")], val_ratio=0.3)
    prepared = prepare_dataset(cfg, TokenizerConfig(kind="bpe", vocab_size=400), tmp_path / "cache",
                               progress=False)
    # the glob's own order: folders sorted, so jsonl/, parquet/, txt/
    assert [s["name"] for s in prepared.meta["sources"]][:2] == ["jsonl/part00.jsonl", "jsonl/part01.jsonl"]
    check_exact_split(prepared, texts)


def test_split_is_by_document_stable_and_independent_of_the_folder(tmp_path: Path) -> None:
    texts = write_corpus(tmp_path / "a", "jsonl", n_files=2, per_file=1000)
    byte = TokenizerConfig(kind="byte")

    def ten_percent(folder: str) -> DataConfig:
        return files_cfg([str(tmp_path / folder)], val_ratio=0.1)

    first = prepare_dataset(ten_percent("a"), byte, tmp_path / "c1", progress=False)
    val = set(decoded_docs(first, "val"))
    assert 130 < len(val) < 270  # ~Binomial(2000, 0.1): mean 200, sd 13; both files contribute
    assert {d.split(":")[0] for d in val} & {f"doc {i}" for i in range(1000)}
    assert {d.split(":")[0] for d in val} & {f"doc {i}" for i in range(1000, 2000)}

    # The same files in another folder (a node-local copy, with new mtimes): the same split and tokens.
    (tmp_path / "b").mkdir()
    for p in (tmp_path / "a").iterdir():
        (tmp_path / "b" / p.name).write_bytes(p.read_bytes())
    moved = prepare_dataset(ten_percent("b"), byte, tmp_path / "c2", progress=False)
    for split in ("train", "val"):
        assert decoded_docs(moved, split) == decoded_docs(first, split)

    # A new file sorted first: no existing document changes side.
    write_jsonl(tmp_path / "a" / "aaa_new.jsonl", make_texts(300, seed=9, start_id=5000))
    grown = prepare_dataset(ten_percent("a"), byte, tmp_path / "c3", progress=False)
    grown_val = set(decoded_docs(grown, "val"))
    assert val <= grown_val and not (grown_val - val) & set(texts)


def test_reuse_needs_no_pass_over_the_content_and_a_touched_file_rebuilds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_corpus(tmp_path / "corpus", "jsonl")
    cfg, byte = files_cfg([str(tmp_path / "corpus")]), TokenizerConfig(kind="byte")
    first = prepare_dataset(cfg, byte, tmp_path / "cache", progress=False)

    def unread(*args, **kwargs):
        raise AssertionError("the corpus was read to reuse its cache")

    with monkeypatch.context() as m:
        m.setattr(streaming, "_jsonl_texts", unread)
        assert prepare_dataset(cfg, byte, tmp_path / "cache", progress=False).dir == first.dir
    path = tmp_path / "corpus" / "part01.jsonl"
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # same bytes, newer mtime
    assert prepare_dataset(cfg, byte, tmp_path / "cache", progress=False).dir != first.dir


@pytest.mark.slow
def test_worker_processes_give_the_same_shards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    texts = write_corpus(tmp_path / "corpus", "jsonl")
    tok = TokenizerConfig(kind="bpe", vocab_size=300)
    alone = prepare_dataset(files_cfg([str(tmp_path / "corpus")], num_workers=1), tok, tmp_path / "c1",
                            progress=False)
    started = []

    class CountingPool(encode_module.ProcessPoolExecutor):
        def __init__(self, *args, **kwargs):
            started.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(encode_module, "ProcessPoolExecutor", CountingPool)
    monkeypatch.setattr(encode_module, "POOL_MIN_CHARS", 0)  # start the pool at once...
    monkeypatch.setattr(encode_module, "ENCODE_CHUNK_CHARS", 3000)  # ...and give it many chunks
    pooled = prepare_dataset(files_cfg([str(tmp_path / "corpus")], num_workers=2), tok, tmp_path / "c2",
                             progress=False)
    assert started == [2]
    assert pooled.meta["shards"] == alone.meta["shards"]  # same files, byte for byte (sha256)
    check_exact_split(pooled, texts)


def test_memory_stays_bounded_while_streaming(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_corpus(tmp_path / "corpus", "jsonl", n_files=4, per_file=3000)
    corpus_bytes = sum(p.stat().st_size for p in (tmp_path / "corpus").iterdir())
    assert corpus_bytes > 2_000_000
    monkeypatch.setattr(encode_module, "ENCODE_CHUNK_CHARS", 10_000)
    tracemalloc.start()
    try:
        prepared = prepare_dataset(files_cfg([str(tmp_path / "corpus")], num_workers=1, shard_tokens=200_000),
                                   TokenizerConfig(kind="byte"), tmp_path / "cache", progress=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sum(prepared.meta["tokens"].values()) > 1_000_000
    assert peak < corpus_bytes / 4, f"peak {peak:,} bytes of Python memory for a {corpus_bytes:,}-byte corpus"


def _with_bad_file(tmp_path: Path, name: str, data: bytes) -> Path:
    """A corpus folder of one good jsonl file and `name` holding `data`."""
    folder = tmp_path / "corpus"
    folder.mkdir(exist_ok=True)
    write_jsonl(folder / "good.jsonl", make_texts(50, seed=1))
    (folder / name).write_bytes(data)
    return folder


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.jsonl", b'{"text": "ok"}\n{"body": "x", "id": 3}\n',
         r"bad\.jsonl line 2 has no 'text' field \(it has: body, id\).*data.text_key"),
        ("bad.jsonl", b'{"text": "ok"}\n{"text": "cut\n', r"bad\.jsonl line 2 is not JSON"),
        ("bad.jsonl", b'["a list"]\n', r"bad\.jsonl line 1 is a JSON list"),
        ("bad.jsonl", b'{"text": 12}\n', r"field 'text' is a int, not text"),
        ("bad.jsonl", b'{"text": "ok"}\n{"text": "caf\xe9"}\n',
         r"bad\.jsonl line 2 is not UTF-8.*encoding_errors=replace"),
        # mtime=0: the same bytes, and so the same test id, whenever (and on whichever worker) it is collected
        ("bad.jsonl.gz", gzip.compress(b'{"text": "ok"}\n' * 100, mtime=0)[:-20],
         r"bad\.jsonl\.gz cannot be read"),
        ("bad.parquet", b"PAR1 not really parquet", r"bad\.parquet is not a readable parquet file"),
    ],
)
def test_bad_files_fail_in_one_line_and_leave_nothing(tmp_path: Path, name: str, content: bytes, message: str
                                                      ) -> None:
    folder = _with_bad_file(tmp_path, name, content)
    with pytest.raises(UserError, match=message) as err:
        prepare_dataset(files_cfg([str(folder)]), TokenizerConfig(kind="byte"), tmp_path / "cache",
                        progress=False)
    assert "\n" not in str(err.value)
    assert list((tmp_path / "cache").iterdir()) == []


def test_parquet_columns_are_checked(tmp_path: Path) -> None:
    folder = tmp_path / "corpus"
    folder.mkdir()
    pq.write_table(pa.table({"content": ["a", "b"], "n": [1, 2]}), folder / "x.parquet")
    byte = TokenizerConfig(kind="byte")
    with pytest.raises(UserError, match=r"has no column 'text' \(it has: content, n\).*data.text_key"):
        prepare_dataset(files_cfg([str(folder)]), byte, tmp_path / "cache", progress=False)
    with pytest.raises(UserError, match=r"column 'n' holds int64, not text"):
        prepare_dataset(files_cfg([str(folder)], text_key="n"), byte, tmp_path / "cache", progress=False)


def test_replace_mode_reads_bad_bytes_and_missing_pyarrow_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _with_bad_file(tmp_path, "latin1.jsonl", b'{"text": "caf\xe9 au lait"}\n' * 30)
    cfg = files_cfg([str(folder)], encoding_errors="replace", val_ratio=0.5)
    prepared = prepare_dataset(cfg, TokenizerConfig(kind="byte"), tmp_path / "cache", progress=False)
    assert "caf\ufffd au lait" in decoded_docs(prepared, "train") + decoded_docs(prepared, "val")

    pq.write_table(pa.table({"text": ["a"]}), folder / "x.parquet")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(UserError, match=r"x\.parquet needs pyarrow: pip install -e '\.\[data\]'"):
        prepare_dataset(cfg, TokenizerConfig(kind="byte"), tmp_path / "c2", progress=False)


def test_a_split_left_empty_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "one.jsonl").write_text(json.dumps({"text": "a single document"}) + "\n")
    with pytest.raises(UserError, match=r"no val documents with data.val_ratio=0.2; change data.val_ratio"):
        prepare_dataset(files_cfg([str(tmp_path / "one.jsonl")]), TokenizerConfig(kind="byte"),
                        tmp_path / "cache", progress=False)
    assert list((tmp_path / "cache").iterdir()) == []


def test_blank_lines_and_null_or_empty_texts_are_skipped(tmp_path: Path) -> None:
    texts = make_texts(200, seed=3)
    records = []
    for i, t in enumerate(texts):
        records.append(json.dumps({"text": t}))
        if i % 10 == 0:
            records += ["", json.dumps({"text": None}), json.dumps({"text": ""})]
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "x.jsonl").write_text("\n".join(records) + "\n")
    prepared = prepare_dataset(files_cfg([str(tmp_path / "c")]), TokenizerConfig(kind="byte"),
                               tmp_path / "cache", progress=False)
    check_exact_split(prepared, texts)


@pytest.mark.slow
def test_a_worker_that_cannot_start_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from minigpt.data.documents import Document
    from minigpt.data.shards import ShardWriter
    from minigpt.data.tokenizers import ByteTokenizer

    monkeypatch.setattr(encode_module, "POOL_MIN_CHARS", 0)
    docs = [("train", Document(f"d{i}", "some text\n" * 50)) for i in range(20)]
    writers = {"train": ShardWriter(tmp_path, "train", "uint16", 1000)}
    with pytest.raises(UserError, match=r"an encoding worker process died .*data.num_workers=1") as err:
        # the workers load the tokenizer from a folder that does not exist: every one of them dies
        encode_module.encode_corpus(docs, ByteTokenizer(), tmp_path / "no-tokenizer", writers, num_workers=2,
                                    progress=False)
    assert "\n" not in str(err.value)
