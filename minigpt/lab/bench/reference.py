"""The reference implementation: Hugging Face `GPT2LMHeadModel` holding exactly minigpt's weights.

The weights travel through the one GPT-2 mapping of the project (`minigpt/interop/hf_gpt2.py`): the
minigpt config becomes a `GPT2Config` and the state dict is renamed/transposed into HF's layout. HF's
`gelu` is the exact (erf) GELU, so a minigpt model with `activation=gelu` computes the same function;
`logits_agree` checks that before any timing is trusted.

`transformers` is a dev-only dependency: importing this module without it raises a UserError.
"""

from __future__ import annotations

import logging

import torch

from minigpt.errors import UserError
from minigpt.interop.hf_gpt2 import hf_config_from_model, hf_state_dict
from minigpt.model.config import ModelConfig
from minigpt.model.gpt import GPT


def gpt2_like_config(n_layer: int, n_head: int, n_embd: int, vocab_size: int, block_size: int,
                     attention: str = "sdpa") -> ModelConfig:
    """A minigpt config HF's GPT-2 computes identically: learned PE, pre-norm LayerNorm, exact GELU,
    tied embeddings, biases, no dropout."""
    return ModelConfig(
        n_layer=n_layer, n_head=n_head, n_kv_head=None, n_embd=n_embd, vocab_size=vocab_size,
        block_size=block_size, pos_encoding="learned", norm="layernorm", norm_placement="pre",
        activation="gelu", ffn_mult=4.0, attention=attention, dropout=0.0, attn_dropout=0.0, bias=True,
        tie_weights=True,
    )


def reference_model(model: GPT) -> torch.nn.Module:
    """A `transformers.GPT2LMHeadModel` (torch's SDPA attention) with `model`'s weights, dtype and device."""
    try:
        import transformers
    except ImportError:
        raise UserError("the reference needs transformers (a dev dependency): pip install -e '.[dev]'") \
            from None
    logging.getLogger("transformers").setLevel(logging.ERROR)  # its config warnings are noise here
    hf_cfg = hf_config_from_model(model.config)
    # bos/eos default to GPT-2's 50256, which does not exist in a small vocabulary; nothing here uses them
    hf_cfg.update(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    config = transformers.GPT2Config(**hf_cfg, attn_implementation="sdpa")
    weight = model.lm_head.weight
    with torch.device("meta"):
        ref = transformers.GPT2LMHeadModel(config)  # no memory yet: load_state_dict(assign=True) fills it
    ref.load_state_dict(hf_state_dict(model), assign=True)
    ref.tie_weights()
    return ref.to(device=weight.device, dtype=weight.dtype).train(model.training)


@torch.no_grad()
def logits_agree(model: GPT, ref: torch.nn.Module, idx: torch.Tensor, atol: float = 1e-4) -> float:
    """Max |logits difference| of the two models on idx (B, T); raises if above atol (a broken mapping)."""
    was = model.training, ref.training
    model.eval(), ref.eval()
    ours = model(idx)[0]
    theirs = ref(input_ids=idx).logits
    model.train(was[0]), ref.train(was[1])
    diff = (ours.float() - theirs.float()).abs().max().item()
    if not diff <= atol:
        raise RuntimeError(f"minigpt and the HF reference disagree: max |logit diff| {diff:.2e} > {atol:.0e}")
    return diff
