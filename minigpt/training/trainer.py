"""The training loop: the Trainer prepares the data, builds the model, and optimises it (`fit`).

One *step* is one optimizer update over `grad_accum_steps` micro-batches; every counter, schedule and
TensorBoard x-axis uses it. The hot path (micro-batches, backward, clip, update) never waits for the device:
the loss and the gradient norm stay tensors, read (`.item()`, a host sync) only every `log_every` steps.

Under torchrun (`env`, see minigpt/cluster/) every rank runs this same loop on its own data stream; the
model is wrapped for DDP or FSDP2, only rank 0 writes (checkpoints, TensorBoard), and `tokens_per_step`
counts every rank's tokens. The ranks take every decision together (stop, skip, save `best`), so no rank
waits for a collective the others never reach. A stop signal (SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2) ends
the run after the current step, with a checkpoint (`minigpt/signals.py`); a diverging loss ends it before
anything diverged is written (`step.DivergenceGuard`). The run ends when its budget is
used (`budget.py`: `trainer.max_steps` steps, `trainer.max_time` of training time on rank 0's clock,
`trainer.max_tokens` tokens, `trainer.max_flops` model FLOPs or `trainer.max_tokens_per_param`, the first one
reached); the lr of each step follows the share of the budget used (`optim.LRSchedule`). Neighbours:
`start.py` (where the run starts), `seeding.py` (its random streams), `step.py` (one update), `optim.py` (the
optimizer and the lr schedule), `budget.py` (also throughput, MFU and the training clock), `evaluation.py`
(validation), `reporting.py` (the progress bar or lines, TensorBoard).

A training run is more than its loop: `minigpt.runs.train.train(cfg, out_dir)` claims the run folder, works
out where the run starts (and refuses a resume into another run), builds the Trainer and calls `fit`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from minigpt.checkpoint import format as ckpt
from minigpt.checkpoint.contents import Progress, machine_record, training_meta, training_state
from minigpt.cluster import distributed
from minigpt.cluster.dist_env import DistEnv
from minigpt.data.loader import BatchLoader
from minigpt.data.prepare import GivenTokenizer, prepare_dataset
from minigpt.device.governor import ThreadGovernor
from minigpt.device.runtime import peak_flops, resolve_runtime
from minigpt.device.threads import set_threads
from minigpt.inspect.perplexity import format_perplexity
from minigpt.model.factory import build_model
from minigpt.signals import GracefulStop, signal_name
from minigpt.training.batch_schedule import BatchSchedule
from minigpt.training.budget import Budget, ThroughputMeter, format_count, format_duration
from minigpt.training.config import TrainConfig
from minigpt.training.evaluation import Evaluation, peak_memory_gib
from minigpt.training.optim import LRSchedule, build_optimizer
from minigpt.training.reporting import ProgressDisplay, TensorBoardLogger, is_terminal
from minigpt.training.seeding import rng_state, seed_everything, seed_rank_stream
from minigpt.training.start import SCRATCH, Start, load_for_resume, restore
from minigpt.training.step import (
    DivergenceGuard,
    accumulate_gradients,
    grad_accum_steps,
    optimizer_step,
    with_attention_kernel,
)

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
    interrupted: bool = False  # stopped by a stop signal (minigpt/signals.py), after writing `checkpoint`
    skipped_steps: int = 0  # updates skipped for a non-finite loss (trainer.on_nonfinite=skip)
    train_seconds: float = 0.0  # training time used, summed over a run and its resumptions
    val_bpb: float = math.nan  # bits per UTF-8 byte of the val text, at the last evaluation
    mfu: float = math.nan  # model FLOPs utilisation per device over the run
    flops: float = 0.0  # model FLOPs trained (GPT.flops_per_token x tokens_seen), resumptions included
    stop_signal: int | None = None  # the signal that stopped it (interrupted), as the ranks agreed on it


class Trainer:
    """Holds the run's state, all of it built in `__init__` from `start` (start.py: from scratch, a
    checkpoint it continues, or a model it fine-tunes); `fit()` runs the loop, writing under `out_dir`.

    `check_folder` is called before each checkpoint is written: it raises if the run folder is no longer
    this run's (minigpt/runs/run_folder.py). `clock` is the training clock's time source (seconds); tests
    inject a fake one to test time budgets without waiting.
    """

    def __init__(self, cfg: TrainConfig, out_dir: Path, *, env: DistEnv, start: Start = SCRATCH,
                 check_folder: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.is_main = env.is_main
        tc = cfg.trainer
        self.cfg, self.out_dir, self.env, self.check_folder = cfg, Path(out_dir), env, check_folder
        self.resumed_from, self.resumed_step = start.checkpoint, 0
        # the first log lines: threads (the free cores, measured), device, dtype and why. Rank 0 runs (and
        # caches) the CPU dtype probe first, so the other ranks read its result and every rank chooses alike.
        self.threads = set_threads(cfg.device.threads)
        log.info("threads: %s", self.threads.describe())
        with distributed.main_process_first(env):
            self.runtime = resolve_runtime(cfg.device, local_rank=env.local_rank,
                                           probe_cache=Path(cfg.data.cache_dir))
        device = self.runtime.device
        seed_everything(tc.seed)

        # tqdm bars only where they redraw in place (see reporting.py)
        bars = self.is_main and cfg.logging.progress_bar and is_terminal(sys.stderr)
        init = start.init  # a fine-tuning run's data is tokenised by its source's tokenizer
        tokenizer = cfg.tokenizer if init is None else GivenTokenizer.of(init.tokenizer(cfg.tokenizer))
        with distributed.main_process_first(env):  # rank 0 tokenises into the cache, the others reuse it
            # a continued run's corpus must be the checkpoint's: another one is refused before it is prepared
            self.data = prepare_dataset(cfg.data, tokenizer, Path(cfg.data.cache_dir), progress=bars,
                                        expect_fingerprint=start.corpus)
        self.tokenizer = self.data.tokenizer
        vocab = self.tokenizer.vocab_size
        # build_model refuses a model.vocab_size below the tokenizer's
        self.model = build_model(cfg.model, vocab_size=vocab)
        if init is not None and start.checkpoint is None:
            init.load_weights(self.model)
        self.model.to(device)
        self.runtime = with_attention_kernel(self.runtime, cfg, env.world_size)
        seed_rank_stream(tc.seed, env.rank)
        state = load_for_resume(start.checkpoint, self.model, cfg) if start.checkpoint is not None else None
        # `model` stays the plain module (DDP wraps it; FSDP2 shards it in place); the compiled wrapper runs
        # the training steps, while evaluation and sampling use `model`, so eval mode and growing sample
        # lengths trigger no recompilations.
        wrapped = distributed.wrap_model(self.model, tc.strategy, env, device)
        self.train_model = torch.compile(wrapped) if self.runtime.compile else wrapped

        block = cfg.model.block_size
        self.grad_accum_steps = grad_accum_steps(tc, block, env.world_size)
        self.tokens_per_step = tc.batch_size * block * self.grad_accum_steps * env.world_size  # a full step's
        self.batches = BatchSchedule(tc, block, self.grad_accum_steps, env.world_size)
        self.optimizer = build_optimizer(self.model, cfg.optim, device.type, env.world_size,
                                         autocast_dtype=self.runtime.dtype)
        flops_per_token = self.model.flops_per_token()
        self.budget = Budget(tc.max_steps, tc.max_seconds, tc.max_tokens, tc.max_flops,
                             tc.max_tokens_per_param, self.tokens_per_step, flops_per_token,
                             self.model.num_params(), self.batches.warmup_tokens())
        self.schedule = LRSchedule(cfg.optim, self.budget)
        self.scaler = self.runtime.grad_scaler()
        accum = self.grad_accum_steps  # the loader's i-th batch is a micro-batch of step i // accum
        self.loader = BatchLoader(self.data.split("train"), block, tc.batch_size, seed=tc.seed, rank=env.rank,
                                  world_size=env.world_size, device=str(device),
                                  batch_sizes=lambda i: self.batches.sequences(i // accum))
        self.evaluation = Evaluation(self.model, self.data.split("val"), block, tc.eval_budget,
                                     tc.batch_size, self.runtime, env, self.tokenizer, cfg.logging, tc.seed)
        self.progress = Progress()
        self.last_saved: Path | None = None  # the newest `last` checkpoint and its step
        self.last_saved_step = 0
        self.meter = ThroughputMeter(flops_per_token, peak_flops(cfg.device, self.runtime), env.world_size,
                                     self.runtime.synchronize, clock)
        self.tb = TensorBoardLogger(self.out_dir / "tb", enabled=self.is_main and cfg.logging.tensorboard)
        self.machine = machine_record(device, self.runtime.dtype, self.threads)  # saved with every checkpoint
        self.governor = ThreadGovernor(self.threads, enabled=device.type == "cpu")  # re-chosen as load moves
        if state is not None:
            self.progress = restore(state, self.model, self.optimizer, self.scaler, self.loader, env)
            self.resumed_step = self.progress.step
            log.info("resumed from %s at step %d (%s tokens seen, %s of training)", start.checkpoint,
                     self.progress.step, f"{self.progress.tokens_seen:,}",
                     format_duration(self.progress.train_seconds))
        self.seconds_before = self.progress.train_seconds  # used before this process resumed the run
        self.guard = DivergenceGuard(tc.on_nonfinite, tc.divergence_ratio, vocab, device,
                                     best=self.progress.best_val_loss)
        self.last_batch: tuple[torch.Tensor, torch.Tensor] | None = None  # what `guard.check_weights` scores
        log.info("model: %s parameters (%s without embeddings); %s tokens per step "
                 "(%d x %d x %d accum x %d ranks)", f"{self.model.num_params(non_embedding=False):,}",
                 f"{self.model.num_params():,}", f"{self.tokens_per_step:,}", tc.batch_size, block,
                 self.grad_accum_steps, env.world_size)
        if self.batches.describe():
            log.info("%s", self.batches.describe())
        last = self.budget.last_step(self.progress.step, self.progress.tokens_seen)
        log.info("budget: %s%s", self.budget.describe(), "" if last is None else f" (ends at step {last:,})")

    # ------------------------------------------------------------------------------------------ the loop

    def fit(self) -> TrainResult:
        tc, lc, p = self.cfg.trainer, self.cfg.logging, self.progress
        stop_signal, sample = None, ""
        with GracefulStop() as stop, self.tb:
            self.tb.text("config", OmegaConf.to_yaml(dataclasses.asdict(self.cfg)), p.step)
            with ProgressDisplay(self.is_main and lc.progress_bar, self.budget, p.step,
                                 p.tokens_seen) as display:
                self.meter.restart()
                while not self.budget.done(p.step, p.train_seconds, p.tokens_seen):
                    if p.step % tc.eval_every == 0:
                        self._evaluate()
                    loss, grad_norm, lr = self._train_step()
                    tokens = self.batches.tokens(p.step)
                    p.step += 1
                    p.tokens_seen += tokens
                    self.meter.step_done(tokens)
                    display.step_done()
                    # every rank ends at the same step, with the lr of rank 0's training clock
                    clock = self.seconds_before + self.meter.seconds
                    stop_signal, p.train_seconds = distributed.agree_on_stop(stop.signum, clock, self.env)
                    self.governor.step_done(clock, tokens)
                    finished = self.budget.done(p.step, p.train_seconds, p.tokens_seen)
                    if p.step % lc.log_every == 0 or finished:
                        self._log_interval(loss, grad_norm, lr, display)
                    if stop_signal is not None:
                        break
                    if p.step % tc.ckpt_every == 0 and not finished:
                        with self.meter.paused():
                            self._save("last")
            if stop_signal is None:
                self._evaluate()
            self._save("last")
            tokens_per_s = self.meter.run_tokens_per_s
            if stop_signal is None:
                sample = self.evaluation.sample()
                self.tb.final(dataclasses.asdict(self.cfg), p.step)
        if stop_signal is not None and self.is_main:
            log.warning("stopped by %s at step %d; checkpoint written to %s", signal_name(stop_signal),
                        p.step, self.last_saved)
        elif stop_signal is None:
            log.info("done: step %d after %s of training (%s tokens, %s FLOPs), val loss %.4f (best %.4f, "
                     "first %.4f), %.4f bits/byte, %s tok/s, MFU %.1f%% per device", p.step,
                     format_duration(p.train_seconds), f"{p.tokens_seen:,}",
                     format_count(self.budget.flops(p.tokens_seen)), p.val_loss, p.best_val_loss,
                     p.first_val_loss, p.val_bpb, f"{tokens_per_s:,.0f}", 100 * self.meter.run_mfu)
        return TrainResult(p.step, p.tokens_seen, p.first_val_loss, p.val_loss, p.best_val_loss, tokens_per_s,
                           sample, self.out_dir / "checkpoints" / "last", stop_signal is not None,
                           self.guard.skipped, p.train_seconds, val_bpb=p.val_bpb, mfu=self.meter.run_mfu,
                           flops=self.budget.flops(p.tokens_seen), stop_signal=stop_signal)

    def _train_step(self) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One optimizer update; returns (mean loss, pre-clip grad norm) as device tensors and the lr used."""
        p = self.progress
        lr = self.schedule.apply(self.optimizer, p.step, p.train_seconds, p.tokens_seen)
        self.train_model.train()
        loss = accumulate_gradients(self.train_model, self._next_batch, self.grad_accum_steps,
                                    self.runtime, self.scaler)
        if self.guard.should_skip(loss, p.step + 1, self.env):
            self.optimizer.zero_grad(set_to_none=True)  # the step still counts, as it does for the schedule
            return loss, torch.full((), math.nan), lr
        grad_norm = optimizer_step(self.model, self.optimizer, self.scaler, self.cfg.optim.grad_clip)
        return loss, grad_norm, lr

    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.loader.next_batch()  # (b, T) each, b = batches.sequences(step)
        self.last_batch = self.batches.cut(x, y, self.progress.step)  # (b · T / t, t), t = seq_len(step)
        return self.last_batch

    # ------------------------------------------------------------------------------------------ reporting

    def _log_interval(self, loss: torch.Tensor, grad_norm: torch.Tensor, lr: float,
                      display: ProgressDisplay) -> None:
        """Read the device values (the one host sync per interval) and report them."""
        self.guard.check(self.env, self._on_disk)
        interval = self.meter.interval()
        loss_v, norm_v = loss.item(), distributed.local_value(grad_norm).item()
        p = self.progress
        self.tb.scalars({
            "train/loss": loss_v, "optim/lr": lr, "optim/grad_norm": norm_v,
            "throughput/tokens_per_s": interval.tokens_per_s, "throughput/step_s": interval.step_s,
            "throughput/mfu": interval.mfu, "mem/peak_gib": peak_memory_gib(self.runtime.device),
            "progress/tokens": p.tokens_seen, "progress/flops": self.budget.flops(p.tokens_seen),
        }, p.step)
        display.report(p.step, loss_v, lr, interval.tokens_per_s, p.train_seconds, interval.step_s,
                       p.tokens_seen)

    def _evaluate(self) -> None:
        """Validation (the same on every rank, so is the `best` decision), a sample, their reports."""
        p = self.progress
        with self.meter.paused():
            score = self.evaluation.score()
            self.guard.check_val(score.loss, p.best_val_loss, p.step, self._on_disk)  # before `best` is saved
            p.val_loss, p.val_bpb = score.loss, score.bpb
            if p.step == 0 or not math.isfinite(p.first_val_loss):
                p.first_val_loss = p.val_loss
            self.tb.scalars({"val/loss": p.val_loss, "val/ppl": score.perplexity, "val/bpb": p.val_bpb,
                             "progress/tokens": p.tokens_seen,
                             "progress/flops": self.budget.flops(p.tokens_seen)}, p.step)
            improved = p.val_loss < p.best_val_loss
            p.best_val_loss = min(p.best_val_loss, p.val_loss)
            self.tb.scalars({"val/best_loss": p.best_val_loss}, p.step)  # a final metric (reporting.py)
            last = self.budget.last_step(p.step, p.tokens_seen)
            of = "" if last is None else f"/{last}"
            best = " best" if improved and p.step > 0 else ""
            log.info("step %d%s: val loss %.4f (ppl %s, %.4f bits/byte)%s", p.step, of, p.val_loss,
                     format_perplexity(score.perplexity), p.val_bpb, best)
            if improved and p.step > 0:
                self._save("best")
            if p.step > 0:
                self.tb.text("sample", self.evaluation.sample(), p.step)
            if self.cfg.logging.attention_images:
                with self.tb.writing():
                    self.evaluation.attention_images(self.tb.writer, p.step)

    def _on_disk(self) -> str:
        """The end of a divergence message: the checkpoint to go on from, and how (every checkpoint written
        passed `guard.check_weights`; one this run resumed from passed `start.load_for_resume`'s check)."""
        lower = f"optim.lr={self.cfg.optim.lr / 10:.3g}"
        if self.last_saved is not None:
            ckpt, step = self.last_saved, self.last_saved_step
        elif self.resumed_from is not None:
            ckpt, step = self.resumed_from, self.resumed_step
        else:
            return (f"no checkpoint had been written yet: start again with a lower lr ({lower}, or a longer "
                    "warmup: optim.warmup_steps)")
        here = Path(ckpt).is_relative_to(self.out_dir)  # else resumed from another run's, written nothing yet
        resume_it = "trainer.resume=auto" if here else f"trainer.resume={ckpt}"
        return (f"the last good checkpoint is {ckpt} (step {step}): continue from it with a lower lr, "
                f"{resume_it} {lower} (or a longer warmup; trainer.on_nonfinite=skip skips single "
                "non-finite steps)")

    def _save(self, name: str) -> None:
        """Write checkpoints/<name> (rank 0 writes; under FSDP every rank helps gather the full tensors),
        unless the run has diverged since the last check."""
        self.guard.check(self.env, self._on_disk)
        self.guard.check_weights(self.model, self.last_batch, self.runtime, self.progress.step, self.env,
                                 self._on_disk)
        model = distributed.whole_model(self.model, self.env)  # None on ranks > 0
        if self.is_main or distributed.is_sharded(self.model):  # a collective under FSDP
            optimizer_state = distributed.optimizer_state_dict(self.model, self.optimizer)
        rng_states = distributed.gather_object(rng_state(), self.env)  # every rank's own streams
        if self.is_main:
            p = self.progress
            state = training_state(p, optimizer_state, self.scaler, self.loader, rng_states)
            meta = training_meta(p, self.cfg, self.model, self.tokenizer, self.data, self.env.world_size,
                                 self.evaluation.describe(), self.machine)
            if self.env.job_id is not None:  # a requeued job resumes from it by itself (runs/resume.py)
                meta["job_id"] = self.env.job_id
            self.check_folder()  # a run folder deleted under the run: stop rather than write one elsewhere
            folder = self.out_dir / "checkpoints" / name
            path = ckpt.save_checkpoint(folder, model, state, meta, self.tokenizer)
            if name == "last":
                self.last_saved, self.last_saved_step = path, p.step
        # The ranks go on together once the checkpoint is on disk: a rank whose `train` returned first could
        # otherwise look for it (trainer.resume=auto in the same process group) before it exists.
        distributed.barrier(self.env)
