"""Corpus sources: pystdlib selection, the by-file split, user text paths, and tiny-shakespeare's download."""

from __future__ import annotations

import hashlib
import io
import random
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from minigpt.data import sources
from minigpt.data.config import DataConfig
from minigpt.data.sources import Document, read_pystdlib, read_shakespeare, read_text_paths, split_documents
from minigpt.errors import UserError


def _write(root: Path, files: dict[str, str | bytes]) -> None:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))


def test_pystdlib_selects_sorted_py_files_and_skips_excluded(tmp_path: Path) -> None:
    _write(tmp_path, {
        "b.py": "b = 2\n",
        "a.py": "a = 1\n",
        "pkg/__init__.py": "",  # empty: nothing to learn
        "pkg/mod.py": "x = 'é'\n",
        "pkg/tests/test_mod.py": "assert True\n",
        "test/regrtest.py": "pass\n",
        "idlelib/editor.py": "pass\n",
        "site-packages/numpy/core.py": "pass\n",
        "notes.txt": "not python\n",
        "huge.py": "#" * 500 + "\n",
        "latin1.py": b"s = '\xe9'\n",  # not UTF-8
    })
    docs = read_pystdlib(DataConfig(max_file_bytes=400), root=tmp_path)
    assert [d.name for d in docs] == ["a.py", "b.py", "pkg/mod.py"]
    assert docs[2].text == "x = 'é'\n"


def _docs(n: int) -> list[Document]:
    return [Document(f"dir{i % 3}/file{i}.py", f"text {i}\n") for i in range(n)]


def test_split_by_file_depends_on_each_name_alone() -> None:
    """A file's side is a function of its name: not of the order, the contents or the other files; it is
    spread evenly (not by directory or by name order), and the share of val files is val_ratio."""
    docs = _docs(2000)
    corpus = split_documents(docs, 0.1)
    val = {d.name for d in corpus.val}
    assert [d.name for d in corpus.train] == [d.name for d in docs if d.name not in val]  # the corpus' order
    assert [d.name for d in corpus.val] == [d.name for d in docs if d.name in val]
    assert 133 <= len(val) <= 267  # Binomial(2000, 0.1): 200 +- 5 standard deviations (13.4)
    shuffled = random.Random(0).sample(docs, len(docs))
    rewritten = [Document(d.name, d.text * 3 + "other contents\n") for d in shuffled]
    assert {d.name for d in split_documents(rewritten, 0.1).val} == val
    more = split_documents(docs + [Document(f"new{i}.py", "n\n") for i in range(500)], 0.1)
    assert val <= {d.name for d in more.val}  # adding files never moves one to the other side...
    fewer = split_documents(docs[::2], 0.1)
    assert {d.name for d in fewer.val} == val & {d.name for d in docs[::2]}  # ...nor does removing some
    assert val <= {d.name for d in split_documents(docs, 0.3).val}  # a larger ratio only adds val files
    names = sorted(d.name for d in docs)
    for start in range(0, 2000, 400):  # every stretch of the name order gets its share (~40 +- 6)
        assert 10 <= len(val & set(names[start:start + 400])) <= 70, start
    for folder in ("dir0/", "dir1/", "dir2/"):  # and every directory (~67 +- 8)
        assert 25 <= sum(name.startswith(folder) for name in val) <= 110, folder


def test_split_keeps_both_sides_non_empty_with_few_files() -> None:
    for n in (2, 3, 5):
        corpus = split_documents(_docs(n), 0.05)
        assert corpus.val and corpus.train
        assert sorted(d.name for d in corpus.train + corpus.val) == sorted(d.name for d in _docs(n))


def test_single_document_is_split_by_its_tail_on_a_line_start() -> None:
    text = "".join(f"line {i}\n" for i in range(100))
    corpus = split_documents([Document("one.txt", text)], 0.1)
    (train,), (val,) = corpus.train, corpus.val
    assert train.text + val.text == text
    assert train.text.endswith("\n") and val.text.startswith("line ")
    assert 0.05 < len(val.text) / len(text) < 0.15
    with pytest.raises(UserError, match="too short"):
        split_documents([Document("tiny.txt", "x")], 0.1)


def test_text_paths_folders_globs_and_named_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, {
        "notes/a.md": "alpha\n",
        "notes/sub/b.txt": "beta\n",
        "notes/sub/skip.bin": "zzz\n",
        "notes/.hidden/c.txt": "hidden\n",
        "code/x.py": "x = 1\n",
        "code/y.py": "y = 2\n",
        "single.rst": "named\n",
    })
    cfg = DataConfig(source="text", paths=["notes", "code/*.py", "single.rst"], extensions=[".txt", ".md"])
    names = [d.name for d in read_text_paths(cfg)]
    # globs obey the extension filter too, so code/*.py adds nothing; a named file always counts
    assert names == ["notes/a.md", "notes/sub/b.txt", "single.rst"]
    cfg = DataConfig(source="text", paths=["code/*.py", "notes/**/*.txt"], extensions=[])
    assert [d.name for d in read_text_paths(cfg)] == ["code/x.py", "code/y.py", "notes/sub/b.txt"]


@pytest.mark.parametrize(
    ("paths", "message"),
    [
        (["missing_folder"], "does not exist"),
        (["*.nothing"], "matched nothing"),
        (["empty_dir"], "contains no files ending in"),
    ],
)
def test_text_paths_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, paths: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(UserError, match=message) as err:
        read_text_paths(DataConfig(source="text", paths=paths))
    assert "\n" not in str(err.value)


def test_undecodable_file_is_named_or_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, {"good.txt": "fine\n", "bad.txt": b"ok \xff\xfe bytes\n"})
    with pytest.raises(UserError, match=r"bad\.txt is not UTF-8.*encoding_errors=replace"):
        read_text_paths(DataConfig(source="text", paths=["."]))
    docs = read_text_paths(DataConfig(source="text", paths=["."], encoding_errors="replace"))
    assert [d.text for d in docs] == ["ok \ufffd\ufffd bytes\n", "fine\n"]


def test_data_config_validation() -> None:
    with pytest.raises(UserError, match="data.paths"):
        DataConfig(source="text")
    with pytest.raises(UserError, match="data.source='books'"):
        DataConfig(source="books")
    with pytest.raises(UserError, match="data.val_ratio"):
        DataConfig(val_ratio=1.0)
    with pytest.raises(UserError, match="data.extensions"):
        DataConfig(extensions=["txt"])
    with pytest.raises(UserError, match=r"data=files needs data.paths"):
        DataConfig(source="files")
    bad_values = [({"num_workers": -1}, "data.num_workers=-1"), ({"shard_tokens": 0}, "data.shard_tokens=0"),
                  ({"verify": "never"}, "data.verify='never'"), ({"text_key": ""}, "data.text_key is empty")]
    for bad, key in bad_values:
        with pytest.raises(UserError, match=key):
            DataConfig(**bad)


# -- tiny-shakespeare: never the real network -------------------------------------------------------


def _offline(*args, **kwargs):
    raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")


def test_shakespeare_offline_is_one_line_naming_the_alternatives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(urllib.request, "urlopen", _offline)
    with pytest.raises(UserError) as err:
        read_shakespeare(DataConfig(source="shakespeare"), tmp_path)
    message = str(err.value)
    assert "\n" not in message
    assert "data=pystdlib" in message and "data=text" in message and "could not download" in message
    assert not (tmp_path / "downloads" / sources.SHAKESPEARE_FILE).exists()


class _FakeResponse(io.BytesIO):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_shakespeare_downloads_once_verifies_and_caches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    payload = b"First Citizen:\nBefore we proceed any further, hear me speak.\n"
    calls = []

    def fake_urlopen(url, timeout):
        calls.append(url)
        return _FakeResponse(payload)

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    cfg = DataConfig(source="shakespeare")
    with pytest.raises(UserError, match="sha256"):  # the real pinned digest does not match our fake
        read_shakespeare(cfg, tmp_path)
    assert not (tmp_path / "downloads" / sources.SHAKESPEARE_FILE).exists()

    monkeypatch.setattr(sources, "SHAKESPEARE_SHA256", hashlib.sha256(payload).hexdigest())
    assert read_shakespeare(cfg, tmp_path) == payload.decode()
    assert read_shakespeare(cfg, tmp_path) == payload.decode()
    assert len(calls) == 2  # the rejected download and the good one; the third read came from the cache
    assert (tmp_path / "downloads" / sources.SHAKESPEARE_FILE).read_bytes() == payload
