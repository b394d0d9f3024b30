"""What a decode step chose and compiled, kept per machine, model shape and dtype, so that a later run starts
decoding at once instead of choosing and compiling again.

    StepCache(folder)       one record per key in `folder`: the plan that passed the numbers gate, the lines
                            saying what was measured on the way, how long choosing and compiling took, and,
                            for a compiled step, Inductor's artifacts
    step_key(model, rows)   what a choice depends on: the machine (`this_machine`), the model's config, its
                            weights' and activations' dtype, the rows decoded and whether it is compiled

A key's record is `decode-<digest>.json`; a compiled step's artifacts are Inductor's own cache entries (its FX
graphs, AOTAutograd graphs and compiled C++ or Triton kernels) as `torch.compiler.save_cache_artifacts`
serialises them, in `decode-<digest>-<sha256>.inductor`, which the record names with its checksum. Reading a
record loads those artifacts back into Inductor's caches (`load_cache_artifacts`), so the step compiles from
them: Dynamo still traces the step (a second or two), nothing is generated, built or autotuned again.

A compiled step packaged ahead of time (packaged.py) is kept beside its record too, as
`decode-<digest>-<sha256>.pt2`, which the record names with its checksum and the digest of the weights it
holds (`weights_digest`): a package is found only for its key and those weights.

A record is written after its artifacts, each atomically (a temporary file renamed over the old one), so a
reader sees a whole record that names whole artifacts, whichever of two processes writing at once wins. A
record whose key, plan or checksum does not match is damaged: it is chosen again and rewritten, with one log
line; it is never used. The key changes, and so a record stops being found, when torch, the CPU (its model
name, vector ISA or flags), the model's config or its dtype change. A kept step still passes the numbers gate
before it is used (fastest.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from minigpt.device.probe import cpu_flags, cpu_model
from minigpt.fast.step import Plan
from minigpt.model.gpt import GPT
from minigpt.model.int8 import Int8Linear

log = logging.getLogger(__name__)

FOLDER = "decode"  # inside the data cache folder, beside the CPU probe's device_probe.json


def flags_digest(flags: list[str]) -> str:
    """A short digest of the CPU's feature flags ('' where there are none): two CPUs of one model name can
    differ in what a hypervisor lets through, and a generated kernel may use any of it."""
    return hashlib.sha256(" ".join(flags).encode()).hexdigest()[:16] if flags else ""


def this_machine() -> dict:
    """What a compiled step depends on besides the model: torch, the CPU and its flags, and the GPU if any."""
    machine = {"torch": torch.__version__, "cpu": cpu_model(), "isa": torch.backends.cpu.get_cpu_capability(),
               "cpu_flags": flags_digest(cpu_flags())}
    if torch.cuda.is_available():
        machine["gpu"] = torch.cuda.get_device_name()
    return machine


def step_key(model: GPT, rows: int, compile: bool, machine: dict) -> dict:
    """The key of `model`'s decode step for `rows` rows, compiled or not, on `machine` (`this_machine()`)."""
    table = model.transformer.wte.weight  # float in every weights dtype: the activations' dtype and device
    int8 = any(isinstance(m, Int8Linear) for m in model.modules())
    return {"machine": machine, "device": table.device.type, "model": asdict(model.config),
            "weights": "int8" if int8 else str(table.dtype).removeprefix("torch."),
            "activations": str(table.dtype).removeprefix("torch."), "rows": rows, "compiled": compile}


@dataclass
class Kept:
    """One key's record: the plan that passed the gate and what was measured on the way to it."""

    plan: Plan
    notes: list[str]
    choose_s: float  # choosing and compiling the step when it was not kept
    times: dict[str, float] = field(default_factory=dict)  # seconds per step: "eager", "compiled"
    warm_s: float | None = None  # reading the record, loading and compiling from it, gating: once measured
    artifacts: dict | None = None  # {"file", "sha256"} of a compiled step's Inductor artifacts
    package: dict | None = None  # {"file", "sha256", "weights"} of the step packaged (packaged.py)
    key: dict = field(default_factory=dict, compare=False)  # what it was kept under


class StepCache:
    """The records of `folder` (see the module docstring); `machine` says which machine this is."""

    def __init__(self, folder: Path | str, machine: Callable[[], dict] = this_machine) -> None:
        self.folder = Path(folder)
        self.machine = machine

    def key(self, model: GPT, rows: int, compile: bool) -> dict:
        return step_key(model, rows, compile, self.machine())

    def _record(self, key: dict) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
        return self.folder / f"decode-{digest}.json"

    def peek(self, key: dict) -> Kept | None:
        """`key`'s record without loading its artifacts: None where there is none or it is damaged (quietly:
        reading it to use it says so)."""
        return self._peek(self._record(key), key)

    def _peek(self, path: Path, key: dict | None) -> Kept | None:
        try:
            record = json.loads(path.read_text())
            return self._parse(record["key"] if key is None else key, record)
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return None

    def latest_compiled(self, key: dict) -> Kept | None:
        """The newest whole record of a compiled step on `key`'s machine and device, for any model: what
        compiling costs and gains here, as an estimate where `key` itself has no record."""
        like = lambda other: all(other[k] == key[k] for k in ("machine", "device")) and other["compiled"]
        paths = sorted(self.folder.glob("decode-*.json"), key=lambda p: p.stat().st_mtime, reverse=True) \
            if self.folder.is_dir() else []
        for path in paths:
            kept = self._peek(path, None)
            if kept is not None and like(kept.key) and kept.plan.compiled and kept.times:
                return kept
        return None

    def read(self, key: dict) -> Kept | None:
        """`key`'s record with its artifacts loaded into Inductor's caches, or None where there is none; a
        damaged one is None too, and logged."""
        path = self._record(key)
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        except OSError as e:
            log.warning("decode cache %s cannot be read (%s): choosing the step again", path, e.strerror or e)
            return None
        try:
            kept = self._parse(key, json.loads(text))
            if kept.artifacts is not None:
                _load_artifacts(path.parent / kept.artifacts["file"], kept.artifacts["sha256"])
        except (OSError, ValueError, TypeError, KeyError) as e:
            log.warning("decode cache %s is damaged (%s): choosing the step again and rewriting it", path, e)
            return None
        return kept

    @staticmethod
    def _parse(key: dict, record: dict) -> Kept:
        if record["key"] != key:
            raise ValueError("its key is not the one it is filed under")
        artifacts = record.get("artifacts")
        if artifacts is not None and not {"file", "sha256"} <= set(artifacts):
            raise ValueError("its artifacts are not named")
        package = record.get("package")
        if package is not None and not {"file", "sha256", "weights"} <= set(package):
            raise ValueError("its package is not named")
        warm_s = record.get("warm_s")
        notes = [str(note) for note in record["notes"]]
        return Kept(Plan.from_dict(record["plan"]), notes, float(record["choose_s"]),
                    {str(k): float(v) for k, v in record.get("times", {}).items()},
                    None if warm_s is None else float(warm_s), artifacts, package, key)

    def write(self, key: dict, kept: Kept, artifacts: bytes | None = None) -> None:
        """Keep `kept` (and a compiled step's `artifacts`, else the ones it names) under `key`; a folder that
        cannot be written costs only the choosing next time (one log line)."""
        path = self._record(key)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            if artifacts is not None:
                kept = replace(kept, artifacts=self._file_beside(key, artifacts, ".inductor"))
            record = {"key": key, "plan": kept.plan.to_dict(), "notes": kept.notes, "choose_s": kept.choose_s,
                      "times": kept.times, "warm_s": kept.warm_s, "artifacts": kept.artifacts,
                      "package": kept.package}
            _write_atomically(path, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
        except OSError as e:
            log.warning("could not keep the decode step in %s (%s); it will be chosen again next run", path,
                        e.strerror or e)

    def _file_beside(self, key: dict, data: bytes, suffix: str) -> dict:
        """`data` written atomically beside `key`'s record, named by its checksum: {"file", "sha256"}."""
        sha = hashlib.sha256(data).hexdigest()
        name = f"{self._record(key).stem}-{sha[:16]}{suffix}"
        _write_atomically(self.folder / name, data)
        return {"file": name, "sha256": sha}

    def package(self, key: dict, weights: str) -> Path | None:
        """The package of `key`'s step for the weights of digest `weights` (`weights_digest`), or None where
        none is kept for them; a damaged one is None too, and logged."""
        kept = self.peek(key)
        if kept is None or kept.package is None or kept.package["weights"] != weights:
            return None
        path = self.folder / kept.package["file"]
        try:
            _checked_bytes(path, kept.package["sha256"])
        except (OSError, ValueError) as e:
            log.warning("decode cache %s is damaged (%s): packaging the step again", path,
                        getattr(e, "strerror", None) or e)
            return None
        return path

    def keep_package(self, key: dict, kept: Kept, package: bytes, weights: str) -> Kept:
        """`kept` with `package` (the bytes of a package for the weights of digest `weights`) filed beside
        `key`'s record and named in it, the record rewritten; a folder that cannot be written keeps nothing
        (one log line)."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            named = self._file_beside(key, package, ".pt2")
        except OSError as e:
            log.warning("could not keep the packaged decode step in %s (%s); it is packaged again next run",
                        self.folder, e.strerror or e)
            return kept
        kept = replace(kept, package={**named, "weights": weights})
        self.write(key, kept)
        return kept


def weights_digest(model: torch.nn.Module) -> str:
    """A digest of `model`'s weights (every parameter and buffer, by name, dtype, shape and bytes): what a
    package, which holds them as constants, depends on besides its key."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()[:32]


def _checked_bytes(path: Path, sha256: str) -> bytes:
    """The bytes of `path`; ValueError where they do not match their checksum (OSError where unreadable)."""
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ValueError(f"{path.name} does not match its checksum")
    return data


def _load_artifacts(path: Path, sha256: str) -> None:
    data = _checked_bytes(path, sha256)
    try:
        torch.compiler.load_cache_artifacts(data)
    except Exception as e:  # noqa: BLE001 - whatever unpickling a damaged file raises, the file is damaged
        raise ValueError(f"{path.name} cannot be loaded: {e}") from e


def saved_artifacts() -> bytes | None:
    """Inductor's cache entries of everything this process compiled (None where it compiled nothing)."""
    saved = torch.compiler.save_cache_artifacts()
    return saved[0] if saved is not None else None


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
