"""The CUDA check's offline install: the wheels `make device-wheels` fetches cover what the device image
lacks.

The image has torch, tiktoken, safetensors, tensorboard, transformers, matplotlib, tqdm and pytest
(and their own requirements: numpy, PyYAML, packaging). Every runtime dependency of minigpt must be there or
in the Makefile's DEVICE_PACKAGES; and where .whl/ has been filled, it must install into an empty --target
with no index, for the device's Python 3.12 on manylinux x86-64 (checked with pip's --python-version and
--platform, so no 3.12 interpreter is needed here).
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import ROOT

IMAGE = {"torch", "tiktoken", "safetensors", "tensorboard", "transformers", "matplotlib", "tqdm", "numpy",
         "pytest"}


def _make_list(name: str) -> set[str]:
    match = re.search(rf"^{name}\s*:?=\s*(.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert match, name
    return set(match.group(1).split())


def _requirement_name(spec: str) -> str:
    return re.split(r"[<>=!~ ;\[]", spec, maxsplit=1)[0].lower()


def test_every_dependency_is_in_the_image_or_in_the_wheels() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    wheels = _make_list("DEVICE_PACKAGES") | _make_list("DEVICE_SOURCE_PACKAGES")
    missing = {_requirement_name(d) for d in deps} - IMAGE - wheels
    assert not missing, f"add {missing} to DEVICE_PACKAGES in the Makefile (the CUDA image lacks them)"
    # hydra-core's own pins, which the image lacks too
    assert {"omegaconf", "antlr4-python3-runtime"} <= wheels


@pytest.mark.slow
def test_device_check_is_valid_bash() -> None:
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / "device_check.sh")], check=True)


def test_the_wheel_folder_installs_offline_into_an_empty_target(tmp_path) -> None:
    wheels = sorted((ROOT / ".whl").glob("*.whl"))
    if not wheels:
        pytest.skip("no .whl/ here: `make device-wheels` fills it (needs the package index)")
    target = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--only-binary=:all:",
         "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_17_x86_64",
         "--target", str(target), *map(str, wheels)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    for package in ("hydra", "omegaconf", "antlr4", "rustbpe"):
        assert (target / package).is_dir(), package
