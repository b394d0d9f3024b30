"""lm-evaluation-harness tasks on a checkpoint: `scripts/evaluate.py harness_tasks=[stdlib_next_line]`.

The model is minigpt's own (lm_eval_model.py), the tasks are found by lm-eval's TaskManager among its own and
the ones shipped in interop/tasks/ (harness_task.py); lm-eval's tasks other than those download their data
the first time, so they need the network once.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml
from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager
from lm_eval.utils import make_table

from minigpt.errors import UserError
from minigpt.interop.harness_task import TASK_NAME, TASKS_DIR
from minigpt.interop.lm_eval_model import MinigptLM
from minigpt.signals import quiet_forked_helpers

log = logging.getLogger(__name__)


def run_harness(checkpoint: str | None, tasks: list[str], *, device: str = "auto",
                weights_dtype: str = "float32", batch_size: int = 16, limit: int | None = None,
                seed: int = 0) -> dict[str, Any]:
    """lm-eval's results dict for `tasks` (names, or paths of task YAML files) on the checkpoint; `limit`:
    score only the first items of each task (a quick look). UserError for a task lm-eval does not know."""
    for task in tasks:
        if task.endswith(".yaml"):
            _check_task_file(Path(task))
    # indexing lm-eval's thousands of own task files takes a while: only when a task needs them
    own = any(t != TASK_NAME and not t.endswith(".yaml") for t in tasks)
    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=own)
    unknown = [t for t in tasks if not t.endswith(".yaml") and not manager.match_tasks([t])]
    if unknown:
        raise UserError(f"harness_tasks: lm-eval knows no task {', '.join(unknown)} (the shipped one is "
                        "stdlib_next_line; `lm_eval ls tasks` lists lm-eval's)")
    model = MinigptLM(checkpoint=checkpoint, device=device, weights_dtype=weights_dtype,
                      batch_size=batch_size)
    with quiet_forked_helpers():  # lm-eval bootstraps some error bars in a pool of its own
        return simple_evaluate(model=model, tasks=tasks, task_manager=manager, limit=limit, random_seed=seed,
                               numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=seed,
                               log_samples=False)


class _TaskFileLoader(yaml.SafeLoader):
    """Reads a task file as lm-eval will, its tags (`!function module.name`) as plain values: whether the file
    parses and what its top level holds is all `_check_task_file` asks."""


_TaskFileLoader.add_multi_constructor("!", lambda loader, tag, node: None)


def _check_task_file(file: Path) -> None:
    """UserError for a task file lm-eval could not read: absent, not YAML, or neither a task nor a group."""
    try:
        spec = yaml.load(file.read_text(encoding="utf-8"), Loader=_TaskFileLoader)
    except FileNotFoundError:
        raise UserError(f"harness_tasks: the task file {file} does not exist") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"harness_tasks: cannot read the task file {file} ({first})") from None
    if not isinstance(spec, dict) or not ({"task", "group"} & set(spec)):
        raise UserError(f"harness_tasks: {file} is not an lm-eval task file (it has no `task:` or `group:`)")


def summary_table(results: dict[str, Any]) -> str:
    """lm-eval's own markdown table of the scores."""
    return make_table(results)


def scores(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """task -> metric -> value, the numbers in `results` (lm-eval names them `acc,none`: metric, filter)."""
    return {task: {name: value for name, value in metrics.items() if isinstance(value, (int, float))}
            for task, metrics in results["results"].items()}
