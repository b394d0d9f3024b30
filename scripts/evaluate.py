"""Exact loss and perplexity of a checkpoint: `python scripts/evaluate.py [data=<option>] [key=value ...]`.

Examples:
    python scripts/evaluate.py                                    # newest run, its own corpus, val split
    python scripts/evaluate.py checkpoint=outputs/train/<date>/<time> split=train max_tokens=100000
    python scripts/evaluate.py text_file=notes.md stride=32
    python scripts/evaluate.py data=text 'data.paths=[docs/*.md]'
    python scripts/evaluate.py 'harness_tasks=[stdlib_next_line]'   # lm-evaluation-harness tasks instead

Every token is scored once with a sliding window of the model's context (minigpt/inspect/perplexity.py):
loss (nats per token), perplexity and bits per UTF-8 byte. stride=<block_size> scores the windows training
scores with trainer.eval_tokens=all. harness_tasks=[...] scores lm-evaluation-harness tasks instead (the
shipped offline one is stdlib_next_line; minigpt/interop/harness.py). Prints the result and writes
results.json into the run folder; bad input: one line on stderr, exit code 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from minigpt.cli import reports_user_errors, run_cli, to_object
from minigpt.config import register_configs
from minigpt.inspect.config import EvaluateConfig

register_configs()


@hydra.main(version_base="1.3", config_path="../configs", config_name="evaluate")
@reports_user_errors
def main(cfg: DictConfig) -> None:
    from minigpt.device.threads import set_threads

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    config = to_object(cfg, EvaluateConfig)
    set_threads(config.device.threads)  # one per free core
    if config.harness_tasks:
        from minigpt.interop.harness import run_harness, scores, summary_table

        results = run_harness(config.checkpoint, config.harness_tasks, device=config.device.type,
                              weights_dtype=config.weights_dtype, batch_size=config.batch_size)
        print(summary_table(results))
        (out_dir / "results.json").write_text(json.dumps({"harness": scores(results)}, indent=2) + "\n")
        return
    from minigpt.inspect.perplexity import evaluate

    result, source = evaluate(config)
    print(f"{source}: {result.summary()}")
    record = {"source": source, "loss": result.loss, "perplexity": result.perplexity, "bpb": result.bpb,
              "tokens": result.tokens, "bytes": result.score.bytes, "window": result.window,
              "stride": result.stride}
    (out_dir / "results.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    run_cli(main)
