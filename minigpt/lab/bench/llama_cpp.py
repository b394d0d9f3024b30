"""llama.cpp on the generation section's shape: the reference for decoding on a CPU.

The bench's GPT-2-like model (learned positions, pre-norm LayerNorm with biases, GELU, tied head) is
llama.cpp's `gpt2` architecture, so its weights go into a GGUF file name by name (`write_gguf`, with the
`gguf` package's writer and llama.cpp's tensor names) as f32, bf16 or q8_0 (blocks of 32 int8 weights with
one float16 scale each, quantised by the `gguf` package). This writer knows only this one shape of model
and writes no real tokenizer: the bench feeds token ids. llama-cpp-python then generates greedily from
the same prompt, with the same number of threads.

llama.cpp's GELU is the tanh approximation and its kernels sum in other orders, so its tokens are not
compared with minigpt's; only the speed is.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from minigpt.errors import UserError
from minigpt.model.gpt import GPT

# weights name -> (the GGUF file type, the type of its 2-D matrices)
WEIGHTS = ("f32", "bf16", "q8_0")


def _tensors(model: GPT) -> dict[str, np.ndarray]:
    """llama.cpp `gpt2` tensor name -> float32 array in minigpt's (out, in) layout, which is GGUF's."""
    t = model.transformer
    out = {"token_embd.weight": t.wte.weight, "position_embd.weight": t.wpe.weight,
           "output_norm.weight": t.ln_f.weight, "output_norm.bias": t.ln_f.bias,
           "output.weight": model.lm_head.weight}
    names = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
             "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
    for i, block in enumerate(t.h):
        for ours, theirs in names.items():
            module = block.get_submodule(ours)
            out[f"blk.{i}.{theirs}.weight"], out[f"blk.{i}.{theirs}.bias"] = module.weight, module.bias
    return {name: p.detach().float().cpu().numpy() for name, p in out.items()}


def write_gguf(model: GPT, path: Path, weights: str) -> Path:
    """`model` (the bench's GPT-2-like shape) as a GGUF file at `path`, matrices in `weights` (WEIGHTS)."""
    import gguf

    cfg = model.config
    qtype = {"f32": gguf.GGMLQuantizationType.F32, "bf16": gguf.GGMLQuantizationType.BF16,
             "q8_0": gguf.GGMLQuantizationType.Q8_0}[weights]
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "bf16": gguf.LlamaFileType.MOSTLY_BF16,
             "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[weights]
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_context_length(cfg.block_size)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_feed_forward_length(model.transformer.h[0].mlp.hidden)
    writer.add_block_count(cfg.n_layer)
    writer.add_head_count(cfg.n_head)
    writer.add_layer_norm_eps(cfg.norm_eps)
    writer.add_file_type(ftype)
    # a placeholder vocabulary of the right size: the bench feeds ids and never tokenises text
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"<{i}>" for i in range(cfg.vocab_size)])
    writer.add_token_merges(["< 0"])
    for name, array in _tensors(model).items():
        if array.ndim == 2 and name != "position_embd.weight" and qtype != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, gguf.quantize(array, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def llama_cpp_generate(path: Path, threads: int, context: int) -> Callable[[list[int], int], list[int]]:
    """A greedy generator over the GGUF model at `path`: (prompt ids, new tokens) -> the new ids."""
    try:
        import llama_cpp
    except ImportError:
        raise UserError("the llama.cpp comparison needs llama-cpp-python: pip install -e '.[llama]'") \
            from None
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=context, n_threads=threads, n_threads_batch=threads,
                          n_batch=context, verbose=False)
    n_vocab = llm.n_vocab()

    def generate(prompt: list[int], new_tokens: int) -> list[int]:
        llm.reset()
        llm.eval(prompt)
        out = []
        for _ in range(new_tokens):
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))
            out.append(int(np.argmax(logits)))  # the last position's logits
            llm.eval(out[-1:])
        return out

    return generate


def read_bytes_per_token(path: Path) -> int:
    """Bytes of the matrices one decode step reads: the file's tensors, less the two lookup tables (one row
    each per token) -- the same count as minigpt's `weight_bytes`."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    tables = ("token_embd.weight", "position_embd.weight")
    return int(sum(t.n_bytes for t in reader.tensors if t.name not in tables))


def available() -> bool:
    """Whether llama-cpp-python and gguf are importable here."""
    try:
        import gguf  # noqa: F401
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True

