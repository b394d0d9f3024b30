"""The classroom knows nothing of the workshop: the model and the decoding loop (minigpt/model/, sampling/)
never name a kernel choice, a compiler setting or a way of storing matrices, so a reader of the lesson meets
none of them (tests/project/test_layering.py checks that they never import minigpt/fast/ either)."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT

CLASSROOM = ("minigpt/model", "minigpt/sampling")
WORKSHOP_WORDS = re.compile(
    r"onednn|mkldnn|inductor|freezing|max.autotune|cpp_wrapper|\bin_out\b|\bout_in\b|PackedLinear|packed_linear"
    r"|StreamedLinear|decode_backend|prepare_for_inference|\bLAYOUTS\b", re.IGNORECASE)


def test_the_classroom_never_names_the_workshop() -> None:
    hits = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
            for folder in CLASSROOM for path in sorted((ROOT / folder).rglob("*.py"))
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if WORKSHOP_WORDS.search(line)]
    assert not hits, "workshop words in the classroom:\n" + "\n".join(hits)


@pytest.mark.parametrize("line", ["torch.backends.mkldnn.enabled = False", "Inductor's freezing pass",
                                  "LAYOUTS = ('out_in', 'in_out')", "class PackedLinear(nn.Module):"])
def test_the_words_are_found_where_they_stand(line: str) -> None:
    assert WORKSHOP_WORDS.search(line)
