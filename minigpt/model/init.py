"""How every weight starts (`model.init`): GPT-2's scheme, or one scaled by each matrix's fan-in.

- `gpt2`: every matrix and table N(0, 0.02²), small enough that the first logits are nearly uniform; the two
  projections that add to the residual stream (W_O, the FFN's down projection) at 0.02 / √(2L), since the
  stream sums 2·L of them and its variance would otherwise grow with depth.
- `fan_in`: every matrix uniform with std 1/√fan_in (a unit-variance input gives unit-variance outputs at
  any width; a uniform draw has no outliers), the projections onto the residual stream at zero (each block
  starts as the identity), the token table N(0, 1) (rows of unit scale, which a norm after the embedding
  keeps), value-embedding tables at the std of the value projection they add to, and the head N(0, 0.001²)
  (its logits start nearly uniform whatever the width). Record-setting small-GPT recipes start this way; it
  sets the scale Muon's fixed-size steps and Adam's lr-sized steps are measured against.

Under either, biases start at zero, norm gains and the residual scalars' a_i at one, and the technique
switches that add a path start at zero (`starts_at_zero`), so that the model starts as it would without them.
"""

from __future__ import annotations

import math

from torch import nn

from minigpt.model.config import ModelConfig

INIT_STD = 0.02  # GPT-2's init: small enough that the initial logits are nearly uniform
HEAD_STD = 0.001  # fan_in: the head's, so that its first logits are nearly uniform


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
        if name.endswith("bias") or starts_at_zero(cfg, name):
            nn.init.zeros_(p)  # biases start neutral; the technique switches: see starts_at_zero
        elif p.dim() <= 1:
            nn.init.ones_(p)  # norm gains and the residual scalars start at identity
        elif cfg.init == "fan_in":
            _fan_in(name, p, cfg)
        elif name.endswith("c_proj.weight"):
            nn.init.normal_(p, mean=0.0, std=INIT_STD / math.sqrt(2 * cfg.n_layer))
        else:
            nn.init.normal_(p, mean=0.0, std=INIT_STD)


def _fan_in(name: str, p: nn.Parameter, cfg: ModelConfig) -> None:
    if name == "lm_head.weight":
        nn.init.normal_(p, mean=0.0, std=HEAD_STD)
    elif name.startswith(("transformer.wte.", "transformer.wpe.")):
        nn.init.normal_(p, mean=0.0, std=1.0)
    else:  # a matrix (out, in), or a value-embedding table at the std of the value projection (in = C)
        fan_in = cfg.n_embd if name.startswith("transformer.ve.") else p.shape[1]
        bound = math.sqrt(3.0 / fan_in)  # uniform on [-b, b] has std b / √3
        nn.init.uniform_(p, -bound, bound)
