"""How every weight starts (`model.init`): GPT-2's scheme, or one scaled by each matrix's fan-in.

- `gpt2`: every matrix and table N(0, 0.02²), small enough that the first logits are nearly uniform; the two
  projections that add to the residual stream (W_O, the FFN's down projection) at 0.02 / √(2L), since the
  stream sums 2·L of them and its variance would otherwise grow with depth.
- `fan_in`: every matrix uniform with std 1/√fan_in (a unit-variance input gives unit-variance outputs at
  any width; a uniform draw has no outliers), the FFN's up projection at 0.4 of that, the projections onto
  the residual stream at zero (each block starts as the identity), the token table N(0, 0.8²) (rows of about
  unit scale, which a norm after the embedding keeps), value-embedding tables at the std of the value
  projection they add to, and the head N(0, 0.001²) (its logits start nearly uniform whatever the width).
  The technique switches start a little on, as the reference recipe starts them (docs/tricks.md): the
  residual scalars a_i from 1.15 at the first block to 1.05 at the last and b_i from 0.20 to 0.05, the
  backout at 0.2, the gates' weights uniform on [0, 0.02]; the smear's strength and the bigram table at
  zero. Record-setting small-GPT recipes start this way; it sets the scale Muon's fixed-size steps and
  Adam's lr-sized steps are measured against.

Under `gpt2`, biases start at zero, norm gains and the residual scalars' a_i at one, and the technique
switches that add a path start at zero (`starts_at_zero`), so that the model starts as it would without them.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from minigpt.model.config import ModelConfig

INIT_STD = 0.02  # GPT-2's init: small enough that the initial logits are nearly uniform
HEAD_STD = 0.001  # fan_in: the head's, so that its first logits are nearly uniform
TABLE_STD = 0.8  # fan_in: the token table's (a norm after it makes its scale the steps' yardstick only)
FFN_UP_SCALE = 0.4  # fan_in: the FFN's up projection at 0.4 of the fan-in std
BACKOUT = 0.2  # fan_in: the backout's c at first
GATE_MAX = 0.02  # fan_in: the gates' weights are uniform on [0, GATE_MAX]
ZERO_SWITCHES = ("transformer.smear.lam", "transformer.bigram.table.weight")  # fan_in: off at first


def starts_at_zero(cfg: ModelConfig, name: str) -> bool:
    """Whether a technique switch starts parameter `name` at zero, so that the model starts as the model
    without the switch and learns how much of it to use: the smear's strength, the bigram table, the value
    embeddings' gates (2·sigmoid(0) = a gate of 1), the embedding's share b_i of each block's input and the
    backout (residual_scalars.py), and with model.zero_init_proj (or init=fan_in) every W_O and FFN down
    projection (each block then starts as the identity; the zeroed matrix gets its gradient through its
    input, which is not zero, and the matrices before it once it has moved)."""
    if name in ("transformer.smear.lam", "transformer.bigram.table.weight", "transformer.scalars.x0",
                "transformer.scalars.backout"):
        return True
    if name.endswith("ve_gate.weight"):
        return True
    return (cfg.zero_init_proj or cfg.init == "fan_in") and name.endswith("c_proj.weight")


def init_weights(model: nn.Module, cfg: ModelConfig) -> None:
    """Draw every parameter of `model` (a GPT) as `cfg.init` says (see the module docstring)."""
    for name, p in model.named_parameters():
        if cfg.init == "fan_in":
            _fan_in(name, p, cfg)
        elif name.endswith("bias") or starts_at_zero(cfg, name):
            nn.init.zeros_(p)  # biases start neutral; the technique switches: see starts_at_zero
        elif p.dim() <= 1:
            nn.init.ones_(p)  # norm gains and the residual scalars start at identity
        elif name.endswith("c_proj.weight"):
            nn.init.normal_(p, mean=0.0, std=INIT_STD / math.sqrt(2 * cfg.n_layer))
        else:
            nn.init.normal_(p, mean=0.0, std=INIT_STD)


@torch.no_grad()
def _fan_in(name: str, p: nn.Parameter, cfg: ModelConfig) -> None:
    depth = torch.arange(cfg.n_layer) / max(cfg.n_layer - 1, 1)  # (L,) 0 at the first block, 1 at the last
    if name.endswith("bias") or name.endswith("c_proj.weight") or name in ZERO_SWITCHES:
        nn.init.zeros_(p)
    elif name == "transformer.scalars.resid":
        p.copy_(1.15 - 0.10 * depth)  # the first blocks keep more of the stream
    elif name == "transformer.scalars.x0":
        p.copy_(0.20 - 0.15 * depth)  # and read more of the embedding
    elif name == "transformer.scalars.backout":
        nn.init.constant_(p, BACKOUT)
    elif name.endswith("gate.weight"):  # the smear's and value embeddings' gates: a little open
        nn.init.uniform_(p, 0.0, GATE_MAX)
    elif p.dim() <= 1:
        nn.init.ones_(p)  # norm gains
    elif name == "lm_head.weight":
        nn.init.normal_(p, mean=0.0, std=HEAD_STD)
    elif name.startswith(("transformer.wte.", "transformer.wpe.")):
        nn.init.normal_(p, mean=0.0, std=TABLE_STD)
    else:  # a matrix (out, in), or a value-embedding table at the std of the value projection (in = C)
        fan_in = cfg.n_embd if name.startswith("transformer.ve.") else p.shape[1]
        bound = math.sqrt(3.0 / fan_in)  # uniform on [-b, b] has std b / √3
        if name.endswith("mlp.c_fc.weight"):
            bound *= FFN_UP_SCALE
        nn.init.uniform_(p, -bound, bound)
