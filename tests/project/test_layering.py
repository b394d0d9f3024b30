"""The import layering of README's Layout section, checked on the source with `ast` (nothing is imported).

Every module of `minigpt/` belongs to one line of LAYERS; it may import only modules of lower lines, or of its
own package. Imports inside functions count as much as those at the top: a lazy import is still a dependency.
No two modules may import each other, directly or through a cycle, even inside one package.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGE = ROOT / "minigpt"

# Lowest line first; `|` in the README means "same line, may not import each other".
LAYERS = (
    ("errors", "signals"),
    ("data", "model", "device"),
    ("checkpoint", "sampling"),
    ("fast",),
    ("interop",),
    ("inspect",),
    ("cluster",),
    ("training", "generation"),
    ("runs",),
    ("lab",),
    ("config", "cli"),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_package(module: str) -> str:
    """minigpt.training.trainer -> training; minigpt.config -> config; minigpt -> ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_of(module: str) -> int:
    top = top_package(module)
    for i, line in enumerate(LAYERS):
        if top in line:
            return i
    raise AssertionError(f"{module} is in no line of LAYERS; add its package to the layering")


def imports_of(path: Path) -> set[str]:
    """Every minigpt module `path` imports, wherever the import statement is."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("minigpt")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("minigpt"):
            found.add(node.module)
            # `from minigpt.training import checkpoint` imports the module minigpt.checkpoint.format
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                if (PACKAGE.parent / Path(*candidate.split("."))).with_suffix(".py").is_file():
                    found.add(candidate)
    return found


def import_graph() -> dict[str, set[str]]:
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        graph[module_name(path)] = imports_of(path)
    return graph


def test_every_import_goes_down_a_line_or_stays_in_its_package():
    graph = import_graph()
    bad = []
    for module, targets in graph.items():
        if module == "minigpt":
            continue
        for target in targets:
            if target == "minigpt":
                continue
            same_package = top_package(target) == top_package(module)
            if not same_package and layer_of(target) >= layer_of(module):
                bad.append(f"{module} -> {target}")
    assert not bad, "imports that go up or sideways:\n" + "\n".join(sorted(bad))


def test_no_import_cycles():
    graph = import_graph()
    known = set(graph)
    edges = {m: {t for t in ts if t in known and t != m} for m, ts in graph.items()}
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_layering_test_sees_a_violation(tmp_path):
    """The checker itself: an upward import written in a real file is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from minigpt.training.trainer import train\n")
    assert "minigpt.training.trainer" in imports_of(bad)
    assert layer_of("minigpt.training.trainer") > layer_of("minigpt.model.gpt")


@pytest.mark.slow
def test_importing_the_config_schemas_does_not_import_torch():
    code = "import sys, minigpt.config; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", "minigpt.config pulled in torch: " + out.stderr[-500:]


HYDRA_SCRIPTS = (
    "train", "generate", "prepare_data", "evaluate", "temperature", "attention_maps", "shape_walk", "bench",
    "loss_curves", "pe_plots", "export", "import_hf", "tricks_report", "decoding_doc", "update_docs",
)


@pytest.mark.slow
def test_help_and_cfg_job_of_every_script_do_not_import_torch():
    """`--cfg job` answers in well under a second: composing a config needs no torch."""
    runs = [(s, "--cfg") for s in HYDRA_SCRIPTS]
    code = f"""
import contextlib, io, runpy, sys
for script, flag in {runs!r}:
    sys.argv = [f"scripts/{{script}}.py", flag, "job"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        runpy.run_path(sys.argv[0], run_name="__main__")
    if "torch" in sys.modules:
        print("torch imported by", script, flag)
        break
else:
    print("no torch")
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1:] == ["no torch"], out.stdout + out.stderr[-2000:]
