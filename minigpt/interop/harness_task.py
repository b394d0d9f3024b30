"""The lm-evaluation-harness task shipped with minigpt: which line really comes next in a standard-library
function? It runs offline (the items travel with the project) and scores in seconds on a CPU.

Each item is the start of a function from the held-out (val) files of the default corpus, the Python standard
library, and four candidate next lines: the real one and three lines of the same indentation taken from other
functions of those files. lm-eval scores each candidate's log-likelihood after the context and counts the
items where the real line is the most likely (`acc`; `acc_norm` divides by the line's length in bytes first).
Picking at random scores 0.25; a model that has learned Python's shapes (indentation, what follows an `if`,
which names a function has defined) scores well above it.

    tasks/stdlib_next_line.yaml    the task (lm-eval reads it; `custom_dataset` is `stdlib_next_line` below)
    tasks/stdlib_next_line.jsonl   its items, built by `next_line_items` from the val split and frozen, so a
                                   score means the same on every machine whatever its Python version

The YAML names this module, and importing it registers the `minigpt` model of lm-eval (lm_eval_model.py): so
`lm_eval --model minigpt --tasks <this folder>/tasks/stdlib_next_line.yaml` finds the model.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable
from pathlib import Path

from minigpt.data.documents import Document
from minigpt.interop import lm_eval_model  # noqa: F401  registers `--model minigpt` (see the module docstring)

TASKS_DIR = Path(__file__).parent / "tasks"
TASK_NAME = "stdlib_next_line"
ITEMS_FILE = TASKS_DIR / f"{TASK_NAME}.jsonl"
N_CHOICES = 4
MAX_CONTEXT_LINES = 12  # a function's first lines: the context stays well inside a small model's window
MIN_LINE_CHARS = 12  # shorter lines (`else:`, `pass`) are too easy to guess from the indentation alone
DEF = re.compile(r"^(\s*)(async\s+)?def\s")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _functions(doc: Document) -> Iterable[tuple[str, list[str]]]:
    """(where, lines) of each function in `doc`: its def line and the body lines up to the first line
    indented no deeper than the def (blank lines kept)."""
    lines = doc.text.splitlines()
    for start, line in enumerate(lines):
        match = DEF.match(line)
        if not match:
            continue
        end = start + 1
        while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > len(match[1])):
            end += 1
        yield f"{doc.name}:{start + 1}", lines[start:end]


def _is_candidate(line: str) -> bool:
    stripped = line.strip()
    comment = stripped.startswith(("#", '"""', "'''"))
    return len(stripped) >= MIN_LINE_CHARS and not comment and "\t" not in line


def next_line_items(documents: Iterable[Document], n_items: int, seed: int = 0) -> list[dict]:
    """`n_items` items from `documents` (one per function, functions chosen at random with `seed`): the
    function's lines up to a chosen line as context, that line and three same-indentation lines of other
    functions as choices (each ending in a newline), and the index of the real one."""
    functions = [f for doc in documents for f in _functions(doc)]
    pool: dict[int, list[str]] = {}
    for _, lines in functions:
        for line in lines[1:]:
            if _is_candidate(line):
                pool.setdefault(_indent(line), []).append(line)
    rng = random.Random(seed)
    rng.shuffle(functions)
    items = []
    for where, lines in functions:
        targets = [i for i in range(1, min(len(lines), MAX_CONTEXT_LINES + 1)) if _is_candidate(lines[i])]
        if not targets:
            continue
        t = rng.choice(targets)
        own = set(lines)
        others = sorted({line for line in pool.get(_indent(lines[t]), []) if line not in own})
        if len(others) < N_CHOICES - 1:
            continue
        choices = [lines[t], *rng.sample(others, N_CHOICES - 1)]
        rng.shuffle(choices)
        items.append({"source": where, "context": "\n".join(lines[:t]) + "\n",
                      "choices": [c + "\n" for c in choices], "gold": choices.index(lines[t])})
        if len(items) == n_items:
            break
    return items


def write_items(items: list[dict], path: Path = ITEMS_FILE) -> None:
    path.write_text("".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items), encoding="utf-8")


def read_items(path: Path = ITEMS_FILE) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def stdlib_next_line(**_metadata) -> dict:
    """lm-eval's `custom_dataset`: the shipped items as a `datasets.Dataset` test split."""
    import datasets

    return {"test": datasets.Dataset.from_list(read_items())}
