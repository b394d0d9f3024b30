"""Configuration of `scripts/generate.py` (YAML `configs/generate.yaml`, flat keys such as `temperature=0.5`).
No torch is imported here."""

from __future__ import annotations

from dataclasses import dataclass, field

from minigpt.device.config import InferenceDeviceConfig, check_weights_dtype
from minigpt.errors import UserError
from minigpt.sampling.params import SamplingParams, validate_sampling

COMPILE = ("true", "false", "auto")


@dataclass
class GenerateConfig:
    checkpoint: str | None = None  # a checkpoint folder, a run folder, or null: the latest run under outputs/
    prompt: str = ""  # empty: an unconditional sample, started from the end-of-text token
    prompt_file: str | None = None  # read the prompt from this file instead
    num_samples: int = 1  # samples of the same prompt, decoded together as one batch
    max_new_tokens: int = 200
    temperature: float = 0.8  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int = 1337
    device: InferenceDeviceConfig = field(default_factory=InferenceDeviceConfig)  # `device=cpu|cuda|mps`
    # of the weights and the KV cache; auto: bfloat16 on CUDA, float32 elsewhere; int8: weight-only int8
    # linear layers (model/int8.py) with float activations, their dtype measured (minigpt/fast/int8.py)
    weights_dtype: str = "auto"
    kv_cache: bool = True  # false: the naive reference, re-running the whole window every token
    # torch.compile the decode step (minigpt/fast/step.py): true, false, or auto: where the tokens asked for
    # are expected to pay for compiling (generation/auto.py); not the default: docs/decoding.md says why
    compile: str = "false"
    cache_dir: str = "outputs/data"  # the data cache folder: compiled decode steps are kept in its decode/
    draft: str | None = None  # speculative decoding: a smaller checkpoint, same tokenizer, proposes tokens
    num_draft_tokens: int = 4  # tokens the draft proposes per forward of the model (with draft=)
    stream: bool = True  # print the first sample token by token as it is generated
    interactive: bool = False  # a REPL: each line is appended to one running session
    stop: list[str] = field(default_factory=list)  # stop strings, besides the end-of-text token
    window_keep_ratio: float = 0.5  # share of the context kept when the window is rebuilt

    def __post_init__(self) -> None:
        self.compile = str(self.compile).lower()  # `compile=true` arrives as a bool
        if self.compile not in COMPILE:
            raise UserError(f"compile={self.compile} must be one of {', '.join(COMPILE)}")
        validate_sampling(self.temperature, self.top_k, self.top_p)
        check_weights_dtype(self.weights_dtype, int8=True)
        if self.max_new_tokens < 0:
            raise UserError(f"max_new_tokens={self.max_new_tokens} must be >= 0")
        if self.num_samples < 1:
            raise UserError(f"num_samples={self.num_samples} must be at least 1")
        if self.prompt and self.prompt_file:
            raise UserError("give either prompt= or prompt_file=, not both")
        if not 0.0 < self.window_keep_ratio <= 1.0:
            raise UserError(f"window_keep_ratio={self.window_keep_ratio} must be in (0, 1]")
        if self.interactive and self.num_samples != 1:
            raise UserError("interactive=true runs one conversation; drop num_samples (or set it to 1)")
        if self.num_draft_tokens < 1:
            raise UserError(f"num_draft_tokens={self.num_draft_tokens} must be at least 1")
        if self.draft is not None:
            for key, value, plain in (("num_samples", self.num_samples, 1), ("kv_cache", self.kv_cache, True),
                                      ("interactive", self.interactive, False)):
                if value != plain:
                    raise UserError(f"draft= decodes one sample with the KV cache, outside interactive mode; "
                                    f"{key}={value} cannot be combined with it (drop draft=, or {key})")

    def sampling(self, vocab_size: int | None = None) -> SamplingParams:
        """The sampling knobs; `vocab_size` (the tokenizer's) keeps padded model ids from being drawn."""
        return SamplingParams(self.temperature, self.top_k, self.top_p, vocab_size)
