"""A compiled decode step packaged ahead of time: built once, then loaded by a later run in a fraction of a
second, with no tracing and no compiling.

torch.compile traces a step in every new process, even where Inductor's caches spare it the code generation
(kept.py). Ahead-of-time, the step is traced once by `torch.export` into a graph of aten operators and
compiled by AOTInductor into a shared library, packaged with the weights it computes with as one `.pt2` file
(`torch._inductor.aoti_compile_and_package`), which a later process loads back as a callable (`load_package`).

    export_step(step, example)  the step's exported program: tokens (B, 1) and the cache's tensors in, logits
                                (B, 1, V) out; every layer's K/V written into its cache buffer in place
    package_step(step, example, path)
                                that program compiled and written as a package, with the step's settings
    PackagedStep.loaded(...)    a DecodeStep whose one-token calls run a loaded package

What a package holds, and so what it fixes:
- the rows decoded and one token per call (speculative decoding's several, or rows other than the batch's,
  are decoded by the model's own step); the cache length is left free, between 1 and the cache's size
  (`filled`, an empty tensor whose length is the number of filled slots: export knows sizes of tensors, not
  Python numbers), so one package serves every step of a generation;
- no padding: a padded batch is decoded by the model's own step too, whose mask the package does not hold;
- the weights, as constants: a package is for one set of weights (kept.py keys it on their digest).
A plan whose step cannot be exported (its matrices in an opaque oneDNN layout, or an int8 kernel export does
not know) is not packaged; `package_problem` says why.
"""

from __future__ import annotations

import copy
import logging
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from minigpt.fast.compiler import FROZEN_INDUCTOR, OneDNN
from minigpt.fast.gate import first_passing, record_probes
from minigpt.fast.kept import Kept, StepCache
from minigpt.fast.step import DecodeStep, Plan, build_step
from minigpt.model.gpt import GPT
from minigpt.model.kv_cache import KVCache
from minigpt.sampling.decode import decode_forward

log = logging.getLogger(__name__)


class _Program(nn.Module):
    """`model`'s decode step with the cache as tensors, as export traces it: tokens (B, 1), filled (S,),
    cache tokens (B, T_max + 1), keys and values (L lists of (B, H_kv, T_max + 1, D)) -> logits (B, 1, V)."""

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor, filled: torch.Tensor, cache_tokens: torch.Tensor,
                keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
        cache = KVCache(list(keys), list(values), cache_tokens, length=filled.shape[0])  # the tensors given
        return decode_forward(self.model, tokens, cache)


def _inputs(tokens: torch.Tensor, cache: KVCache) -> tuple:
    return tokens, cache.tokens.new_empty(cache.length), cache.tokens, cache.k, cache.v


def export_step(step: DecodeStep, example: KVCache) -> torch.export.ExportedProgram:
    """`step`'s model's decode step for as many rows as `example` holds (an unpadded cache filled to at least
    two slots: export specialises on lengths 0 and 1), exported with the cache length free."""
    with torch.no_grad(), OneDNN(step.plan.onednn):
        tokens = torch.zeros(example.batch_size, 1, dtype=torch.long, device=example.device)
        n_layer = step.model.config.n_layer
        length = torch.export.Dim("length", min=1, max=example.max_len - 1)
        dynamic = (None, {0: length}, None, [None] * n_layer, [None] * n_layer)
        return torch.export.export(_Program(step.model), _inputs(tokens, example), dynamic_shapes=dynamic)


def package_step(step: DecodeStep, example: KVCache, path: Path) -> Path:
    """`step` exported on `example` (see `export_step`), compiled by AOTInductor with `step`'s settings
    (frozen or not) and packaged at `path`."""
    settings = FROZEN_INDUCTOR if step.plan.frozen else {}
    with warnings.catch_warnings(), OneDNN(step.plan.onednn):
        # export's tree utilities warn about their own deprecated calls, in the middle of the user's output
        warnings.filterwarnings("ignore", ".*treespec, LeafSpec", FutureWarning)
        program = export_step(step, example)
        return Path(torch._inductor.aoti_compile_and_package(program, package_path=str(path),
                                                             inductor_configs=settings))


class PackagedStep(DecodeStep):
    """tokens (B, T) on top of `cache` -> logits (B, T, V): one token per row of an unpadded batch of `rows`
    rows on a cache of the model's whole context through `runner` (a loaded package of `plan`'s step),
    anything else through `model`'s own step.
    `package`: the package's bytes, where it was built in this process (to be kept)."""

    rows: int
    runner: Callable[..., torch.Tensor]
    package: bytes | None

    @classmethod
    def loaded(cls, model: GPT, plan: Plan, rows: int, runner: Callable[..., torch.Tensor],
               package: bytes | None = None) -> PackagedStep:
        """`model`'s own step, which every call the package does not hold falls back to, with `runner` for
        the calls it holds."""
        step = cls(model)
        step.plan, step.rows, step.runner, step.package = plan, rows, runner, package
        step._onednn = OneDNN(plan.onednn)
        return step

    @property
    def compiled(self) -> bool:
        return True

    @property
    def name(self) -> str:
        return f"decode step packaged: {self.plan.name}"

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        held = tokens.shape == (self.rows, 1) and cache.max_len == self.model.config.block_size
        if not held or cache.has_padding:
            return decode_forward(self.model, tokens, cache)
        with self._onednn:
            logits = self.runner(*_inputs(tokens, cache))  # (B, 1, V)
        cache.advance(1)
        return logits


def package_problem(plan: Plan, device: torch.device) -> str | None:
    """Why `plan`'s step on `device` is not packaged, or None where it is."""
    if device.type != "cpu":
        return f"packages are built for a CPU here, not {device.type}"
    if "packed" in (plan.layout, plan.head_layout):
        return "AOTInductor cannot compile matrices held in oneDNN's packed layout as constants"
    return None


def packaged_candidate(step: DecodeStep, model: GPT, example: KVCache, folder: Path) -> DecodeStep:
    """`step` (compiled, on a prepared copy of `model`) packaged in `folder` for `example`'s rows (a cache
    such as the gate's first probe's) and loaded, as a PackagedStep on `model` holding its package's bytes;
    `step` itself where it is not compiled or cannot be packaged (then one log line says why: it is compiled
    in every run)."""
    if not step.compiled:
        return step
    problem = package_problem(step.plan, step.device)
    if problem is None and example.length < 2:
        problem = f"a context of {model.config.block_size} tokens is too short to trace a step on"
    if problem is None:
        path = folder / f"step-{len(list(folder.iterdir()))}.pt2"
        try:
            package_step(step, example, path)
            return PackagedStep.loaded(model, step.plan, example.batch_size, load_package(path),
                                       path.read_bytes())
        except Exception as e:  # noqa: BLE001 - whatever export or AOTInductor raise, the step stays compiled
            problem = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
    log.info("the %s is compiled in every run, not packaged: %s", step.name, problem)
    return step


def packaged_step(model: GPT, rows: int, key: dict, kept: Kept, cache: StepCache,
                  weights: str) -> tuple[DecodeStep | None, Kept]:
    """`model`'s step of `kept.plan` (a compiled plan kept under `key` in `cache`) for `rows` rows, from the
    package kept for the weights of digest `weights`; where none is, packaged now (and kept once it passes).
    Handed back only where it passes the numbers gate: else None, with one log line (the caller compiles as
    before). Returns it and the record, naming a new package."""
    probes = record_probes(model, rows)
    path = cache.package(key, weights)
    if path is None:
        with tempfile.TemporaryDirectory(prefix="minigpt-package-") as folder:
            built = build_step(copy.deepcopy(model), kept.plan, rows)
            candidate = packaged_candidate(built, model, probes[0].prefilled, Path(folder))
        if not isinstance(candidate, PackagedStep):
            return None, kept
    else:
        try:
            candidate = PackagedStep.loaded(model, kept.plan, rows, load_package(path))
        except Exception as e:  # noqa: BLE001 - a package that does not load is damaged, whatever it raises
            log.warning("decode cache %s is damaged (%s): compiling the step", path, e)
            return None, kept
    step, checked = first_passing(model, probes, [candidate])
    if step is not candidate:
        return None, kept
    if candidate.package is not None:
        kept = cache.keep_package(key, kept, candidate.package, weights)
    step.notes = [*kept.notes, "packaged" if candidate.package else "kept, packaged", *checked, step.name]
    return step, kept


def load_package(path: Path) -> Callable[..., torch.Tensor]:
    """The step in the package at `path`: (tokens, filled, cache tokens, keys, values) -> logits.

    Through the loader `torch._inductor.aoti_load_package` wraps, called directly: that function imports
    Inductor (seconds, for nothing a loaded package needs) and unflattens every call's inputs by their
    recorded tree structure, where these are flattened in a line."""
    loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)
    return lambda tokens, filled, cache_tokens, keys, values: loader.boxed_run(
        [tokens, filled, cache_tokens, *keys, *values])[0]
