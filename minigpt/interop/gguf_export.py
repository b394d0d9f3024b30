"""A minigpt model as one GGUF file, the format llama.cpp (and Ollama, llama-cpp-python) runs, written with
the `gguf` package llama.cpp publishes.

The weights are first named as their family names them (family_weights.py), and gguf's own map of those
names (`gguf.get_tensor_name_map`) gives the GGUF ones (`blk.0.attn_q.weight`, ...), so the file is laid
out as llama.cpp's converter would lay out the same model. The metadata holds the sizes llama.cpp's `gpt2`,
`llama`, `qwen3` or `arcee` graph reads and the tokenizer (gguf_vocab.py). The technique switches that no
graph of llama.cpp computes (value embeddings, the smear, the residual scalars, ...) are refused all at once
in one line that names the portable preset to train instead.

RoPE pairing. llama.cpp's `llama` and `arcee` graphs rotate adjacent pairs (2i, 2i+1) of each head;
minigpt (and HF) pair dimension i with i + D/2. Reordering the rows of W_q and W_k (and their biases) in
every head from [0 .. D/2-1 | D/2 .. D-1] to [0, D/2, 1, D/2+1, ...] makes the adjacent-pair rotation compute
exactly the rotate-half one; q·k is unchanged, as both are reordered alike (`interleave_rope_rows`). Its
`qwen3` graph rotates halves, as minigpt does, so a qwen3 model's rows (and its query and key norms) stay as
they are.

Tensor types: f32 keeps every number. f16, bf16 and q8_0 convert the 2-d weights and keep the 1-d tensors
(norms, biases) and GPT-2's position table in f32, as llama.cpp's converter does. q8_0 stores blocks of 32
values as int8 with one f16 scale per block, so a weight whose rows are no multiple of 32 falls back to f16
(also as llama.cpp's converter does). llama.cpp's `gpt2` graph computes the tanh approximation of GELU, so
only model.activation=gelu_tanh exports as gpt2.

ReLU² (`arcee`) and half precision: llama.cpp multiplies a float16 weight by activations it first rounds to
float16 too, whose largest value is 65,504; the squared activations entering the down projection grow fast
with training, so an f16 file of a ReLU² model can overflow where bf16 (float32's range) and q8_0 (a float16
scale per 32 values, amax / 127) cannot. docs/export.md has the figures of a trained model.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

import gguf
import numpy as np
import torch

from minigpt.data.tokenizers import Tokenizer
from minigpt.errors import UserError
from minigpt.interop.architecture import (
    ARCEE,
    GPT2,
    LLAMA,
    QWEN3,
    architecture_of,
    features_without_family,
    technique_switches,
)
from minigpt.interop.family_weights import gpt2_weights, llama_weights
from minigpt.interop.gguf_vocab import add_vocabulary, gguf_vocabulary
from minigpt.interop.staging import staged_output
from minigpt.model.ffn import ffn_hidden_size
from minigpt.model.gpt import GPT

Q = gguf.GGMLQuantizationType
# gguf_type -> (the 2-d weights' tensor type, general.file_type)
TENSOR_TYPES = {
    "f32": (Q.F32, gguf.LlamaFileType.ALL_F32), "f16": (Q.F16, gguf.LlamaFileType.MOSTLY_F16),
    "bf16": (Q.BF16, gguf.LlamaFileType.MOSTLY_BF16), "q8_0": (Q.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
}
ARCHS = {GPT2: gguf.MODEL_ARCH.GPT2, LLAMA: gguf.MODEL_ARCH.LLAMA, QWEN3: gguf.MODEL_ARCH.QWEN3,
         ARCEE: gguf.MODEL_ARCH.ARCEE}
ADJACENT_PAIRS = (LLAMA, ARCEE)  # llama.cpp rotates (2i, 2i+1) in these graphs; qwen3's rotates halves
PORTABLE = "model=demo"  # the best measured preset every format carries (docs/export.md)
KEEP_F32 = (gguf.MODEL_TENSOR.POS_EMBD,)  # 2-d, but a table of additive offsets: kept exact


def interleave_rope_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(n_heads·D, ...) rows of W_q or W_k (or a bias), rotate-half order -> adjacent-pair order per head."""
    half = w.shape[0] // n_heads // 2
    w = w.reshape(n_heads, 2, half, *w.shape[1:])  # (heads, 2 halves, D/2, ...)
    return w.transpose(1, 2).reshape(-1, *w.shape[3:])  # (heads, D/2, 2, ...) -> rows 0, D/2, 1, D/2+1, ...


def gguf_tensors(model: GPT) -> tuple[str, dict[str, torch.Tensor]]:
    """(llama.cpp architecture, GGUF tensor name -> float32 tensor in nn.Linear's (out, in) layout).
    Refuses what neither graph has; whether llama.cpp's gpt2 graph computes the same GELU is export_gguf's
    check (the bench times an exact-GELU model there, for speed only)."""
    cfg = model.config
    family = gguf_family(cfg)
    if family == GPT2:
        named = gpt2_weights(model)  # minigpt's names are GPT-2's, in Linear layout (no Conv1D here)
        if cfg.tie_weights:
            del named["lm_head.weight"]  # llama.cpp reuses token_embd when there is no output tensor
    else:
        named = llama_weights(model)
        for name in list(named) if family in ADJACENT_PAIRS else ():  # the module docstring
            if ".self_attn.q_proj." in name or ".self_attn.k_proj." in name:
                heads = cfg.n_head if ".q_proj." in name else cfg.kv_heads
                named[name] = interleave_rope_rows(named[name], heads)
    arch = ARCHS[family]
    names = gguf.get_tensor_name_map(arch, cfg.n_layer)
    out = {}
    for name, tensor in named.items():
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:  # every name above is one llama.cpp's converter maps: a bug if not
            raise RuntimeError(f"gguf has no tensor name for {name}")
        out[gguf_name] = tensor.detach().float().cpu()
    return gguf.MODEL_ARCH_NAMES[arch], out


def gguf_family(cfg) -> str:
    """The llama.cpp graph that computes `cfg`; a UserError naming every switch none computes, and what to
    do instead, for a model with technique switches (model=recipe has several)."""
    if technique_switches(cfg):
        features = features_without_family(cfg)
        raise UserError(f"{', '.join(features)} {'has' if len(features) == 1 else 'have'} no GGUF "
                        "equivalent: no llama.cpp graph computes them; export it with format=hf (its own "
                        f"modeling code carries them), or train {PORTABLE} (a Llama block) for llama.cpp")
    return architecture_of(cfg, target="GGUF")


def encode_tensor(name: str, tensor: torch.Tensor, gguf_type: str) -> tuple[np.ndarray, Q]:
    """The bytes (as gguf lays them out) and tensor type of one weight for the asked `gguf_type`."""
    data = tensor.numpy()
    qtype = TENSOR_TYPES[gguf_type][0]
    if data.ndim == 1 or any(name == gguf.TENSOR_NAMES[t] + ".weight" for t in KEEP_F32):
        qtype = Q.F32
    try:
        return gguf.quants.quantize(data, qtype), qtype
    except gguf.QuantError:  # rows too short for q8_0's blocks of 32
        return gguf.quants.quantize(data, Q.F16), Q.F16


def add_hyperparameters(writer: gguf.GGUFWriter, model: GPT, arch: str) -> None:
    cfg = model.config
    writer.add_context_length(cfg.block_size)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_feed_forward_length(ffn_hidden_size(cfg))
    writer.add_block_count(cfg.n_layer)
    writer.add_head_count(cfg.n_head)
    writer.add_vocab_size(cfg.vocab_size)
    if arch == gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.GPT2]:
        writer.add_layer_norm_eps(cfg.norm_eps)
        return
    writer.add_head_count_kv(cfg.kv_heads)
    writer.add_layer_norm_rms_eps(cfg.norm_eps)
    writer.add_rope_freq_base(cfg.rope_base)
    writer.add_rope_dimension_count(cfg.head_dim)  # every dimension of the head is rotated


def export_gguf(model: GPT, tokenizer: Tokenizer, out: str | Path, gguf_type: str, name: str) -> Path:
    """Write `model` and its tokenizer as a new GGUF file `out`; returns it. Refusals precede any write."""
    arch, tensors = gguf_tensors(model)
    activation = model.config.activation
    if arch == gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.GPT2] and activation != "gelu_tanh":
        raise UserError(f"model.activation={activation} has no GGUF equivalent: llama.cpp's gpt2 "
                        "graph computes the tanh approximation of GELU (model.activation=gelu_tanh)")
    vocab = gguf_vocabulary(tokenizer, model.config.vocab_size)
    encoded = {n: encode_tensor(n, t, gguf_type) for n, t in tensors.items()}
    with staged_output(Path(out), folder=False) as tmp:
        writer = gguf.GGUFWriter(str(tmp), arch)
        writer.add_name(name)
        writer.add_file_type(TENSOR_TYPES[gguf_type][1])
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        add_hyperparameters(writer, model, arch)
        add_vocabulary(writer, vocab)
        for tensor_name, (data, qtype) in encoded.items():
            writer.add_tensor(tensor_name, data, raw_dtype=qtype)
        _write(writer, tmp)
    return Path(out).expanduser()


def _write(writer: gguf.GGUFWriter, file: Path) -> None:
    """gguf writes the file's header, metadata and tensors. It writes the tensors with numpy's `tofile`, which
    reports a short write (a full disk, a file size limit) as "1152 requested and 32 written", without the
    OSError's errno: one more byte appended to the file then fails with the real cause."""
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    except OSError as e:
        with contextlib.suppress(OSError):
            writer.close()  # its buffer cannot be written either
        raise e if e.errno is not None else _cause_of_short_write(file) from None


def _cause_of_short_write(file: Path) -> OSError:
    fd = os.open(file, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b"\0")
    except OSError as e:
        return OSError(e.errno, e.strerror, str(file))
    finally:
        os.close(fd)
    return OSError(errno.EIO, "a write stopped short", str(file))
