"""GPT-2 weights in the Hugging Face format: load them into minigpt, and write minigpt weights back out.

A Hugging Face GPT-2 folder holds `config.json` and `model.safetensors` (or the older pickled
`pytorch_model.bin`, read here with `weights_only=True` so no code runs while unpickling). minigpt
uses GPT-2's parameter names, so the mapping is a name-by-name copy with two wrinkles:

- HF's attention and MLP layers are `Conv1D`, which stores its weight as (in, out) — the transpose
  of `nn.Linear`'s (out, in). The four such matrices per block are transposed on the way in and out.
- A bare `GPT2Model` checkpoint (like the original `gpt2` upload) has no `transformer.` prefix and no
  `lm_head`; the head is the token embedding (tied weights).

HF's causal-mask buffers (`attn.bias`, `attn.masked_bias`) of older checkpoints are not weights and
are dropped. GPT-2's activation `gelu_new` is the tanh approximation of GELU: `gelu_tanh` here.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from minigpt.errors import UserError
from minigpt.model.config import ModelConfig
from minigpt.model.ffn import ffn_hidden_size
from minigpt.model.gpt import GPT

CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
MASK_BUFFERS = (".attn.bias", ".attn.masked_bias")  # the dot: c_attn.bias is a real weight
HF_TO_MINIGPT_ACTIVATION = {
    "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"
}
MINIGPT_TO_HF_ACTIVATION = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
# GPT-2 variants minigpt's blocks do not compute; each one would change the numbers silently
UNSUPPORTED_FLAGS = {"scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
                     "add_cross_attention": False, "scale_attn_weights": True}


# ---------------------------------------------------------------------------------------------------- configs


def config_from_hf(hf: dict) -> ModelConfig:
    """A gpt2-family ModelConfig sized from a Hugging Face `config.json` dict."""
    if hf.get("model_type", "gpt2") != "gpt2":
        raise UserError(f"config.json has model_type={hf.get('model_type')!r}; only model_type gpt2 loads")
    for key, needed in UNSUPPORTED_FLAGS.items():
        if hf.get(key, needed) != needed:
            raise UserError(f"config.json sets {key}={hf[key]}; minigpt supports only {key}={needed}")
    act = hf.get("activation_function", "gelu_new")
    if act not in HF_TO_MINIGPT_ACTIVATION:
        raise UserError(
            f"config.json has activation_function={act!r}; supported: {', '.join(HF_TO_MINIGPT_ACTIVATION)}"
        )
    n_embd = int(hf.get("n_embd", 768))
    n_inner = hf.get("n_inner") or 4 * n_embd  # null means GPT-2's 4·C
    cfg = ModelConfig(
        n_layer=int(hf.get("n_layer", 12)), n_head=int(hf.get("n_head", 12)), n_kv_head=None, n_embd=n_embd,
        block_size=int(hf.get("n_positions", 1024)), vocab_size=int(hf.get("vocab_size", 50257)),
        pos_encoding="learned", norm="layernorm", norm_placement="pre",
        norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)), activation=HF_TO_MINIGPT_ACTIVATION[act],
        ffn_mult=n_inner / n_embd, bias=True, tie_weights=bool(hf.get("tie_word_embeddings", True)),
        dropout=0.0, attn_dropout=0.0,  # inference; a fine-tuning run sets its own (training/resume.py)
    )
    if ffn_hidden_size(cfg) != n_inner:
        raise UserError(f"config.json has n_inner={n_inner}; minigpt needs a multiple of 8 (GPT-2: 4·n_embd)")
    return cfg


def hf_config_from_model(cfg: ModelConfig, eot_id: int | None = None) -> dict:
    """The Hugging Face `config.json` dict of a gpt2-compatible ModelConfig; UserError names what is not."""
    checks = [
        ("pos_encoding", cfg.pos_encoding, "learned"), ("norm", cfg.norm, "layernorm"),
        ("norm_placement", cfg.norm_placement, "pre"), ("bias", cfg.bias, True),
        ("n_kv_head", cfg.kv_heads, cfg.n_head),
        # the ablation switches (model/config.py): GPT-2 has every piece they remove
        ("causal", cfg.causal, True), ("attn_scale", cfg.attn_scale, "sqrt"),
        ("residual", cfg.residual, True), ("final_norm", cfg.final_norm, True),
    ]
    for name, value, needed in checks:
        if value != needed:
            raise UserError(f"model.{name}={value} cannot be exported as GPT-2 (needs model.{name}={needed})")
    if cfg.activation not in MINIGPT_TO_HF_ACTIVATION:
        raise UserError(f"model.activation={cfg.activation} has no GPT-2 equivalent (gelu_tanh/gelu/relu)")
    hf = {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
        "vocab_size": cfg.vocab_size, "n_positions": cfg.block_size, "n_embd": cfg.n_embd,
        "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_inner": ffn_hidden_size(cfg),
        "activation_function": MINIGPT_TO_HF_ACTIVATION[cfg.activation], "layer_norm_epsilon": cfg.norm_eps,
        "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout, "attn_pdrop": cfg.attn_dropout,
        "tie_word_embeddings": cfg.tie_weights,
    }
    if eot_id is not None:  # HF's default (50256) is only right for the GPT-2 tokenizer
        hf["bos_token_id"] = hf["eos_token_id"] = eot_id
    return hf


# ---------------------------------------------------------------------------------------------------- weights


def _is_conv1d(name: str) -> bool:
    return name.endswith(CONV1D_WEIGHTS)


def hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """minigpt weights under HF GPT2LMHeadModel's names and layouts (Conv1D matrices transposed).

    Load it with `GPT2LMHeadModel(GPT2Config(**hf_config_from_model(model.config))).load_state_dict(sd)`
    to give the Hugging Face model exactly this model's weights (bench.py compares the two this way).
    """
    hf_config_from_model(model.config)  # fail early on a config GPT-2 cannot express
    out = {}
    for name, tensor in model.state_dict().items():
        t = tensor.detach()
        out[name] = t.t().contiguous() if _is_conv1d(name) else t.clone()  # (in, out) for Conv1D
    return out


def minigpt_state_dict(hf_sd: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """HF GPT-2 tensors (with or without the `transformer.` prefix) -> minigpt names and layouts."""
    out = {}
    for name, tensor in hf_sd.items():
        if name.endswith(MASK_BUFFERS):
            continue
        if name != "lm_head.weight" and not name.startswith("transformer."):
            name = "transformer." + name  # a bare GPT2Model checkpoint
        out[name] = tensor.t() if _is_conv1d(name) else tensor  # Conv1D (in, out) -> Linear (out, in)
    if "lm_head.weight" not in out:
        if not cfg.tie_weights:
            raise UserError("the weights lack lm_head.weight but config.json sets tie_word_embeddings=false")
        out["lm_head.weight"] = out["transformer.wte.weight"]
    return out


def read_hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of a HF folder: model.safetensors, its sharded index, or pytorch_model.bin."""
    folder = Path(folder)
    try:
        if (folder / "model.safetensors").is_file():
            return load_file(str(folder / "model.safetensors"))
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            return {k: v for shard in shards for k, v in load_file(str(folder / shard)).items()}
        if (folder / "pytorch_model.bin").is_file():
            return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    except Exception as e:  # safetensors, torch.load and json raise several types for corrupt files
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"cannot read the GPT-2 weights in {folder}: {first[:200]} (corrupt file?)") from None
    raise UserError(f"{folder} has no model.safetensors or pytorch_model.bin; download the full model folder")


def load_hf_gpt2(folder: str | Path) -> GPT:
    """A minigpt GPT (float32, CPU, eval mode) holding the GPT-2 weights of a local HF folder."""
    folder = Path(folder).expanduser()
    if not (folder / "config.json").is_file():
        raise UserError(f"{folder} has no config.json; pass a HF GPT-2 folder (config.json + weights)")
    try:
        hf_cfg = json.loads((folder / "config.json").read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{folder / 'config.json'} is not valid JSON ({e})") from None
    cfg = config_from_hf(hf_cfg)
    model = GPT(cfg)
    sd = minigpt_state_dict(read_hf_weights(folder), cfg)
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(sd)), sorted(set(sd) - set(expected))
    if missing or unexpected:
        raise UserError(
            f"the GPT-2 weights do not match config.json: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    for name, tensor in sd.items():
        if tensor.shape != expected[name].shape:
            raise UserError(
                f"{name} has shape {tuple(tensor.shape)}; config.json needs {tuple(expected[name].shape)}"
            )
    model.load_state_dict(sd)  # copies, converting fp16/bf16 files to the model's float32
    return model.eval()


def export_hf_gpt2(model: GPT, folder: str | Path, eot_id: int | None = None) -> Path:
    """Write `model` as a HF GPT-2 folder (config.json + model.safetensors), loadable by GPT2LMHeadModel.

    The folder must not exist yet (nothing is overwritten); it is written under a temporary name
    and renamed, so a failure leaves no half-written folder behind.
    """
    folder = Path(folder).expanduser()
    if folder.exists():
        raise UserError(f"{folder} already exists; choose a new output folder (nothing was overwritten)")
    hf_cfg = hf_config_from_model(model.config, eot_id)
    sd = hf_state_dict(model)
    if model.config.tie_weights:
        del sd["lm_head.weight"]  # safetensors refuses shared storage; HF re-ties it from wte
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.float().cpu().contiguous() for k, v in sd.items()}, str(tmp / "model.safetensors"),
              metadata={"format": "pt"})  # HF checks this tag to know the tensors are PyTorch-layout
    (tmp / "config.json").write_text(json.dumps(hf_cfg, indent=2) + "\n")
    os.replace(tmp, folder)
    return folder
