"""Configuration of training: the optimizer, the loop and logging, and `TrainConfig`, the root of train.yaml.

YAML: `configs/optim/`, `configs/trainer/`, `configs/logging/` (and the model, data, tokenizer and device
groups, whose dataclasses live beside their own code). Each field is the YAML key of the same name
(`optim.lr` is `OptimConfig.lr`). Values are checked in `__post_init__`, so a bad override fails when the
config is converted at start-up, before any tensor is allocated. No torch is imported here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from minigpt.data.config import DataConfig, TokenizerConfig
from minigpt.device.config import DeviceConfig
from minigpt.errors import UserError
from minigpt.model.config import ModelConfig
from minigpt.training.budget import parse_duration

STRATEGIES = ("ddp", "fsdp")  # see cluster/distributed.py
NONFINITE_POLICIES = ("stop", "skip")
SCHEDULES = ("cosine", "wsd")  # see training/optim.py
WEIGHT_DECAY_SCHEDULES = ("constant", "cosine")  # see training/optim.py
OPTIMIZERS = ("adamw", "muon")  # see training/optim.py and training/muon.py
ORTHOGONALIZERS = ("newton_schulz", "polar_express")  # training/muon.py
MUON_DTYPES = ("auto", "float32", "bfloat16")  # training/optim.py muon_dtype
# AdamW's parameter groups that optim.groups may give settings of their own (training/optim.py param_groups)
ADAM_GROUPS = ("tables", "value_tables", "head", "scalars", "resid", "x0", "gates", "matrices", "other")
GROUP_SETTINGS = ("lr", "beta1", "beta2", "eps", "weight_decay")


@dataclass
class OptimConfig:
    """Muon for the blocks' matrices and AdamW for the rest (or AdamW for everything), with linear warmup,
    then a decay to a floor at the end of the budget (`training/optim.py`)."""

    # muon: Muon for the blocks' weight matrices (training/muon.py) at muon_lr, AdamW at lr for the rest
    # (embeddings, head, norms, gates); it won the default run's screen (docs/tricks.md) | adamw: AdamW for
    # every parameter (the only choice under trainer.strategy=fsdp)
    name: str = "muon"
    lr: float = 6e-3  # peak learning rate, reached at the end of warmup; small models tolerate a high one
    min_lr_ratio: float = 0.1  # the decay ends at lr * min_lr_ratio and stays there
    # cosine: decay over the whole budget | wsd: warmup-stable-decay, the peak held until the last
    # cooldown_ratio of the budget, then a straight line down to the floor
    schedule: str = "wsd"
    cooldown_ratio: float = 0.4  # wsd only: the share of the budget spent decaying (0: a constant lr)
    # matrices only; norms, biases and embeddings are not decayed. 0 by default: a short run gained from none
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95  # shorter second-moment memory than Adam's 0.999: steadier with small batches
    eps: float = 1e-8
    warmup_steps: int = 50  # in steps, also for a time budget: Adam's moments need updates, not seconds
    decay_steps: int | None = None  # where the decay reaches its floor, in steps; None: the run's budget
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping (the norm is still logged)
    # AdamW's peak lr for the embedding tables (token, value-embedding and bigram tables, learned positions;
    # with tied weights the head too), same schedule; null: optim.lr (training/optim.py param_groups). A
    # table's row moves only when its token occurs, so the tables take an lr far above the rest's
    embed_lr: float | None = 0.05
    embed_beta2: float | None = None  # the tables' AdamW beta2; null: optim.beta2 (a rare row's memory)
    head_lr: float | None = None  # AdamW's peak lr for the output head (untied); null: optim.lr
    scalar_lr: float | None = None  # AdamW's peak lr for the residual scalars (residual_scalars, backout)
    muon_lr: float = 0.01  # optim.name=muon: peak lr of the matrices (spectral norm per step), same schedule
    muon_momentum: float = 0.95
    muon_ns_steps: int = 5  # Newton-Schulz iterations per orthogonalisation
    # each neuron's share of Muon's update evened out by a running mean of its squares with this decay
    # (NorMuon, training/muon.py normalize_neurons); null: off
    muon_beta2: float | None = None
    # Muon's momentum over the run (training/optim.py muon_momentum): from muon_momentum_start up to
    # muon_momentum over the first muon_momentum_warmup_steps steps, and down to muon_momentum_end over the
    # last cooldown_ratio of the budget; null / 0: muon_momentum throughout
    muon_momentum_start: float | None = None
    muon_momentum_warmup_steps: int = 0
    muon_momentum_end: float | None = None
    # constant | cosine: every decayed group's weight decay falls from weight_decay to 0 over the budget
    weight_decay_schedule: str = "constant"
    # Muon's matrices decay only the entries that its update already moves towards zero
    cautious_weight_decay: bool = False
    # the matrices' orthogonalisation (training/muon.py): newton_schulz (a fixed quintic, 5 steps) |
    # polar_express (rows equalised first, a quintic of its own per step, the result at the exact norm)
    muon_orthogonalize: str = "newton_schulz"
    muon_split_qkv: bool = False  # the attention's fused q/k/v matrix orthogonalised as three matrices
    # the dtype of the orthogonalisation's matmuls: float32 | bfloat16 | auto (bfloat16 where the run's
    # autocast dtype is, that is where bf16 matmuls were measured faster; training/optim.py muon_dtype)
    muon_dtype: str = "float32"
    # AdamW groups of their own, each with its own settings: {group: {lr, beta1, beta2, eps, weight_decay}}
    # (training/optim.py GROUPS); a weight_decay given here is constant, not optim.weight_decay's schedule
    groups: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def lr_scales(self) -> dict[str, float | None]:
        """The groups with an lr of their own (`param_groups`), each lr over optim.lr; None: at optim.lr."""
        own = {"tables": self.embed_lr, "head": self.head_lr, "scalars": self.scalar_lr}
        return {name: None if value is None else value / self.lr for name, value in own.items()}

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise UserError(f"optim.name={self.name!r} is not one of: {', '.join(OPTIMIZERS)}")
        for name in ("lr", "muon_lr"):
            if getattr(self, name) <= 0:
                raise UserError(f"optim.{name}={getattr(self, name)} must be positive")
        for name in ("embed_lr", "head_lr", "scalar_lr"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise UserError(f"optim.{name}={getattr(self, name)} must be positive (or null: optim.lr)")
        for name, null in (("embed_beta2", "optim.beta2"), ("muon_beta2", "off")):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise UserError(f"optim.{name}={value} must be in [0, 1) (or null: {null})")
        if self.muon_dtype not in MUON_DTYPES:
            raise UserError(f"optim.muon_dtype={self.muon_dtype!r} is not one of: {', '.join(MUON_DTYPES)}")
        if self.muon_orthogonalize not in ORTHOGONALIZERS:
            raise UserError(f"optim.muon_orthogonalize={self.muon_orthogonalize!r} is not one of: "
                            f"{', '.join(ORTHOGONALIZERS)}")
        for group, settings in self.groups.items():
            if group not in ADAM_GROUPS:
                raise UserError(f"optim.groups.{group} is not a parameter group (one of: "
                                f"{', '.join(ADAM_GROUPS)})")
            for key, value in settings.items():
                if key not in GROUP_SETTINGS:
                    raise UserError(f"optim.groups.{group}.{key} is not a group setting (one of: "
                                    f"{', '.join(GROUP_SETTINGS)})")
                low = 0.0 if key in ("beta1", "beta2", "weight_decay") else math.nextafter(0.0, 1.0)
                high = 1.0 if key in ("beta1", "beta2") else math.inf
                if not low <= value < high:
                    allowed = "[0, 1)" if high == 1.0 else ">= 0" if low == 0 else "> 0"
                    raise UserError(f"optim.groups.{group}.{key}={value} must be {allowed}")
        if not 0.0 <= self.muon_momentum < 1.0:
            raise UserError(f"optim.muon_momentum={self.muon_momentum} must be in [0, 1)")
        if self.muon_ns_steps < 1:
            raise UserError(f"optim.muon_ns_steps={self.muon_ns_steps} must be at least 1 (5 is usual)")
        for name in ("muon_momentum_start", "muon_momentum_end"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise UserError(f"optim.{name}={value} must be in [0, 1) (or null: optim.muon_momentum)")
        if self.muon_momentum_warmup_steps < 0:
            raise UserError(f"optim.muon_momentum_warmup_steps={self.muon_momentum_warmup_steps} must be "
                            ">= 0")
        if (self.muon_momentum_start is None) != (self.muon_momentum_warmup_steps == 0):
            raise UserError("optim.muon_momentum_start and optim.muon_momentum_warmup_steps go together: the "
                            f"momentum of step 0 and the steps it takes to reach optim.muon_momentum (got "
                            f"{self.muon_momentum_start} and {self.muon_momentum_warmup_steps})")
        if self.weight_decay_schedule not in WEIGHT_DECAY_SCHEDULES:
            raise UserError(f"optim.weight_decay_schedule={self.weight_decay_schedule!r} is not one of: "
                            f"{', '.join(WEIGHT_DECAY_SCHEDULES)}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise UserError(f"optim.min_lr_ratio={self.min_lr_ratio} must be in [0, 1]")
        if self.weight_decay < 0:
            raise UserError(f"optim.weight_decay={self.weight_decay} must be >= 0")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise UserError(f"optim.{name}={getattr(self, name)} must be in [0, 1)")
        if self.warmup_steps < 0:
            raise UserError(f"optim.warmup_steps={self.warmup_steps} must be >= 0")
        if self.decay_steps is not None and self.decay_steps < 1:
            raise UserError(f"optim.decay_steps={self.decay_steps} must be >= 1 (or null: the run's budget)")
        if self.schedule not in SCHEDULES:
            raise UserError(f"optim.schedule={self.schedule!r} is not one of: {', '.join(SCHEDULES)}")
        if not 0.0 <= self.cooldown_ratio <= 1.0:
            raise UserError(f"optim.cooldown_ratio={self.cooldown_ratio} must be in [0, 1]")
        if self.grad_clip < 0:
            raise UserError(f"optim.grad_clip={self.grad_clip} must be >= 0 (0 disables clipping)")


@dataclass
class TrainerConfig:
    """The training loop (`training/trainer.py`). One step is one optimizer update."""

    # The budget (training/budget.py): any of these five; with several, the first one reached ends the run.
    max_steps: int | None = 2200  # null: no step limit (then set another one)
    # Training time, e.g. 90s, 3min, 1h; evaluation and checkpoints are not counted. Depends on the machine.
    max_time: str | None = None
    max_tokens: int | None = None  # training tokens over all ranks: the same work on any machine
    # Model FLOPs (GPT.flops_per_token x tokens, the count MFU uses), e.g. 8e12: equal compute for models of
    # different sizes, on any machine
    max_flops: float | None = None
    # Training tokens per non-embedding parameter (GPT.num_params): a budget that grows with the model, as a
    # scaling ladder's sizes do
    max_tokens_per_param: float | None = None
    batch_size: int = 8  # sequences per micro-batch (per process)
    grad_accum_steps: int = 1  # micro-batches per optimizer step
    tokens_per_step: int | None = None  # if set, grad_accum_steps is derived from it (must divide evenly)
    # Batch-size warmup (training/batch_schedule.py): the micro-batch grows linearly from batch_warmup_start
    # sequences to batch_size over the first batch_warmup_steps steps; 0: off. Those steps train on fewer
    # tokens, so compare such runs at a budget of tokens or FLOPs.
    batch_warmup_steps: int = 0
    batch_warmup_start: int = 1
    # Sequence-length warmup (training/batch_schedule.py): the context doubles from seq_len_warmup_start
    # tokens to model.block_size over the first seq_len_warmup_steps steps, the windows cut into pieces (the
    # same tokens per step); 0: off. block_size / seq_len_warmup_start must be a power of two.
    seq_len_warmup_steps: int = 0
    seq_len_warmup_start: int = 16
    eval_every: int = 100  # also evaluates before the first step and after the last
    # Validation targets scored per evaluation, in fixed windows spread evenly over the whole val split
    # (data/eval_windows.py), or `all`: every target once, the number scripts/evaluate.py stride=block_size
    # gives. An int or the string "all" (OmegaConf has no int|str type, hence Any, checked below).
    eval_tokens: Any = 16384
    ckpt_every: int = 100  # `last` checkpoint; also written at the end
    resume: str | None = None  # a checkpoint or run folder, or `auto`: this run folder's latest checkpoint
    # Fine-tune: start from the weights, model config and tokenizer of a checkpoint, run folder or Hugging
    # Face GPT-2 folder, at step 0 with a fresh optimizer (training/start.py). None: from scratch.
    init_from: str | None = None
    seed: int = 1337
    # Under torchrun: ddp (every rank holds the whole model) | fsdp (FSDP2: parameters, gradients and
    # optimizer state sharded across ranks). Ignored by a single process.
    strategy: str = "ddp"
    on_nonfinite: str = "stop"  # a NaN/inf loss: stop (keeping the last good checkpoint) | skip (that update)
    # Stop when a loss exceeds this many times the run's best and a uniform guess (ln V) too: a diverging run
    # (training/step.py DivergenceGuard); null: only NaN/inf stop it.
    divergence_ratio: float | None = 10.0

    @property
    def eval_budget(self) -> int | None:
        """`eval_tokens` as `eval_windows` takes it: a number of targets, or None for the whole split."""
        return None if self.eval_tokens == "all" else int(self.eval_tokens)

    def __post_init__(self) -> None:
        counts = ("max_steps", "batch_size", "grad_accum_steps", "eval_every", "ckpt_every")
        for name in counts:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UserError(f"trainer.{name}={value} must be at least 1")
        budgets = ("max_steps", "max_time", "max_tokens", "max_flops", "max_tokens_per_param")
        if all(getattr(self, k) is None for k in budgets):
            raise UserError("trainer.max_steps=null needs a time budget: set trainer.max_time (e.g. 3min), "
                            "or a budget of work, the same on any machine: trainer.max_tokens, "
                            "trainer.max_flops (e.g. 8e12) or trainer.max_tokens_per_param")
        if self.max_time is not None:
            parse_duration(self.max_time)  # a bad duration fails here, at start-up
        if self.max_tokens is not None and (isinstance(self.max_tokens, bool) or self.max_tokens < 1):
            raise UserError(f"trainer.max_tokens={self.max_tokens} must be at least 1 (or null)")
        if self.max_flops is not None and not (0 < self.max_flops < math.inf):
            raise UserError(f"trainer.max_flops={self.max_flops} must be positive, a number of FLOPs such as "
                            "8e12 (or null)")
        ratio = self.max_tokens_per_param
        if ratio is not None and not (0 < ratio < math.inf):
            raise UserError(f"trainer.max_tokens_per_param={ratio} must be positive, e.g. 1 or 20 (or null)")
        n = self.eval_tokens
        if n != "all" and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise UserError(f"trainer.eval_tokens={n!r} must be a number of tokens (at least 1) or all "
                            "(the whole val split)")
        if self.init_from is not None and self.resume not in (None, "auto"):
            raise UserError(f"trainer.init_from and trainer.resume={self.resume} both choose the starting "
                            "weights; use one (trainer.resume=auto may continue a fine-tuning run)")
        if self.strategy not in STRATEGIES:
            raise UserError(f"trainer.strategy={self.strategy!r} is not one of: {', '.join(STRATEGIES)}")
        if self.on_nonfinite not in NONFINITE_POLICIES:
            raise UserError(f"trainer.on_nonfinite={self.on_nonfinite!r} is not one of: "
                            f"{', '.join(NONFINITE_POLICIES)}")
        if self.divergence_ratio is not None and not self.divergence_ratio > 1:
            raise UserError(f"trainer.divergence_ratio={self.divergence_ratio} must be above 1 (or null: "
                            "stop only on NaN/inf)")
        if self.tokens_per_step is not None and self.tokens_per_step < 1:
            raise UserError(f"trainer.tokens_per_step={self.tokens_per_step} must be at least 1 (or null)")
        for name in ("batch_warmup_steps", "seq_len_warmup_steps"):
            if getattr(self, name) < 0:
                raise UserError(f"trainer.{name}={getattr(self, name)} must be >= 0 (0: off)")
        if not 1 <= self.batch_warmup_start <= self.batch_size:
            raise UserError(f"trainer.batch_warmup_start={self.batch_warmup_start} must be between 1 and "
                            f"trainer.batch_size={self.batch_size} (the sequences of the first step)")
        if self.seq_len_warmup_start < 1:
            raise UserError(f"trainer.seq_len_warmup_start={self.seq_len_warmup_start} must be at least 1")

    @property
    def max_seconds(self) -> float | None:
        """`max_time` in seconds, or None."""
        return None if self.max_time is None else parse_duration(self.max_time)


@dataclass
class LoggingConfig:
    """Console, progress bar and TensorBoard (`training/reporting.py`)."""

    log_every: int = 10  # steps between log lines and TensorBoard scalars (the only host syncs)
    tensorboard: bool = True
    # A tqdm bar when stderr is a terminal; otherwise (a file, a pipe, a batch job) a plain line every
    # log_every steps. false: neither.
    progress_bar: bool = True
    sample_tokens: int = 120  # length of the sample written at each eval and printed at the end; 0: none
    sample_prompt: str = ""  # empty: start from the end-of-text token, i.e. the start of a document
    sample_temperature: float = 0.8
    attention_images: bool = False  # TensorBoard images of every head's attention map at each eval

    def __post_init__(self) -> None:
        if self.log_every < 1:
            raise UserError(f"logging.log_every={self.log_every} must be at least 1")
        if self.sample_tokens < 0:
            raise UserError(f"logging.sample_tokens={self.sample_tokens} must be >= 0")
        if self.sample_temperature < 0:
            raise UserError(f"logging.sample_temperature={self.sample_temperature} must be >= 0")


def default_run_model() -> ModelConfig:
    """The default run's model, `model=recipe` (configs/model/recipe.yaml, which a test keeps equal to this):
    ModelConfig's plain block with the reference recipe's techniques switched on (docs/tricks.md)."""
    return ModelConfig(
        n_kv_head=None, activation="relu2", rope_base=100_000.0, init="fan_in", qk_norm=True, qk_scale=1.2,
        value_embeds=True, value_embed_every=2, ve_gate_max=3.0, ve_gate_channels=12, smear=True,
        smear_gate_channels=24, norm_gain=False, embed_norm=True, residual_scalars=True, backout=True,
        logit_softcap=15.0,
    )


@dataclass
class TrainConfig:
    """Root of `configs/train.yaml`. Its defaults are the plain block every preset is a difference from
    (`model=demo optim=muon`); the default run, train.yaml's defaults list, picks `model=recipe
    optim=recipe`."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    run_name: str | None = None  # appended to the run folder's name

    def __post_init__(self) -> None:
        t, t0 = self.model.block_size, self.trainer.seq_len_warmup_start
        ratio = t // t0
        if self.trainer.seq_len_warmup_steps and (t % t0 or ratio & (ratio - 1)):
            allowed = ", ".join(str(t >> k) for k in range(1, 5) if t >> k and (t >> k) << k == t) or t
            raise UserError(f"trainer.seq_len_warmup_start={t0} must be model.block_size={t} divided by a "
                            f"power of two, so every context length divides the windows (try {allowed})")
