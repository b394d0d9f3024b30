"""A minigpt model as a Hugging Face folder: config.json, model.safetensors, generation_config.json and
tokenizer.json (+ its config).

The folder is written as the transformers class that computes the model exactly (GPT2LMHeadModel,
LlamaForCausalLM, Qwen3ForCausalLM or ArceeForCausalLM: interop/architecture.py), which loads with no custom
code; a model with switches none of them computes (model=recipe) is written with minigpt's own modeling code
beside its weights (hf_custom.py), which `from_pretrained(folder, trust_remote_code=True)` loads.
`hf_family` chooses and says why, for the export's one summary line; `scripts/export.py hf_family=...` asks
for one.

Everything is converted and checked in memory first, so a refused model writes nothing; the folder is written
under a temporary name and renamed when complete (staging.py).
"""

from __future__ import annotations

from pathlib import Path

import torch

from minigpt.data.tokenizers import Tokenizer
from minigpt.errors import UserError
from minigpt.interop.architecture import (
    FAMILY_CLASS,
    GPT2,
    architecture_of,
    features_without_family,
    technique_switches,
)
from minigpt.interop.family_weights import llama_weights
from minigpt.interop.fast_tokenizer import fast_tokenizer
from minigpt.interop.hf_custom import custom_config, custom_hf_files
from minigpt.interop.hf_files import CONFIG, GENERATION_CONFIG, WEIGHTS, write_json, write_text, write_weights
from minigpt.interop.hf_gpt2 import hf_config_from_model, hf_state_dict
from minigpt.interop.hf_llama import hf_llama_config
from minigpt.interop.hf_tokenizer import save_hf_tokenizer
from minigpt.interop.staging import staged_output
from minigpt.model.config import ModelConfig
from minigpt.model.gpt import GPT

CUSTOM = "custom"  # minigpt's own modeling code (hf_custom.py)


def hf_family(cfg: ModelConfig, asked: str | None = None) -> tuple[str, str]:
    """(what `cfg` is written as: a family of architecture.py or `custom`, the reason in words). `asked`
    None: the family that computes it, else custom; a family asked for that does not compute it, or a model
    the custom code does not compute either, is a UserError naming why."""
    try:
        family = architecture_of(cfg)
    except UserError as barred:
        if asked not in (None, CUSTOM):
            named = ", ".join(features_without_family(cfg))
            reason = f"{FAMILY_CLASS[asked]} does not compute {named}" if named else str(barred)
            raise UserError(f"hf_family={asked}: {reason}; leave hf_family out (or hf_family=custom) for "
                            "minigpt's own modeling code") from None
        try:
            custom_config(cfg, eot_id=0)
        except UserError:  # neither computes it: a model without technique switches hears of the families
            if technique_switches(cfg):
                raise
            raise barred from None
        why = ("as hf_family=custom asks" if asked else
               f"because no transformers class computes {', '.join(features_without_family(cfg))}")
        return CUSTOM, f"MiniGPTForCausalLM, its modeling code in the folder (trust_remote_code=True), {why}"
    if asked == CUSTOM:
        custom_config(cfg, eot_id=0)  # a GPT-2 block: its code computes rotary models only
        return CUSTOM, ("MiniGPTForCausalLM, its modeling code in the folder (trust_remote_code=True), as "
                        f"hf_family=custom asks (hf_family={family} needs no custom code)")
    if asked not in (None, family):
        raise UserError(f"hf_family={asked} does not compute this model, {FAMILY_CLASS[family]} does "
                        f"(hf_family={family}); leave hf_family out")
    return family, f"{FAMILY_CLASS[family]}, which transformers loads with no custom code"


def hf_files(model: GPT, eot_id: int) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json dict, weights under HF names) for `model` as its transformers class; UserError naming the
    feature no class computes."""
    if architecture_of(model.config) == GPT2:
        config, weights = hf_config_from_model(model.config, eot_id), hf_state_dict(model)
        if model.config.tie_weights:
            del weights["lm_head.weight"]  # safetensors refuses shared storage; HF re-ties it from wte
        return config, weights
    return hf_llama_config(model.config, eot_id), llama_weights(model)


def export_hf(model: GPT, tokenizer: Tokenizer, out: str | Path, family: str | None = None) -> Path:
    """Write `model` and its tokenizer as a new HF folder `out`, as `family` (None: `hf_family`'s choice);
    returns it."""
    eot = tokenizer.eot_id
    if (family or hf_family(model.config)[0]) == CUSTOM:
        config, weights, code = custom_hf_files(model, eot)
    else:
        (config, weights), code = hf_files(model, eot), {}
    fast = fast_tokenizer(tokenizer)  # converted before anything is written
    generation = {"bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot}  # a document ends at EOT
    if code:
        generation["use_cache"] = False  # the custom code recomputes the sequence; it keeps no KV cache
    with staged_output(Path(out), folder=True) as tmp:
        write_json(tmp / CONFIG, config)
        write_weights(tmp / WEIGHTS, weights)
        write_json(tmp / GENERATION_CONFIG, generation)
        save_hf_tokenizer(fast, tmp, model_max_length=model.config.block_size)
        for name, text in code.items():
            write_text(tmp / name, text)
    return Path(out).expanduser()
