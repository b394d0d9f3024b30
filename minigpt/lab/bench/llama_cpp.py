"""llama.cpp on the generation section's shape: the reference for decoding on a CPU.

The bench's GPT-2-like model (learned positions, pre-norm LayerNorm with biases, GELU, tied head) is
llama.cpp's `gpt2` architecture, so its weights go into a GGUF file as the export lays them out
(`minigpt/interop/gguf_export.py`: llama.cpp's tensor names, f32, bf16 or q8_0 through the `gguf` package),
with no real tokenizer: the bench feeds token ids. llama-cpp-python then generates greedily from
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

# the weights' GGUF types, as scripts/export.py names them
WEIGHTS = ("f32", "bf16", "q8_0")


def write_gguf(model: GPT, path: Path, weights: str) -> Path:
    """`model` (the bench's GPT-2-like shape) as a GGUF file at `path`, its matrices in `weights` (WEIGHTS):
    the tensors and sizes exactly as the export writes them, with a placeholder vocabulary of the right
    size instead of a tokenizer."""
    import gguf

    from minigpt.interop.gguf_export import TENSOR_TYPES, add_hyperparameters, encode_tensor, gguf_tensors

    arch, tensors = gguf_tensors(model)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_file_type(TENSOR_TYPES[weights][1])
    add_hyperparameters(writer, model, arch)
    writer.add_tokenizer_model("gpt2")  # the bench feeds ids and never tokenises text
    writer.add_token_list([f"<{i}>" for i in range(model.config.vocab_size)])
    writer.add_token_merges(["< 0"])
    for name, tensor in tensors.items():
        data, qtype = encode_tensor(name, tensor, weights)
        writer.add_tensor(name, data, raw_dtype=qtype)
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

    tensors = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors}
    tables = ["position_embd.weight"]
    if "output.weight" in tensors:  # else the head is token_embd, read whole every step
        tables.append("token_embd.weight")
    return sum(n for name, n in tensors.items() if name not in tables)


def available() -> bool:
    """Whether llama-cpp-python and gguf are importable here."""
    try:
        import gguf  # noqa: F401
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True

