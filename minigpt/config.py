"""The typed configuration tree: every command's root schema, registered with Hydra's ConfigStore.

Each section's dataclass lives beside the code that consumes it; this module assembles them into the root
configs of the scripts and registers those with Hydra's ConfigStore, so Hydra type-checks every YAML value
and override when it composes. The primary YAMLs name the schema first in their defaults lists
(`- train_schema`, `- generate_schema`, `- prepare_schema`). What a script does with the composed config
(one conversion to dataclasses, one line for every bad input) is `minigpt/cli.py`.
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from minigpt.data.config import PrepareConfig
from minigpt.generation.config import GenerateConfig
from minigpt.inspect.config import AttentionMapsConfig, EvaluateConfig
from minigpt.interop.config import ExportConfig, ImportHFConfig
from minigpt.lab.config import (
    AblationReportConfig,
    BenchConfig,
    CompareConfig,
    DecodingDocConfig,
    LossCurvesConfig,
    PEPlotsConfig,
    ScalingConfig,
    ShapeWalkConfig,
    SpeedrunConfig,
    TemperatureConfig,
    TricksReportConfig,
    UpdateDocsConfig,
)
from minigpt.training.config import TrainConfig

# Schema name (the first entry of each primary YAML's defaults list) -> root dataclass.
SCHEMAS = {
    "train_schema": TrainConfig, "prepare_schema": PrepareConfig, "generate_schema": GenerateConfig,
    "temperature_schema": TemperatureConfig, "evaluate_schema": EvaluateConfig,
    "shape_walk_schema": ShapeWalkConfig, "attention_maps_schema": AttentionMapsConfig,
    "pe_plots_schema": PEPlotsConfig, "loss_curves_schema": LossCurvesConfig, "bench_schema": BenchConfig,
    "speedrun_schema": SpeedrunConfig, "ablation_report_schema": AblationReportConfig,
    "scaling_schema": ScalingConfig, "export_schema": ExportConfig, "import_hf_schema": ImportHFConfig,
    "compare_schema": CompareConfig,
    "tricks_report_schema": TricksReportConfig, "decoding_doc_schema": DecodingDocConfig,
    "update_docs_schema": UpdateDocsConfig,
}


def register_configs() -> None:
    """Register the root schemas and the resolvers the YAMLs use; idempotent, call before `@hydra.main` or
    `initialize_config_dir`."""
    cs = ConfigStore.instance()
    for name, schema in SCHEMAS.items():
        cs.store(name=name, node=schema)
    # `${minigpt_suffix:${run_name}}` in a run folder's name: "_<run_name>" when run_name is set, else nothing
    if not OmegaConf.has_resolver("minigpt_suffix"):
        OmegaConf.register_new_resolver("minigpt_suffix", lambda name: f"_{name}" if name else "")
