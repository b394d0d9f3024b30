"""The numbers gate: a step the wing builds replaces the eager step only where it gives the eager step's
numbers.

A laid out, packed, streamed, frozen or compiled step (on any weights, int8 included) computes what the eager
step computes in another order, with other kernels, through a compiler; any of these can be wrong on one
machine and right on another, and a wrong one can pass every test of its parts (docs/decoding.md has a frozen
int8 step whose products were each right). So before a step is handed out it decodes a probe:

    two batches, each prefilled and then fed PROBE_STEPS tokens one at a time: the step's own number of rows
    with prompts of one length (the case decoding runs), and two rows, the second left-padded (the cache's
    mask); the tokens fed are the eager step's greedy ones, so a near tie cannot send the two apart

and its logits are held against the eager step's (`decode_forward` on the model before anything was changed):

    error      the largest |difference| over every row, position and vocabulary entry, divided by the
               standard deviation of the eager logits (a scale of their own, whatever the model's)
    tolerance  TOLERANCE of the activations' dtype; the error must not pass it. Then every greedy token is
               the eager one wherever the eager logits' best two are more than twice the tolerance apart
               (no entry moved by more than the tolerance); closer than that, rounding alone may swap them

The probes are recorded once, before any candidate is built: a step that is packaged ahead of time
(packaged.py) is traced on the first probe's prefilled cache, the very inputs it is then held to.
`first_passing` tries the candidates in order: one that fails is refused with one log line that names it,
the first that passes is used, and where none does the eager step itself (which needs no check). Each check
leaves a line, with the error it measured, among the step's notes (the bench reports them).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from minigpt.fast.step import DecodeStep
from minigpt.model.gpt import GPT
from minigpt.model.kv_cache import KVCache
from minigpt.sampling.decode import DecodeFn, own_step, prefill

log = logging.getLogger(__name__)

PROBE_STEPS = 4  # tokens fed after each batch's prefill
PROBE_PROMPT = 8  # tokens of the probe's prompts (the padded row has fewer), where the context allows
# The largest error an honest step shows, relative to the eager logits' spread, is a few units of its dtype's
# rounding summed over the layers; each tolerance is well above the largest such error measured on the
# bench's and the tests' models (docs/decoding.md, "The numbers gate"), and far below what a wrong step shows.
TOLERANCE = {torch.float32: 1e-3, torch.float16: 0.1, torch.bfloat16: 0.25}


@dataclass
class Probe:
    """One probe batch: its rows' prompts, the tokens fed after them, the eager step's logits, and its cache
    as the prefill left it."""

    prompts: list[list[int]]
    tokens: torch.Tensor  # (steps, B) the eager step's greedy tokens, fed to every step in turn
    logits: torch.Tensor  # (steps + 1, B, V) float32: after the prefill, then after each fed token
    prefilled: KVCache  # B rows, the prompts' slots filled (the fed tokens' rewound)


@torch.no_grad()
def _decode(model: GPT, step: DecodeFn, prompts: list[list[int]],
            tokens: torch.Tensor | int) -> tuple[torch.Tensor, torch.Tensor, KVCache]:
    """`prompts` prefilled by `model`, then `tokens` (steps, B) fed through `step` one row of tokens at a
    time, or, given a number, that many of the greedy tokens of the logits before each. Returns the logits
    (steps + 1, B, V) in float32, the tokens fed (steps, B) and the cache."""
    cache, last = prefill(model, prompts)
    logits = [last.float()]  # (B, V) each
    fed = []
    for i in range(tokens if isinstance(tokens, int) else len(tokens)):
        fed.append(logits[-1].argmax(-1) if isinstance(tokens, int) else tokens[i])  # (B,)
        logits.append(step(fed[-1].view(-1, 1), cache)[:, -1].float())
    return torch.stack(logits), torch.stack(fed), cache


def record_probes(model: GPT, rows: int) -> list[Probe]:
    """The eager step's probe batches for `model` decoding `rows` rows (see the module docstring)."""
    cfg = model.config
    length = max(1, min(PROBE_PROMPT, cfg.block_size - PROBE_STEPS))
    steps = min(PROBE_STEPS, cfg.block_size - length)
    gen = torch.Generator().manual_seed(0)
    probes = []
    for lengths in ([length] * rows, [length, max(1, length // 2)]):
        prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist() for n in lengths]
        logits, tokens, cache = _decode(model, own_step(model), prompts, steps)
        cache.rewind(max(lengths))
        probes.append(Probe(prompts, tokens, logits, cache))
    return probes


def check(step: DecodeStep, probes: list[Probe]) -> tuple[bool, str]:
    """Whether `step` decodes every probe within the tolerance of the eager step, and its largest error in
    words (on the first probe that fails it, if one does)."""
    dtype = step.model.transformer.wte.weight.dtype  # the activations' in every weights dtype
    tolerance = TOLERANCE[dtype]
    worst, where = 0.0, ""
    for probe in probes:
        got, _, _ = _decode(step.model, step, probe.prompts, probe.tokens)  # (steps + 1, B, V)
        error = ((got - probe.logits).abs().max() / probe.logits.std()).item()
        if not error <= worst:  # NaN too
            padded = " (one left-padded)" if len({len(p) for p in probe.prompts}) > 1 else ""
            worst, where = error, f"{len(probe.prompts)} rows{padded}"
        if not error <= tolerance:
            break
    limit = f"at most {tolerance:g} for {str(dtype).removeprefix('torch.')}"
    how = f"its logits are {worst:.3g} standard deviations from the eager step's on {where} ({limit})"
    return worst <= tolerance, how


def first_passing(model: GPT, probes: list[Probe],
                  candidates: Iterable[DecodeStep]) -> tuple[DecodeStep, list[str]]:
    """The first of `candidates` (steps of copies of `model`) that decodes `probes` (`record_probes(model,
    rows)`) as `model`'s eager step did, else `model`'s eager step; and a line for each candidate checked (a
    refusal is also logged as a warning)."""
    lines = []
    for candidate in candidates:
        passed, how = check(candidate, probes)
        lines.append(f"{'passed' if passed else 'refused'} the {candidate.name}: {how}")
        if passed:
            return candidate, lines
        log.warning("%s", lines[-1])
    return DecodeStep(model), lines
