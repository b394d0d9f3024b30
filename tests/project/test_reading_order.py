"""Reading order as a contract: each package's `__init__.py` docstring names every file and folder the package
holds (README "Layout"), so a file added without its line there, or a line left for a file that is gone,
fails here. Which order is the reading order is the docstring's to say; that nothing is missing is this
test's."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGE = ROOT / "minigpt"
PACKAGES = sorted(p.parent for p in PACKAGE.rglob("__init__.py"))
# an indented line of a list that starts with a file or folder name: `    name.py   what it is`
LISTED = re.compile(r"^ {4,}([\w.]+\.py|\w+/)(?= )", re.M)


def _docstring(package: Path) -> str:
    tree = ast.parse((package / "__init__.py").read_text(encoding="utf-8"))
    return ast.get_docstring(tree, clean=False) or ""  # as written: a list's indentation kept


def _held(package: Path) -> list[str]:
    """The package's files and folders as its docstring names them: `name.py`, `folder/`."""
    files = [p.name for p in package.glob("*.py") if p.name != "__init__.py"]
    folders = [f"{p.name}/" for p in package.iterdir() if p.is_dir() and p.name != "__pycache__"]
    return sorted(files + folders)


def _names(doc: str, name: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", doc) is not None


@pytest.mark.parametrize("package", PACKAGES, ids=[str(p.relative_to(ROOT)) for p in PACKAGES])
def test_every_file_of_a_package_is_in_its_reading_list(package: Path) -> None:
    doc = _docstring(package)
    missing = [name for name in _held(package) if not _names(doc, name)]
    assert not missing, f"{package.relative_to(ROOT)}/__init__.py does not list {missing}"
    gone = [name for name in LISTED.findall(doc) if name not in _held(package)]
    assert not gone, f"{package.relative_to(ROOT)}/__init__.py lists {gone}, which it does not hold"


def test_the_check_sees_a_missing_and_a_stale_line(tmp_path: Path) -> None:
    (tmp_path / "__init__.py").write_text('"""Read in this order:\n    a.py   one\n    old.py   gone\n"""\n')
    (tmp_path / "a.py").write_text("")
    (tmp_path / "b.py").write_text("")
    doc = _docstring(tmp_path)
    assert [n for n in _held(tmp_path) if not _names(doc, n)] == ["b.py"]
    assert [n for n in LISTED.findall(doc) if n not in _held(tmp_path)] == ["old.py"]
    assert not _names("see minigpt/model/a.py.", "model.py") and _names("(a.py, b.py)", "b.py")
