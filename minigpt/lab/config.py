"""Configuration of the lab's tools (no torch here: Hydra's schemas import this module).

    ShapeWalkConfig      scripts/shape_walk.py      configs/shape_walk.yaml      lab/shape_walk.py
    TemperatureConfig    scripts/temperature.py     configs/temperature.yaml     lab/temperature.py
    PEPlotsConfig        scripts/pe_plots.py        configs/pe_plots.yaml        lab/pe_plots.py
    LossCurvesConfig     scripts/loss_curves.py     configs/loss_curves.yaml     lab/loss_curves.py
    BenchConfig          scripts/bench.py           configs/bench.yaml           lab/bench/
    SpeedrunConfig       scripts/speedrun.py        configs/speedrun.yaml        lab/speedrun.py
    AblationReportConfig scripts/ablation_report.py configs/ablation_report.yaml lab/ablation_report.py
    ScalingConfig        scripts/scaling.py         configs/scaling.yaml         lab/scaling.py
    CompareConfig        scripts/compare.py         configs/compare.yaml         lab/compare*.py
    SideBySideConfig     scripts/side_by_side.py    configs/side_by_side.yaml    lab/side_by_side.py
    TricksReportConfig   scripts/tricks_report.py   configs/tricks_report.yaml   lab/tricks.py
    DecodingDocConfig    scripts/decoding_doc.py    configs/decoding_doc.yaml    lab/bench/report_decoding.py
    UpdateDocsConfig     scripts/update_docs.py     configs/update_docs.yaml     lab/generated_docs.py
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minigpt.device.config import InferenceDeviceConfig, check_threads, check_weights_dtype
from minigpt.errors import UserError
from minigpt.model.config import ModelConfig
from minigpt.training.config import LoggingConfig, TrainConfig, TrainerConfig


@dataclass
class ShapeWalkConfig:
    """Root of `configs/shape_walk.yaml` (`scripts/shape_walk.py`)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    vocab_size: int = 4096  # used when model.vocab_size is null (the default bpe tokenizer's size)
    batch_size: int = 2
    seq_len: int | None = None  # tokens per sequence; None: model.block_size
    checkpoint: str | None = None  # walk this trained model instead of model=...

    def __post_init__(self) -> None:
        for name in ("vocab_size", "batch_size"):
            if getattr(self, name) < 1:
                raise UserError(f"{name}={getattr(self, name)} must be at least 1")
        if self.seq_len is not None and self.seq_len < 1:
            raise UserError(f"seq_len={self.seq_len} must be at least 1 (or null: model.block_size)")


@dataclass
class TemperatureConfig:
    """Root of `configs/temperature.yaml` (`scripts/temperature.py`)."""

    checkpoint: str | None = None  # a checkpoint or run folder; None: the latest run under outputs/
    prompt: str = ""  # empty: the distribution of a document's first token (after end-of-text)
    temperatures: list[float] = field(default_factory=lambda: [0.25, 0.5, 1.0, 2.0, 4.0])
    top: int = 20  # tokens shown per temperature
    out: str | None = None  # the PNG; None: temperature.png in the run folder
    # one forward pass: the CPU is plenty
    device: InferenceDeviceConfig = field(default_factory=lambda: InferenceDeviceConfig("cpu"))
    weights_dtype: str = "float32"

    def __post_init__(self) -> None:
        if not self.temperatures or any(not t > 0 for t in self.temperatures):
            raise UserError(f"temperatures={self.temperatures} must be a non-empty list of values > 0")
        if self.top < 1:
            raise UserError(f"top={self.top} must be at least 1")
        check_weights_dtype(self.weights_dtype)


@dataclass
class PEPlotsConfig:
    """Root of `configs/pe_plots.yaml` (`scripts/pe_plots.py`)."""

    dim: int = 64  # width C of the sinusoidal table
    positions: int = 128  # positions in the table
    head_dim: int = 32  # RoPE head size D
    starts: list[int] = field(default_factory=lambda: [0, 17, 60])  # positions the offset curves start from
    out: str = "outputs/inspect/positional_encodings.png"

    def __post_init__(self) -> None:
        for name in ("dim", "head_dim"):
            value = getattr(self, name)
            if value < 2 or value % 2:
                raise UserError(f"{name}={value} must be even and at least 2 (sin/cos pairs)")
        if self.positions < 2:
            raise UserError(f"positions={self.positions} must be at least 2")
        if not self.starts or min(self.starts) < 0:
            raise UserError(f"starts={self.starts} must be a non-empty list of positions >= 0")


@dataclass
class LossCurvesConfig:
    """Root of `configs/loss_curves.yaml` (`scripts/loss_curves.py`)."""

    runs: list[str] = field(default_factory=list)  # run folders, their tb/ folders, or sweep folders;
    # empty: the newest run under outputs/train
    out: str = "outputs/inspect/loss_curves.png"
    title: str = ""  # empty: the overrides all runs share


@dataclass
class BenchConfig:
    """Root of `configs/bench.yaml` (`scripts/bench.py`)."""

    quick: bool = False  # small sizes and few repeats: under a minute
    only: list[str] = field(default_factory=list)  # sections (or aliases) to run; empty: the default suite
    json_out: str | None = None  # also write the results as JSON here
    threads: int | None = None  # intra-op CPU threads; None: one per free core (device/threads.py)
    device: str = "auto"  # auto (cuda if available, else cpu) | cpu | cuda
    compile: bool | None = None  # include torch.compile contenders; None: yes, except when quick

    def __post_init__(self) -> None:
        from minigpt.lab.bench.sections import select_sections

        select_sections(self.only)  # a UserError naming an unknown section
        check_threads("threads", self.threads)
        if self.device not in ("auto", "cpu", "cuda"):
            raise UserError(f"device={self.device!r} is not one of: auto, cpu, cuda")


@dataclass
class SpeedrunConfig:
    """Root of `configs/speedrun.yaml` (`scripts/speedrun.py`): the report on a `make speedrun` sweep."""

    sweep: str | None = None  # the multirun folder of `make speedrun`; None: the newest in outputs/speedrun
    docs: bool = False  # also merge the rows into `results` and rewrite the table in `doc`
    render: bool = False  # score nothing: rewrite the table in `doc` from `results` alone
    results: str = "docs/speedrun.json"
    doc: str = "docs/speedrun.md"  # the file holding the table between its speedrun markers


@dataclass
class AblationReportConfig:
    """Root of `configs/ablation_report.yaml` (`scripts/ablation_report.py`): the report on a lab sweep."""

    sweep: str | None = None  # the multirun folder of `make ablation`; None: the newest in outputs/ablation
    docs: bool = False  # also copy the JSON and the figure beside `doc` and rewrite its block
    doc: str = "docs/ablation.md"  # the file holding the report between its ablation markers


@dataclass
class LadderProfile:
    """One budget of the scaling ladder and the sizes (files of configs/experiment/scaling/) trained at it."""

    flops: float
    sizes: list[str] = field(default_factory=list)


@dataclass
class ScalingConfig:
    """Root of `configs/scaling.yaml` (`scripts/scaling.py`): train, fit and check a scaling ladder."""

    # the IsoFLOP profiles the fit is made on: each spans under 1 to 6-33 tokens per parameter
    profiles: list[LadderProfile] = field(default_factory=lambda: [
        LadderProfile(3e11, ["w016", "w032", "w048"]),
        LadderProfile(6e11, ["w016", "w032", "w048", "w064"]),
        LadderProfile(1.5e12, ["w016", "w032", "w048", "w064", "w096"])])
    # predicted from the profiles' fit, then trained: twice the largest profile's compute
    held_out: LadderProfile = field(default_factory=lambda: LadderProfile(3e12, ["w048"]))
    seeds: int = 2  # per point
    first_seed: int = 1337
    out: str = "outputs/scaling/ladder"  # the ladder's folder: run the command again to resume it
    train: bool = True  # train what is missing; false: score the finished runs, fit and report
    jobs: int = 2  # runs at once
    threads: int | None = 1  # intra-op threads per run; None: one per core
    train_args: list[str] = field(default_factory=list)  # more overrides of every run: hydra/launcher=...
    bootstrap: int = 200  # refits for the intervals
    docs: bool = False  # also copy scaling.json and scaling.png beside `doc` and rewrite its block
    doc: str = "docs/scaling.md"  # the file holding the ladder between its scaling markers

    def __post_init__(self) -> None:
        for key in ("seeds", "jobs", "bootstrap"):
            if getattr(self, key) < 1:
                raise UserError(f"{key}={getattr(self, key)} must be at least 1")
        if self.seeds < 2:
            raise UserError(f"seeds={self.seeds}: a ladder point needs at least 2 seeds (their spread is "
                            "part of what the fit must explain)")


COMPARE_MODES = ("quality", "speed", "simulate")


@dataclass
class CompareConfig:
    """Root of `configs/compare.yaml` (`scripts/compare.py`): a baseline against a candidate, seeds until the
    verdict (mode=quality), the same-losses-then-speed gate (mode=speed), or the sequential test's simulated
    error rate and power (mode=simulate)."""

    # overrides of scripts/train.py; the default: the speedrun's baseline (model=demo optim=muon)
    baseline: list[str] = field(default_factory=lambda: ["experiment=speedrun/default"])
    candidate: list[str] = field(default_factory=list)
    budget: list[str] = field(default_factory=list)  # overrides after each arm's; empty: the arms' own budget
    mode: str = "quality"
    name: str | None = None  # the comparison's name in reports; None: the candidate's overrides
    out: str | None = None  # its folder; None: outputs/compare/<name>
    metric: str = "bits_per_byte"  # or val_loss; lower is better
    min_effect: float = 0.01  # the smallest difference that matters, in the metric's unit
    alpha: float = 0.05  # the error rate of each verdict
    max_pairs: int = 12  # the seed cap
    first_seed: int = 1337
    pairs_per_look: int = 1  # pairs trained before each look (in parallel with a cluster launcher)
    prior_scale: float = 2.0  # the sequential test's tau (lab/compare_sequential.py)
    side_by_side: bool = True  # train the two arms of a pair at once
    threads: int | None = 1  # intra-op threads per run; None: one per core
    train_args: list[str] = field(default_factory=list)  # more overrides of every run: hydra/launcher=...
    steps: int = 50  # mode=speed: optimizer steps per run
    repeats: int = 3  # mode=speed: runs per arm
    tolerance: float = 0.0  # mode=speed: largest loss difference still "the same" (0: bit for bit)
    docs: bool = False  # also merge into `results` and rewrite the block in `doc`
    render: bool = False  # run nothing: rewrite the block in `doc` from `results`
    results: str = "docs/comparisons.json"
    doc: str = "docs/comparisons.md"

    def __post_init__(self) -> None:
        if self.mode not in COMPARE_MODES:
            raise UserError(f"mode={self.mode!r} is not one of: {', '.join(COMPARE_MODES)}")
        if self.threads is not None and self.threads < 1:
            raise UserError(f"threads={self.threads} must be at least 1 (or null: one per core)")
        if self.tolerance < 0:
            raise UserError(f"tolerance={self.tolerance} must be >= 0")


SIDE_BY_SIDE_ARMS = ("reference", "minigpt")


@dataclass
class ReferenceRecipe:
    """The reference recipe's model and training settings (`lab/side_by_side.py`): its training script's
    defaults, at the default run's shape with full attention."""

    n_layer: int = 4
    n_head: int = 3
    n_kv_head: int = 3
    n_embd: int = 96
    window_pattern: str = "L"  # its sliding-window pattern: L = every layer attends to the whole context
    # its peak lrs: AdamW for the token table (the value-embedding tables at half), the head, and the scalars,
    # which it scales by (n_embd / 768)^-0.5 itself; Muon for the blocks' matrices
    embedding_lr: float = 0.3
    unembedding_lr: float = 0.008
    scalar_lr: float = 0.5
    matrix_lr: float = 0.02
    lr_scale: float = 1.0  # multiplies every lr above (an lr screen)
    weight_decay: float = 0.28  # Muon's cautious weight decay at step 0; it falls to 0 on a cosine
    warmup_steps: int = 40
    warmdown_ratio: float = 0.65  # the lr falls linearly over this share of the run, to final_lr_frac
    final_lr_frac: float = 0.05
    momentum_start: float = 0.85  # Muon's momentum: start -> momentum over momentum_warmup_steps,
    momentum: float = 0.97  # and down to momentum_end over the warmdown
    momentum_warmup_steps: int = 400
    momentum_end: float = 0.90
    steps: int | None = None  # null: the minigpt arm's trainer.max_steps (equal tokens); other: equal time
    compile_optimizer: bool = False  # its fused optimizer steps are torch.compile'd; false: run them eagerly

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_kv_head", "n_embd", "momentum_warmup_steps"):
            if getattr(self, name) < 1:
                raise UserError(f"reference.{name}={getattr(self, name)} must be at least 1")
        for name in ("embedding_lr", "unembedding_lr", "scalar_lr", "matrix_lr", "lr_scale"):
            if not getattr(self, name) > 0:
                raise UserError(f"reference.{name}={getattr(self, name)} must be positive")
        if self.steps is not None and self.steps < 1:
            raise UserError(f"reference.steps={self.steps} must be at least 1 (or null: the minigpt arm's)")


def whole_split_arm() -> TrainConfig:
    """train.yaml's run, evaluated once at the end on the whole val split and not sampled (the side-by-side's
    minigpt arm, as configs/side_by_side.yaml sets it)."""
    return TrainConfig(trainer=TrainerConfig(eval_every=100000, eval_tokens="all", ckpt_every=100000),
                       logging=LoggingConfig(sample_tokens=0, progress_bar=False))


@dataclass
class SideBySideConfig:
    """Root of `configs/side_by_side.yaml` (`scripts/side_by_side.py`): the reference recipe and minigpt on
    the same bins, batches, budget and scorer (`lab/side_by_side.py`)."""

    reference_path: str | None = None  # a checkout of the reference project (its nanochat/ package inside)
    reference: ReferenceRecipe = field(default_factory=ReferenceRecipe)
    # the minigpt arm, train.yaml's tree; its data, tokenizer, batch, block size and max_steps are both arms'
    minigpt: TrainConfig = field(default_factory=lambda: whole_split_arm())
    seeds: list[int] = field(default_factory=lambda: [1337, 1338, 1339])
    arms: list[str] = field(default_factory=lambda: list(SIDE_BY_SIDE_ARMS))  # which arms to train
    throughput: bool = False  # train nothing: time the arms' steps, interleaved, at each of `threads`
    # train nothing: the arms from the same weights, their logits and this many steps' updates compared
    # (lab/reference_parity.py), on the first seed's batches
    parity_steps: int = 0
    threads: list[int] = field(default_factory=lambda: [1, 2])
    timed_steps: int = 20  # throughput: training steps per timed call
    repeats: int = 5  # throughput: timed calls per arm and thread count
    doc: str | None = None  # also write the table into this page, between its side_by_side:<name> markers
    name: str = "equal_tokens"  # the block of `doc` (and of docs/side_by_side.json beside it) to write

    def __post_init__(self) -> None:
        if self.parity_steps < 0:
            raise UserError(f"parity_steps={self.parity_steps} must be >= 0 (0: no parity check)")
        if not self.seeds:
            raise UserError("seeds=[] trains nothing: give at least one seed, e.g. seeds=[1337]")
        unknown = sorted(set(self.arms) - set(SIDE_BY_SIDE_ARMS))
        if unknown or not self.arms:
            raise UserError(f"arms={self.arms} must name some of: {', '.join(SIDE_BY_SIDE_ARMS)}")
        if self.minigpt.trainer.max_steps is None:
            raise UserError("minigpt.trainer.max_steps=null: the side-by-side trains both arms for a number "
                            "of steps (the budget of tokens both see)")
        if self.minigpt.trainer.eval_tokens != "all":
            raise UserError(f"minigpt.trainer.eval_tokens={self.minigpt.trainer.eval_tokens}: the arms are "
                            "compared on the whole val split (all)")
        for name in ("timed_steps", "repeats"):
            if getattr(self, name) < 1:
                raise UserError(f"{name}={getattr(self, name)} must be at least 1")
        if not self.threads or any(t < 1 for t in self.threads):
            raise UserError(f"threads={self.threads} must be a list of thread counts of at least 1")


@dataclass
class TricksReportConfig:
    """Root of `configs/tricks_report.yaml` (`scripts/tricks_report.py`): a round of the technique screen."""

    runs: str | None = None  # the folder of arms, <arm>/s<seed>/, each a run of scripts/train.py
    round: str | None = None  # the name of the round those arms are
    controls: dict[str, str] = field(default_factory=dict)  # +controls.<arm>=<control>: an equal-time arm's
    bench: str | None = None  # a bench JSON with the techniques section: the step-time column
    render: bool = False  # read no runs: rewrite every round's table in `doc` from `results`
    results: str = "docs/tricks.json"  # every round's numbers, by name
    doc: str = "docs/tricks.md"  # the page holding each round's table between its markers

    def __post_init__(self) -> None:
        if self.render and (self.runs or self.round):
            raise UserError("render=true reads no runs: drop runs= and round= (or render=true)")

    def arms(self) -> tuple[str, str]:
        """(runs, round), which have no defaults; UserError without them."""
        if not (self.runs and self.round):
            raise UserError(f"give the arms and their round, runs=<folder> round=<name> (got "
                            f"runs={self.runs} round={self.round}), or render=true")
        return self.runs, self.round


@dataclass
class DecodingDocConfig:
    """Root of `configs/decoding_doc.yaml` (`scripts/decoding_doc.py`): docs/decoding.md, rendered."""

    results: str = "docs/decoding.json"  # `python scripts/bench.py 'only=[decoding]' json_out=...`
    doc: str = "docs/decoding.md"  # the page whose block between the bench markers is rendered


@dataclass
class UpdateDocsConfig:
    """Root of `configs/update_docs.yaml` (`scripts/update_docs.py`): what the tools write under docs/."""

    check: bool = False  # write nothing: fail in one line naming the generated files that are stale
