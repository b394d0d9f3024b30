"""What the trainer measures besides the training loss: val loss on fixed batches, samples, attention maps,
and memory."""

from __future__ import annotations

import resource
import sys

import torch
from torch import nn

from minigpt.data.tokenizers import Tokenizer
from minigpt.device.runtime import Runtime
from minigpt.sampling.decode import sample_text
from minigpt.training import distributed
from minigpt.training.config import LoggingConfig
from minigpt.training.dist_env import DistEnv


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


class Evaluation:
    """Validation during a run: the loss on fixed batches (averaged over ranks), a sample, attention maps."""

    def __init__(self, model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], runtime: Runtime,
                 env: DistEnv, tokenizer: Tokenizer, logging_cfg: LoggingConfig, seed: int) -> None:
        self.model, self.batches, self.runtime, self.env = model, batches, runtime, env
        self.tokenizer, self.logging_cfg, self.seed = tokenizer, logging_cfg, seed

    def val_loss(self) -> float:
        """Every rank evaluates the same batches (FSDP needs all ranks in every forward); the mean over ranks
        makes the value identical on all of them."""
        return distributed.mean_over_ranks(evaluate(self.model, self.batches, self.runtime), self.env)

    def sample(self) -> str:
        """A text sample from rank 0 (the other ranks return "", after helping to gather FSDP shards)."""
        lc = self.logging_cfg
        if lc.sample_tokens == 0:
            return ""
        model = distributed.whole_model(self.model, self.env)
        if model is None:
            return ""
        return sample_text(model, self.tokenizer, lc.sample_prompt, lc.sample_tokens, lc.sample_temperature,
                           self.seed)

    def attention_images(self, writer, step: int) -> None:
        """Every head's attention map on the start of the first val window, as a TensorBoard image (rank 0,
        and not under FSDP, where every forward needs all ranks)."""
        if writer is None or distributed.is_sharded(self.model):
            return
        from minigpt.inspect.attention_maps import log_attention_images  # matplotlib only when asked for

        first_val_row = self.batches[0][0][0, :32]  # (T<=32,) token ids
        log_attention_images(writer, self.model, first_val_row, step, self.tokenizer)


def peak_memory_gib(device: torch.device) -> float:
    """Peak CUDA memory allocated by tensors, or else the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / (2**30 if sys.platform == "darwin" else 2**20)
