"""What the trainer measures besides the training loss: val loss on fixed batches, a text sample, memory."""

from __future__ import annotations

import resource
import sys

import torch
from torch import nn

from minigpt.generation.generate import generate
from minigpt.generation.sampling import SamplingParams
from minigpt.training.device import Runtime


@torch.no_grad()
def evaluate(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], runtime: Runtime) -> float:
    """Mean cross-entropy over `batches` in eval mode (dropout off); restores the previous mode.

    The batches are the same at every evaluation, so successive values differ only because the model did.
    """
    was_training = model.training
    model.eval()
    total = torch.zeros((), device=runtime.device)
    for x, y in batches:  # x, y: (B, T)
        with runtime.autocast():
            _, loss = model(x, y)
        total += loss.float()
    model.train(was_training)
    return (total / len(batches)).item()


@torch.no_grad()
def sample_text(
    model: nn.Module, tokenizer, prompt: str, max_new_tokens: int, temperature: float, seed: int,
    device: torch.device,
) -> str:
    """A short continuation of `prompt` (or of a document start when empty), for eyeballing progress.

    Uses the KV-cached generator with its own seeded `torch.Generator`, never the global RNG, so sampling
    during training cannot change the training run.
    """
    was_training = model.training
    model.eval()
    ids = tokenizer.encode(prompt) if prompt else [tokenizer.eot_id]
    gen = torch.Generator(device=device).manual_seed(seed)
    params = SamplingParams(temperature=temperature)
    result = generate(model, [ids], max_new_tokens=max_new_tokens, params=params, generator=gen,
                      stop_ids=[tokenizer.eot_id])  # the end of a document ends the sample
    model.train(was_training)
    return prompt + tokenizer.decode(result.tokens[0])


def peak_memory_gib(device: torch.device) -> float:
    """Peak CUDA memory allocated by tensors, or else the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / (2**30 if sys.platform == "darwin" else 2**20)
