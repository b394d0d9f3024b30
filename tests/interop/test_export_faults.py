"""Faults of the machine during an export, through the real `scripts/export.py`: a full disk, a file size
limit, a read-only destination and a second export to the same `out=`. Each ends with one line naming the
file and the cause, exit code 2, no traceback; every file that existed is unchanged, and neither the output,
nor its hidden temporary, nor a folder the export made is left behind.

Injected faults: RLIMIT_FSIZE in this process (every write past the limit fails with EFBIG; Python ignores
SIGXFSZ), a small or read-only tmpfs mounted in a user namespace around a real process (`unshare -rm`;
skipped where the kernel does not allow one), and a finished export put in place just before this one renames
its own (two real processes racing hit that moment only by chance).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import file_size_limit, run_script, snapshot
from conftest import ROOT
from interop_helpers import make_checkpoint

from minigpt.interop import staging

OUTS = {"hf": "hf", "gguf": "m.gguf"}  # format -> the name of what it writes
FILE_LIMIT = 64 * 1024  # far below the demo model's weights (4.6 MB in float32)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("export_faults") / "ckpt", "demo")[0]


def _one_line(code: int, err: str, out: str, *needles: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, (code, err[-3000:])
    assert "Traceback" not in err + out
    assert lines[0].startswith("error: ") and all(n in lines[0] for n in needles), lines[0]
    return lines[0]


def _destination(tmp_path: Path) -> Path:
    """A folder that already holds a file of the user's: the export must leave it as it was."""
    folder = tmp_path / "exports"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine\n")
    return folder


@pytest.mark.parametrize("fmt", list(OUTS))
def test_a_file_size_limit_stops_the_export_in_one_line_and_leaves_nothing(fmt, ckpt, tmp_path, capsys):
    folder = _destination(tmp_path)
    out = folder / "new" / "deeper" / OUTS[fmt]  # two folders the export has to make
    before = snapshot(tmp_path, ckpt)
    with file_size_limit(FILE_LIMIT):
        run = run_script("export", [f"checkpoint={ckpt}", f"format={fmt}", f"out={out}"], capsys)
    line = _one_line(run.code, run.err, run.out, f"nothing exported: cannot write {out}", "File too large",
                     "out=")
    assert ".tmp-" not in line  # the hidden temporary is not what the user asked for
    assert snapshot(tmp_path, ckpt) == before
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]  # no output, temporary or folder


@pytest.mark.parametrize("fmt", list(OUTS))
def test_an_export_that_loses_the_race_for_its_out_overwrites_nothing(fmt, ckpt, tmp_path, capsys,
                                                                      monkeypatch):
    """Another export of the same `out=` finishes while this one writes: this one is dropped, in one line."""
    folder = _destination(tmp_path)
    out, theirs = folder / OUTS[fmt], tmp_path / "theirs" / OUTS[fmt]
    assert run_script("export", [f"checkpoint={ckpt}", f"format={fmt}", f"out={theirs}"], capsys).code == 0
    publish = staging._publish

    def the_other_export_finishes_first(tmp: Path, target: Path) -> None:
        (shutil.copytree if theirs.is_dir() else shutil.copy2)(theirs, target)
        publish(tmp, target)

    monkeypatch.setattr(staging, "_publish", the_other_export_finishes_first)
    before = snapshot(ckpt)
    run = run_script("export", [f"checkpoint={ckpt}", f"format={fmt}", f"out={out}"], capsys)
    _one_line(run.code, run.err, run.out, f"{out} appeared while exporting", "nothing was overwritten")
    assert snapshot(ckpt) == before
    assert snapshot(out) == {str(p).replace(str(theirs), str(out)): d for p, d in snapshot(theirs).items()}
    assert sorted(p.name for p in folder.iterdir()) == sorted(["notes.txt", out.name])


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return env


def _export_cmd(ckpt: Path, fmt: str, out: Path) -> list[str]:
    return [sys.executable, str(ROOT / "scripts" / "export.py"), f"checkpoint={ckpt}", f"format={fmt}",
            f"out={out}"]


def _in_a_mounted_tmpfs(options: str, disk: Path, commands: list[list[str]]) -> list[tuple[int, str]]:
    """Run each command, one after the other, with a tmpfs mounted at `disk` (`options`: its mount options)
    in a user namespace of their own; (exit code, stderr) of each."""
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("no unprivileged mount namespace here (unshare -rm) to mount a tmpfs in")
    results = []
    for i, cmd in enumerate(commands):
        err = disk.parent / f"stderr{i}"
        script = f'mount -t tmpfs -o {options} tmpfs "$1" || exit 90; shift; "$@" 2>"{err}"'
        proc = subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", str(disk), *cmd], cwd=ROOT,
                              env=_env(), capture_output=True, text=True, timeout=300)
        if proc.returncode == 90:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
        results.append((proc.returncode, err.read_text()))
    return results


@pytest.mark.slow
def test_a_real_filesystem_that_fills_up_during_an_export(ckpt, tmp_path):
    """A 256 KiB tmpfs: the weights do not fit. The tmpfs goes with its namespace; the one line must name the
    file there and `No space left on device`."""
    disk = tmp_path / "disk"
    disk.mkdir()
    outs = {fmt: disk / "a" / name for fmt, name in OUTS.items()}
    results = _in_a_mounted_tmpfs("size=256k", disk, [_export_cmd(ckpt, f, o) for f, o in outs.items()])
    for (code, err), out in zip(results, outs.values(), strict=True):
        _one_line(code, err, "", f"nothing exported: cannot write {out}", "No space left on device")


@pytest.mark.slow
def test_a_read_only_destination_is_named_with_the_key_that_moves_it(ckpt, tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    outs = [("hf", disk / "hf"), ("gguf", disk / "m.gguf"), ("gguf", disk / "sub" / "m.gguf")]
    results = _in_a_mounted_tmpfs("ro,size=64k", disk, [_export_cmd(ckpt, f, o) for f, o in outs])
    for (code, err), (_, out) in zip(results, outs, strict=True):
        line = _one_line(code, err, "", "nothing exported: cannot write", "Read-only file system", "out=")
        assert ".tmp-" not in line and "data.cache_dir" not in line and str(disk) in line, line
        assert line.split("cannot write ")[1].split(":")[0] in (str(out), str(out.parent)), line
