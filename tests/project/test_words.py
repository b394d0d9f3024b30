"""The project speaks only of itself: no words that point at things a reader of the repository cannot open.

A reader has the README, docs/, the code, the configs and the tests. Paths outside the repository, issue
numbers, "the notes" a design was argued from, the machine a change was made on ("this VM"), the tools
and sessions of whoever wrote it: each of these points at something the reader does not have. This test
reads every text file of those places (this file excepted: its list is the only place the words may
appear) and fails on each occurrence, naming the file, the line and what to write instead.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import ROOT

PLACES = ("README.md", "Makefile", "docs", "minigpt", "scripts", "tests", "configs")
TEXT_SUFFIXES = {".md", ".py", ".yaml", ".yml", ".txt", ".json", ".sh", ".toml", ""}

# pattern (case-insensitive) -> what to write instead
OUTSIDE_WORDS = {
    r"\.\./shared|/work/|shared/tools": "a path inside the repository, or none",
    r"fresh-clone-check|farm-studio": "the project's own command (make ..., scripts/...)",
    r"\bissue\s*#?\d+|\b(the|this|that) issue\b|\bissue's\b":
        "what the change does, not where it was asked for",
    r"\b(this|the|a|our) (shared )?VM\b|\bshared VM\b": "the machine by CPU model and cores",
    r"\bdevice tool\b|\btool library\b": "what the step does, in the project's terms",
    r"\bthe notes\b|\breference notes\b|\bnotes'|\bthe notes say\b": "the claim, in the project's own words",
    # an interactive session of the generate command is the project's own
    r"(?<!interactive )\bsessions\b|\b(this|another|a previous|an earlier) session\b|\bfiled by\b":
        "the run, the step or the test",
    r"\bbriefs?\b|\bcolleagues?\b|\bthe lead\b": "nothing: the project does not know who wrote it",
}
PATTERN = re.compile("|".join(f"(?:{p})" for p in OUTSIDE_WORDS), re.IGNORECASE)


def project_text_files() -> list[Path]:
    files = []
    for place in PLACES:
        path = ROOT / place
        found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        files += [p for p in found if p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts]
    return [p for p in files if p.resolve() != Path(__file__).resolve()]


def advice(word: str) -> str:
    fixes = (fix for pattern, fix in OUTSIDE_WORDS.items() if re.fullmatch(pattern, word, re.IGNORECASE))
    return next(fixes, "the same thing in the project's own terms")


def test_the_project_speaks_only_of_itself():
    hits = []
    for path in project_text_files():
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for match in PATTERN.finditer(line):
                where = f"{path.relative_to(ROOT)}:{number}"
                hits.append(f"{where}: {match.group()!r} -> {advice(match.group())}")
    assert not hits, "words that point outside the project:\n" + "\n".join(hits)


@pytest.mark.parametrize("text", [
    "see ../shared/tools/fresh-clone-check", "fixed in issue 7", "as the issue asks", "on this shared VM",
    "carry it with the device tool", "the reference notes derive it", "what the notes' example says",
    "filed by a session", "as the brief says", "over all sessions of a run",
])
def test_each_kind_of_outside_word_is_caught(text: str):
    assert PATTERN.search(text), text


@pytest.mark.parametrize("text", [
    "an interactive session keeps its cache", "a session's reply", "Interactive sessions: the cache",
    "every notes/*.md file", "LLVM", "issue a warning", "docs/design.md states the claim",
])
def test_the_project_own_words_pass(text: str):
    assert not PATTERN.search(text), text
