"""The bench's sections by name, and `only=` selection (no torch: `scripts/bench.py --help` stays quick)."""

from __future__ import annotations

from minigpt.errors import UserError

DECODING = ("generation", "default_decode", "first_token", "decode_batch", "speculative", "step_spread",
            "decode_accuracy")
SECTIONS = ("peak", "train_S", "train_M", *DECODING, "attention", "data")
EXTRA_SECTIONS = ("train_loop", "compile", "techniques", "busy")  # not part of the default run
ALIASES = {"train": ("train_S", "train_M"), "decoding": DECODING, "all": SECTIONS}


def select_sections(only: list[str] | None) -> list[str]:
    """Expand `only=` names (aliases allowed) into sections, in the suite's order; UserError if unknown."""
    if not only:
        return list(SECTIONS)
    wanted: set[str] = set()
    for name in only:
        if name in ALIASES:
            wanted.update(ALIASES[name])
        elif name in SECTIONS + EXTRA_SECTIONS:
            wanted.add(name)
        else:
            choices = ", ".join((*SECTIONS, *EXTRA_SECTIONS, *ALIASES))
            raise UserError(f"only={name!r} is not a section; choose from {choices}")
    return [s for s in SECTIONS + EXTRA_SECTIONS if s in wanted]
