"""Configuration of the format tools (no torch here: Hydra's schemas import this module).

    ExportConfig    scripts/export.py     configs/export.yaml     interop/export.py
    ImportHFConfig  scripts/import_hf.py  configs/import_hf.yaml  interop/hf_import.py
"""

from __future__ import annotations

from dataclasses import dataclass

from minigpt.errors import UserError

FORMATS = ("hf", "gguf")
# what a Hugging Face folder can be written as: a transformers class, or minigpt's own modeling code
HF_FAMILIES = ("gpt2", "llama", "qwen3", "arcee", "custom")
# the tensor types llama.cpp's own converter offers for a float model; 1-d tensors always stay f32
GGUF_TYPES = ("f32", "f16", "bf16", "q8_0")


@dataclass
class ExportConfig:
    """Root of `configs/export.yaml`: a minigpt checkpoint -> a Hugging Face folder or a GGUF file."""

    checkpoint: str | None = None  # a checkpoint or run folder; None: the newest run under outputs/train
    format: str = "hf"  # hf: a transformers folder | gguf: one file for llama.cpp / Ollama
    out: str | None = None  # the folder (hf) or file (gguf) to create; it must not exist yet
    gguf_type: str | None = None  # gguf only: f32 | f16 | bf16 | q8_0; None: f32
    # hf only: gpt2 | llama | qwen3 | arcee | custom (minigpt's own modeling code); None: the transformers
    # class that computes the model, else custom
    hf_family: str | None = None

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise UserError(f"format={self.format!r} is not one of: {', '.join(FORMATS)}")
        self._check_format_key("hf_family", self.hf_family, "hf", HF_FAMILIES, "")
        self._check_format_key("gguf_type", self.gguf_type, "gguf", GGUF_TYPES,
                               " (a Hugging Face folder holds float32 weights)")

    def _check_format_key(self, key: str, value: str | None, fmt: str, allowed: tuple[str, ...],
                          why: str) -> None:
        """A key of one format's (left out: None) is given with that format and one of `allowed`."""
        if value is None:
            return
        if self.format != fmt:
            raise UserError(f"{key}={value} applies only to format={fmt}{why}; drop it or set format={fmt}")
        if value not in allowed:
            raise UserError(f"{key}={value!r} is not one of: {', '.join(allowed)}")

    @property
    def tensor_type(self) -> str:
        """The GGUF tensor type of the 2-d weights."""
        return self.gguf_type or "f32"

    def out_path(self) -> str:
        """`out`, which has no default (an export never guesses where to write); UserError without it."""
        if not self.out:
            example = "outputs/export/model-hf" if self.format == "hf" else "outputs/export/model.gguf"
            raise UserError(f"out= is required: the {'folder' if self.format == 'hf' else 'file'} to create, "
                            f"e.g. out={example}")
        return self.out


@dataclass
class ImportHFConfig:
    """Root of `configs/import_hf.yaml`: a Hugging Face GPT-2 or Llama folder -> a minigpt checkpoint."""

    source: str | None = None  # the HF folder: config.json + model.safetensors (or pytorch_model.bin)
    out: str | None = None  # the checkpoint folder to create; it must not exist yet
    # a minigpt tokenizer folder; None: the folder's tokenizer.json (tiktoken's gpt2 for a GPT-2 without one).
    # Not `tokenizer`: that names the tokenizer config group (configs/tokenizer/) on Hydra's command line.
    tokenizer_dir: str | None = None

    def paths(self) -> tuple[str, str]:
        """(source, out), which have no defaults; UserError naming the one that is missing."""
        if not self.source:
            raise UserError("source= is required: a Hugging Face model folder, e.g. source=path/to/gpt2")
        if not self.out:
            raise UserError("out= is required: the checkpoint folder to create, e.g. out=outputs/imported")
        return self.source, self.out
