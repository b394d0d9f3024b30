"""The afternoon path (README "Layout"): the files a newcomer reads first, in order, each with its line count.
The list must stay true and short: every file is there, each count is within 10% (and at least 10 lines) of
the file's real length, the stated total is the sum of the counts, and the real files add up to at most
3,000 lines -- an afternoon's reading."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import ROOT

LIMIT = 3000
SECTION = re.compile(r"^### The afternoon path\n(.*?)(?=^#)", re.M | re.S)
ROW = re.compile(r"^ {4}(\S+\.py) +(\d+)   ", re.M)
TOTAL = re.compile(r"^ {4} +([\d,]+)   in all$", re.M)


def _path(readme: str) -> tuple[list[tuple[str, int]], int]:
    """The section's rows (file, stated count) in order, and its stated total."""
    section = SECTION.search(readme)
    assert section, 'README has no "### The afternoon path" section'
    total = TOTAL.search(section.group(1))
    assert total, "the afternoon path states no total"
    return [(f, int(n)) for f, n in ROW.findall(section.group(1))], int(total.group(1).replace(",", ""))


def _wrong(rows: list[tuple[str, int]], total: int, root: Path) -> list[str]:
    """What is not true of the list: a missing file, a count off by more than the tolerance, a wrong sum."""
    wrong = [f"{f} is not there" for f, _ in rows if not (root / f).is_file()]
    for f, stated in rows:
        if (root / f).is_file():
            real = len((root / f).read_text(encoding="utf-8").splitlines())
            if abs(real - stated) > max(10, real // 10):
                wrong.append(f"{f} has {real} lines, the README says {stated}")
    if sum(n for _, n in rows) != total:
        wrong.append(f"the counts add up to {sum(n for _, n in rows)}, the README says {total}")
    return wrong


def test_the_afternoon_path_is_true_and_at_most_3000_lines() -> None:
    rows, total = _path((ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(rows) >= 10, rows  # the model, decoding and the loop at least
    assert len({f for f, _ in rows}) == len(rows), "a file is listed twice"
    wrong = _wrong(rows, total, ROOT)
    assert not wrong, wrong
    real = sum(len((ROOT / f).read_text(encoding="utf-8").splitlines()) for f, _ in rows)
    assert real <= LIMIT, f"the afternoon path is {real} lines, over {LIMIT}"


def test_the_check_sees_a_missing_file_a_stale_count_and_a_wrong_sum(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n" * 100)
    readme = ("### The afternoon path\n\n    a.py    89   a file\n    gone.py   5   gone\n"
              "            100   in all\n\n## Next\n")
    rows, total = _path(readme)
    assert rows == [("a.py", 89), ("gone.py", 5)] and total == 100
    assert _wrong(rows, total, tmp_path) == ["gone.py is not there", "a.py has 100 lines, the README says 89",
                                             "the counts add up to 94, the README says 100"]
    assert _wrong([("a.py", 91)], 91, tmp_path) == []  # within 10%
