"""What the trainer measures besides the training loss: validation loss, perplexity and bits per byte on
fixed windows spread over the whole val split, samples, attention maps, and memory."""

from __future__ import annotations

import math
import resource
import sys
from collections.abc import Iterator

import numpy as np
import torch
from torch import nn

from minigpt.cluster import distributed
from minigpt.cluster.dist_env import DistEnv
from minigpt.data.eval_windows import EvalWindows, eval_batches, eval_windows
from minigpt.data.shards import TokenSplit
from minigpt.data.tokenizers import Tokenizer
from minigpt.device.runtime import Runtime
from minigpt.inspect.perplexity import Score, score_batches
from minigpt.sampling.decode import sample_text
from minigpt.training.config import LoggingConfig


class Evaluation:
    """Validation during a run: the score of fixed windows over the val split, a sample, attention maps.

    The windows (`data/eval_windows.py`) depend only on the split's length, `block_size` and the budget
    (`trainer.eval_tokens`; None: every target once), so every evaluation of every run on the same data
    scores the same text, and successive values differ only because the model did. The batches are read
    from the memory-mapped split at each evaluation; none is kept on the device between them.
    """

    def __init__(self, model: nn.Module, val: TokenSplit, block_size: int, budget: int | None,
                 batch_size: int, runtime: Runtime, env: DistEnv, tokenizer: Tokenizer,
                 logging_cfg: LoggingConfig, seed: int) -> None:
        self.model, self.val, self.batch_size, self.runtime, self.env = model, val, batch_size, runtime, env
        self.tokenizer, self.logging_cfg, self.seed = tokenizer, logging_cfg, seed
        self.windows = eval_windows(len(val), block_size, budget)  # a too-short split fails here, one line
        self.token_bytes = tokenizer.token_byte_lengths()
        self.last: Score | None = None  # of the latest evaluation

    def score(self) -> Score:
        """Loss, perplexity and bits per byte of the model on the windows: the same number on every rank.

        Rank r scores batches r, r + N, r + 2N, ... and the sums are added over ranks (token-weighted).
        Under FSDP every forward is a collective, so a rank with one batch fewer runs one more, uncounted.
        """
        n_batches = -(-len(self.windows) // self.batch_size)
        mine = range(self.env.rank, n_batches, self.env.world_size)
        score = score_batches(self.model, self._batches(mine), self.runtime.autocast)
        if distributed.is_sharded(self.model) and len(mine) < -(-n_batches // self.env.world_size):
            score_batches(self.model, self._batches(range(1)), self.runtime.autocast)  # uncounted
        nats, tokens, nbytes = distributed.sum_over_ranks([score.nats, score.tokens, score.bytes], self.env)
        self.last = Score(nats, int(tokens), int(nbytes))
        return self.last

    def _batches(self, batch_indices: range) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """The batches `batch_indices` (of `batch_size` windows each, in order) as (x, y, target_bytes)."""
        w, B = self.windows, self.batch_size
        rows = np.concatenate([np.arange(i * B, min((i + 1) * B, len(w))) for i in batch_indices] or [[]])
        rows = rows.astype(np.int64)
        subset = EvalWindows(w.starts[rows], w.scored[rows], w.block_size)
        for b in eval_batches(self.val, subset, B, token_bytes=self.token_bytes, device=self.runtime.device):
            yield b.x, b.y, b.target_bytes

    def describe(self) -> dict:
        """What was scored, for meta.json: the windows and the latest score's totals."""
        last = self.last or Score(math.nan, 0, 0)
        return {"windows": len(self.windows), "block_size": self.windows.block_size,
                "targets": self.windows.n_targets, "bytes": last.bytes, "val_tokens": len(self.val)}

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

        T = min(32, self.windows.block_size)
        first = torch.from_numpy(self.val.read(int(self.windows.starts[0]), T).astype(np.int64))  # (T,) ids
        log_attention_images(writer, self.model, first.to(self.runtime.device), step, self.tokenizer)


def peak_memory_gib(device: torch.device) -> float:
    """Peak CUDA memory allocated by tensors, or else the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / (2**30 if sys.platform == "darwin" else 2**20)
