"""How a model's matrices are stored for decoding, and a model laid out that way.

nn.Linear multiplies by the transpose of its (out, in) weight. For the one or few rows of a decode step that
product streams the whole matrix from memory, and how fast it does depends on the layout, the dtype, the
matrix's size and the CPU; so the layout is measured (products.py) and the model laid out accordingly:

    out_in    nn.Linear's own layout (and back to it from in_out)
    in_out    the same (out, in) matrix with strides (1, out): `w.t().contiguous().t()`; the same nn.Linear
              runs, and training afterwards still computes the right gradients, slowly
    packed    oneDNN's blocked layout for `rows` rows (packed.py): the nn.Linear becomes a PackedLinear, for
              inference only, and there is no way back
    streamed  nn.Linear's own layout, the product written as a multiply-and-sum that a compiled step generates
              as one loop over the matrix (streamed.py): the nn.Linear becomes a StreamedLinear with the same
              parameters, and there is no way back

Values and shapes are unchanged (names too, but for packed's buffers); the arithmetic is the same up to the
order of the sums. The tied embedding table shares the head's matrix in the plain layouts (a lookup reads one
row per token, whatever the strides); packed, the head gets a copy. Int8 layers (model/int8.py) have one
layout and are left as they are.
"""

from __future__ import annotations

import torch
from torch import nn

from minigpt.fast.packed import PackedLinear
from minigpt.fast.streamed import StreamedLinear
from minigpt.model.gpt import GPT

LAYOUTS = ("out_in", "in_out", "packed", "streamed")


@torch.no_grad()
def lay_out(model: GPT, layout: str, rows: int = 1, head_layout: str | None = None) -> GPT:
    """`model` with the blocks' linear matrices stored in `layout` and the head's in `head_layout` (None:
    `layout`), for products of `rows` rows; in place, and returned."""
    head_layout = layout if head_layout is None else head_layout
    for name in (layout, head_layout):
        if name not in LAYOUTS:
            raise ValueError(f"layout={name!r} is not one of {LAYOUTS}")
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                chosen = head_layout if child is model.lm_head else layout
                setattr(parent, name, _laid_out(child, chosen, rows))
    return model


def _laid_out(linear: nn.Linear, layout: str, rows: int) -> nn.Module:
    """`linear` with its matrix in `layout`: itself, a PackedLinear or a StreamedLinear."""
    if layout == "packed":
        return PackedLinear.from_linear(linear, rows)
    if layout == "streamed":
        return StreamedLinear.from_linear(linear)
    w = linear.weight.data
    if layout == "in_out" and w.is_contiguous():
        linear.weight.data = w.t().contiguous().t()  # still (out, in), now with strides (1, out)
    elif layout == "out_in" and not w.is_contiguous():
        linear.weight.data = w.contiguous()  # back to nn.Linear's own layout
    return linear
