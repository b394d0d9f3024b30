"""The training loop: `train(cfg, out_dir)` prepares the data, builds the model, and optimises it.

One *step* is one optimizer update over `grad_accum_steps` micro-batches; every counter, schedule and
TensorBoard x-axis uses it. The hot path (micro-batches, backward, clip, update) never waits for the device:
the loss and the gradient norm stay tensors, read (`.item()`, a host sync) only every `log_every` steps.

Under torchrun (`env`, see `distributed.py`) every rank runs this same loop on its own data stream; the model
is wrapped for DDP or FSDP2, only rank 0 writes (checkpoints, TensorBoard), and `tokens_per_step` counts every
rank's tokens. The ranks take every decision together (stop, skip, save `best`), so no rank waits for a
collective the others never reach. SIGINT/SIGTERM end the run cleanly after the current step (`signals.py`).
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from minigpt.config import TrainConfig, to_plain_dict
from minigpt.data.loader import BatchLoader, iter_eval_batches
from minigpt.data.prepare import prepare_dataset
from minigpt.errors import UserError
from minigpt.model import ModelConfig, build_model
from minigpt.training import checkpoint as ckpt
from minigpt.training import distributed
from minigpt.training.device import peak_flops, resolve_runtime
from minigpt.training.distributed import DistEnv
from minigpt.training.evaluation import evaluate, peak_memory_gib, sample_text
from minigpt.training.optim import build_optimizer, build_scheduler
from minigpt.training.signals import GracefulStop
from minigpt.training.step import NonFiniteGuard, accumulate_gradients, optimizer_step
from minigpt.training.tensorboard import TensorBoardLogger

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """What a finished run reports back to its caller (the script prints it; tests check it)."""

    step: int
    tokens_seen: int
    first_val_loss: float
    val_loss: float
    best_val_loss: float
    tokens_per_s: float
    sample: str
    checkpoint: Path
    interrupted: bool = False  # stopped early by SIGINT/SIGTERM, after writing `checkpoint`
    skipped_steps: int = 0  # updates skipped for a non-finite loss (trainer.on_nonfinite=skip)


def train(cfg: TrainConfig, out_dir: Path, *, env: DistEnv | None = None) -> TrainResult:
    """Train per `cfg`, writing checkpoints and TensorBoard logs under `out_dir` (rank 0 only).

    `env` is this process's place in a torchrun job, whose process group is already initialised; None: alone.
    """
    return Trainer(cfg, Path(out_dir), env=env or DistEnv()).fit()


def seed_everything(seed: int) -> None:
    """Seed every global RNG the run may touch (dropout uses torch's; the loader has its own generator)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


class Trainer:
    """Holds the run's state. `__init__` builds everything (and resumes, if asked); `fit()` runs the loop."""

    def __init__(self, cfg: TrainConfig, out_dir: Path, *, env: DistEnv) -> None:
        self.cfg, self.out_dir, self.env = cfg, out_dir, env
        self.is_main, world_size = env.is_main, env.world_size
        tc = cfg.trainer
        resume_from = self._resume_source()  # checked before any work, so a bad path fails at once
        self.runtime = resolve_runtime(cfg.device, local_rank=env.local_rank)
        device = self.runtime.device
        seed_everything(tc.seed)

        with distributed.main_process_first(env):  # rank 0 tokenises into the cache, the others reuse it
            self.data = prepare_dataset(cfg.data, cfg.tokenizer, Path(cfg.data.cache_dir),
                                        progress=self.is_main and cfg.logging.progress_bar)
        self.tokenizer = self.data.tokenizer
        vocab = self.tokenizer.vocab_size
        if cfg.model.vocab_size is not None and cfg.model.vocab_size < vocab:
            raise UserError(
                f"model.vocab_size={cfg.model.vocab_size} is smaller than the tokenizer's {vocab} tokens "
                "(set model.vocab_size=null to take it from the tokenizer)"
            )
        self.model = build_model(cfg.model, vocab_size=cfg.model.vocab_size or vocab).to(device)
        state = self._read_checkpoint(resume_from) if resume_from is not None else None  # loads the weights
        # `model` stays the plain module (DDP wraps it; FSDP2 shards it in place); the compiled wrapper runs
        # the training steps, while evaluation and sampling use `model`, so eval mode and growing sample
        # lengths trigger no recompilations.
        wrapped = distributed.wrap_model(self.model, tc.strategy, env, device)
        self.train_model = torch.compile(wrapped) if self.runtime.compile else wrapped

        block = cfg.model.block_size
        self.grad_accum_steps = self._grad_accum_steps(block)
        self.tokens_per_step = tc.batch_size * block * self.grad_accum_steps * world_size
        self.optimizer = build_optimizer(self.model, cfg.optim, device.type)
        self.scheduler = build_scheduler(self.optimizer, cfg.optim, tc.max_steps)
        self.scaler = self.runtime.grad_scaler()
        self.loader = BatchLoader(self.data.train_path, block, tc.batch_size, seed=tc.seed, rank=env.rank,
                                  world_size=world_size, device=str(device))
        self.val_batches = list(iter_eval_batches(self.data.val_path, block, tc.batch_size, str(device),
                                                  max_batches=tc.eval_batches))
        if not self.val_batches:
            raise UserError(f"the validation split of {self.data.dir} is shorter than one block of {block} "
                            "tokens (lower model.block_size or use more data)")
        self.step, self.tokens_seen, self.last_saved, self.last_saved_step = 0, 0, None, 0
        self.first_val_loss = self.val_loss = self.best_val_loss = math.inf
        self.nonfinite = NonFiniteGuard(tc.on_nonfinite, device)
        self.flops_per_token = self.model.flops_per_token()
        self.peak_flops = peak_flops(cfg.device, self.runtime)
        if state is not None:
            self._restore(state)
            log.info("resumed from %s at step %d (%s tokens seen)", resume_from, self.step,
                     f"{self.tokens_seen:,}")
        log.info("model: %s parameters (%s without embeddings); %s tokens per step "
                 "(%d x %d x %d accum x %d ranks)", f"{self.model.num_params(non_embedding=False):,}",
                 f"{self.model.num_params():,}",
                 f"{self.tokens_per_step:,}", tc.batch_size, block, self.grad_accum_steps, world_size)

    # ------------------------------------------------------------------------------------------ set-up

    def _grad_accum_steps(self, block: int) -> int:
        tc = self.cfg.trainer
        if tc.tokens_per_step is None:
            return tc.grad_accum_steps
        micro = tc.batch_size * block * self.env.world_size
        if tc.tokens_per_step % micro:
            raise UserError(
                f"trainer.tokens_per_step={tc.tokens_per_step} is not a multiple of "
                f"batch_size x block_size x world_size = {micro} "
                f"(try {max(1, round(tc.tokens_per_step / micro)) * micro})"
            )
        return tc.tokens_per_step // micro

    def _resume_source(self) -> Path | None:
        """The checkpoint to resume from, or None; refuses to overwrite an existing run's checkpoint."""
        resume = self.cfg.trainer.resume
        folder = self.out_dir / "checkpoints"
        if resume == "auto":
            # `last`, or `.last.old` when a crash hit between the two renames of a checkpoint swap
            if any((folder / name / ckpt.META).is_file() for name in ("last", ".last.old")):
                return ckpt.resolve_checkpoint(self.out_dir)
            log.info("trainer.resume=auto: no checkpoint in %s yet, starting from scratch", self.out_dir)
            return None
        if resume is not None:
            return ckpt.resolve_checkpoint(resume)
        if (folder / "last").exists() or (folder / ".last.old").exists():
            raise UserError(
                f"{self.out_dir} already holds a checkpoint; continue it with trainer.resume=auto, "
                "or choose another hydra.run.dir"
            )
        return None

    def _read_checkpoint(self, path: Path) -> dict:
        """Check that `path` fits this run and load its weights into the (not yet wrapped) model; return the
        rest of its state for `_restore`."""
        meta = ckpt.read_meta(path)
        # keys the checkpoint predates (e.g. the ablation switches) mean their defaults, as they did then
        saved = {**to_plain_dict(ModelConfig()), **(meta.get("model_config") or {})}
        if saved != to_plain_dict(self.model.config):
            raise UserError(f"checkpoint {path} was trained with a different model config; resume with the "
                            "same model=... overrides (see its meta.json)")
        distributed.check_resume_world_size(meta.get("world_size", 1), self.env, path)
        if meta.get("step", 0) > self.cfg.trainer.max_steps:
            raise UserError(f"trainer.max_steps={self.cfg.trainer.max_steps} is below the step of checkpoint "
                            f"{path} ({meta['step']}); raise trainer.max_steps to continue training")
        ckpt.load_weights(self.model, path)
        return ckpt.load_state(path)

    def _restore(self, state: dict) -> None:
        """Continue exactly where the checkpoint stopped: optimizer, schedule, RNG and data order."""
        distributed.load_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.loader.load_state_dict(state["loader"])  # ranks > 0 replay their own stream to the same point
        ckpt.set_rng_state(state["rng"])
        self.step, self.tokens_seen = state["step"], state["tokens_seen"]
        self.first_val_loss, self.best_val_loss = state["first_val_loss"], state["best_val_loss"]

    # ------------------------------------------------------------------------------------------ the loop

    def fit(self) -> TrainResult:
        tc, lc = self.cfg.trainer, self.cfg.logging
        config_text = OmegaConf.to_yaml(to_plain_dict(self.cfg))
        interrupted, sample = False, ""
        tb = TensorBoardLogger(self.out_dir / "tb", enabled=self.is_main and lc.tensorboard)
        with GracefulStop() as stop, tb as self.tb:
            self.tb.text("config", config_text, self.step)
            bar = tqdm(total=tc.max_steps, initial=self.step, unit="step", dynamic_ncols=True,
                       disable=not (self.is_main and lc.progress_bar))
            self._window_start, self._window_steps, self._window_time = time.perf_counter(), 0, 0.0
            self._total_steps, self._total_time = 0, 0.0
            with logging_redirect_tqdm(), bar:
                while self.step < tc.max_steps:
                    if self.step % tc.eval_every == 0:
                        self._eval_and_log()
                    loss, grad_norm, lr = self._train_step()
                    self.step += 1
                    self.tokens_seen += self.tokens_per_step
                    self._window_steps += 1
                    bar.update(1)
                    if self.step % lc.log_every == 0 or self.step == tc.max_steps:
                        self._log_interval(loss, grad_norm, lr, bar)
                    # The ranks agree on stopping (one tiny CPU all-reduce), so they stop at the same step.
                    if distributed.any_rank(stop.requested, self.env):
                        interrupted = True
                        break
                    if self.step % tc.ckpt_every == 0 and self.step < tc.max_steps:
                        self._pause_clock(lambda: self._save("last"))
            if not interrupted:
                self._eval_and_log()
            self._save("last")
            tokens_per_s = self._total_steps * self.tokens_per_step / max(self._total_time, 1e-9)
            if not interrupted:
                sample = self._sample()
                final = {"val_loss": self.val_loss, "best_val_loss": self.best_val_loss,
                         "tokens_per_s": tokens_per_s}
                self.tb.final(to_plain_dict(self.cfg), final)
        if interrupted and self.is_main:
            log.warning("stopped by %s at step %d; checkpoint written to %s", stop.signal_name, self.step,
                        self.last_saved)
        elif not interrupted:
            log.info("done: step %d, val loss %.4f (best %.4f, first %.4f), %s tok/s", self.step,
                     self.val_loss, self.best_val_loss, self.first_val_loss, f"{tokens_per_s:,.0f}")
        return TrainResult(self.step, self.tokens_seen, self.first_val_loss, self.val_loss,
                           self.best_val_loss, tokens_per_s, sample, self.out_dir / "checkpoints" / "last",
                           interrupted, self.nonfinite.skipped)

    def _train_step(self) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One optimizer update; returns (mean loss, pre-clip grad norm) as device tensors and the lr used."""
        self.train_model.train()
        loss = accumulate_gradients(self.train_model, self.loader.next_batch, self.grad_accum_steps,
                                    self.runtime, self.scaler)
        if self.nonfinite.should_skip(loss, self.step + 1, self.env):
            self.optimizer.zero_grad(set_to_none=True)
            lr = self.optimizer.param_groups[0]["lr"]
            self.scheduler.step()  # the step still counts: the schedule stays aligned with the step number
            return loss, torch.full((), math.nan), lr
        grad_norm, lr = optimizer_step(self.model, self.optimizer, self.scheduler, self.scaler,
                                       self.cfg.optim.grad_clip)
        return loss, grad_norm, lr

    # ------------------------------------------------------------------------------------------ reporting

    def _pause_clock(self, fn) -> None:
        """Run `fn` (evaluation, checkpointing) outside the throughput clock."""
        self.runtime.synchronize()
        self._window_time += time.perf_counter() - self._window_start
        fn()
        self._window_start = time.perf_counter()

    def _log_interval(self, loss: torch.Tensor, grad_norm: torch.Tensor, lr: float, bar: tqdm) -> None:
        """Read the device values (the one host sync per interval) and report them."""
        self.nonfinite.check(self.env, self._on_disk)
        self.runtime.synchronize()
        now = time.perf_counter()
        elapsed = self._window_time + now - self._window_start
        steps = self._window_steps
        self._total_steps, self._total_time = self._total_steps + steps, self._total_time + elapsed
        self._window_start, self._window_steps, self._window_time = now, 0, 0.0
        loss_v, norm_v = loss.item(), distributed.local_value(grad_norm).item()
        tokens_per_s = steps * self.tokens_per_step / max(elapsed, 1e-9)
        self.tb.scalars({
            "train/loss": loss_v, "optim/lr": lr, "optim/grad_norm": norm_v,
            "throughput/tokens_per_s": tokens_per_s, "throughput/step_s": elapsed / max(steps, 1),
            "throughput/mfu": self.flops_per_token * tokens_per_s / self.peak_flops,
            "mem/peak_gib": peak_memory_gib(self.runtime.device), "progress/tokens": self.tokens_seen,
        }, self.step)
        bar.set_postfix(loss=f"{loss_v:.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:,.0f}", refresh=False)
        log.debug("step %d loss %.4f lr %.3e grad_norm %.3f %.0f tok/s", self.step, loss_v, lr, norm_v,
                  tokens_per_s)

    def _eval_and_log(self) -> None:
        self._pause_clock(self._eval)

    def _eval(self) -> None:
        # Every rank evaluates the same batches (FSDP needs all ranks in every forward); averaging makes the
        # value, and so the `best` decision, identical on all of them.
        self.val_loss = distributed.mean_over_ranks(evaluate(self.model, self.val_batches, self.runtime),
                                                    self.env)
        if self.step == 0 or not math.isfinite(self.first_val_loss):
            self.first_val_loss = self.val_loss
        self.tb.scalars({"val/loss": self.val_loss, "val/ppl": math.exp(min(self.val_loss, 80.0)),
                         "progress/tokens": self.tokens_seen}, self.step)
        improved = self.val_loss < self.best_val_loss
        self.best_val_loss = min(self.best_val_loss, self.val_loss)
        log.info("step %d/%d: val loss %.4f (ppl %.1f)%s", self.step, self.cfg.trainer.max_steps,
                 self.val_loss, math.exp(min(self.val_loss, 80.0)),
                 " best" if improved and self.step > 0 else "")
        if improved and self.step > 0:
            self._save("best")
        if self.step > 0:
            self.tb.text("sample", self._sample(), self.step)
        # Rank 0 alone draws them: not under FSDP, where every forward needs all ranks.
        sharded = distributed.is_sharded(self.model)
        if self.cfg.logging.attention_images and self.tb.writer is not None and not sharded:
            # Imported here: matplotlib is only needed when the images are asked for.
            from minigpt.inspect.attention_maps import log_attention_images

            first_val_row = self.val_batches[0][0][0, :32]  # (T<=32,) token ids
            log_attention_images(self.tb.writer, self.model, first_val_row, self.step, self.tokenizer)

    def _sample(self) -> str:
        """A text sample from rank 0 (the other ranks return "", after helping to gather FSDP shards)."""
        lc = self.cfg.logging
        if lc.sample_tokens == 0:
            return ""
        model = distributed.whole_model(self.model, self.env)
        if model is None:
            return ""
        device = next(model.parameters()).device
        return sample_text(model, self.tokenizer, lc.sample_prompt, lc.sample_tokens, lc.sample_temperature,
                           self.cfg.trainer.seed, device)

    def _on_disk(self) -> str:
        """The end of the non-finite loss message: what is still on disk."""
        if self.last_saved is None:
            return "no checkpoint had been written yet"
        return f"the last checkpoint ({self.last_saved}, step {self.last_saved_step}) is untouched"

    def _save(self, name: str) -> None:
        """Write checkpoints/<name> (rank 0 writes; under FSDP every rank helps gather the full tensors)."""
        self.nonfinite.check(self.env, self._on_disk)  # never overwrite a good checkpoint with NaNs
        model = distributed.whole_model(self.model, self.env)  # None on ranks > 0
        if self.is_main or distributed.is_sharded(self.model):  # a collective under FSDP
            optimizer_state = distributed.optimizer_state_dict(self.model, self.optimizer)
        if not self.is_main:
            return
        state = {
            "step": self.step, "tokens_seen": self.tokens_seen,
            "first_val_loss": self.first_val_loss, "best_val_loss": self.best_val_loss,
            "optimizer": optimizer_state, "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(), "loader": self.loader.state_dict(), "rng": ckpt.rng_state(),
        }
        meta = {
            "step": self.step, "tokens_seen": self.tokens_seen, "val_loss": _finite_or_none(self.val_loss),
            "best_val_loss": _finite_or_none(self.best_val_loss),
            "model_config": to_plain_dict(self.model.config), "config": to_plain_dict(self.cfg),
            "tokenizer": {"name": self.tokenizer.name, "vocab_size": self.tokenizer.vocab_size,
                          "folder": ckpt.TOKENIZER},
            "data": {"dir": str(self.data.dir), "fingerprint": self.data.meta.get("fingerprint"),
                     "tokens": self.data.meta.get("tokens")},
            "world_size": self.env.world_size, "strategy": self.cfg.trainer.strategy,
            "versions": {"torch": torch.__version__},
        }
        path = ckpt.save_checkpoint(self.out_dir / "checkpoints" / name, model, state, meta, self.tokenizer)
        if name == "last":
            self.last_saved, self.last_saved_step = path, self.step


def _finite_or_none(x: float) -> float | None:
    """JSON has no infinity: a loss not measured yet is null."""
    return x if math.isfinite(x) else None
