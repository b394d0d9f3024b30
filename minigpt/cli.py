"""What every command does around its library call: compose once, convert once, fail in one line.

Scripts call `to_object(cfg, Schema)` once at start-up (library code only ever sees dataclasses), run their
`@hydra.main` function through `run_cli` so that every bad input ends as one line and exit code 2, and put
`errors.reports_user_errors` under `@hydra.main` for the errors raised inside the job.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable
from typing import TypeVar

from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from minigpt.errors import UserError, exit_with_error, unwritable_path_message

T = TypeVar("T")


def to_object(cfg: DictConfig, schema: type[T]) -> T:
    """Resolve a composed config into its dataclass tree; bad values become a `UserError`.

    The dataclasses' `__post_init__` validation runs here, before anything is allocated.
    """
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), cfg)
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise UserError(str(e).splitlines()[0]) from None
    assert isinstance(obj, schema)
    return obj


def run_cli(main: Callable[[], object]) -> None:
    """Run a script's `@hydra.main` function so that every bad input ends as one line and exit code 2.

    Hydra reports a config error (a misspelled key, a wrong type) as a multi-line report and a trimmed
    traceback, and re-raises nothing. With HYDRA_FULL_ERROR=1 it re-raises instead, so we set it for
    ourselves and print the first line of what reaches us — unless the user set it, asking for the full
    report. An OSError (a run folder that cannot be created) ends the same way. `UserError`s from the
    library are turned into one line inside the job, by `reports_user_errors` under `@hydra.main`.
    """
    full_report = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        main()
    except OverrideParseException as e:  # before HydraException, its base: the grammar wants quotes
        if full_report:
            raise
        exit_with_error(unparsable_override_message(e.override, e.message))
    except (HydraException, OmegaConfBaseException) as e:
        if full_report:
            raise
        cause = f": {_first_line(e.__cause__)}" if e.__cause__ is not None else ""
        exit_with_error(f"{_first_line(e).rstrip('.')}{cause} "
                        "(`--cfg job` shows every key, `--info defaults` every file)")
    except OSError as e:
        if full_report:
            raise
        exit_with_error(unwritable_path_message(e))


def unparsable_override_message(override: str, message: str) -> str:
    """One line for an override Hydra's grammar refuses (`prompt=def main(`): why, and the same override
    quoted so that it parses, ready to paste into a shell.

    Hydra reads `( ) [ ] { } , : = '` and spaces in a value as syntax (lists, sweeps, function calls); inside
    quotes they are plain text. The shell removes one level of quotes, so the Hydra quotes go inside the
    shell's: `"prompt='def main('"`.
    """
    details = [line.strip() for line in message.splitlines()[1:]]
    details = [d for d in details if d and not d.startswith("See ") and set(d) != {"^"}]
    reason = f" ({details[0]})" if details else ""
    key, sep, value = override.partition("=")
    if not sep:
        return f"cannot parse the override {override!r}{reason}: write key=value"
    quoted = f"{key}='" + value.replace("'", "\\'") + "'"  # Hydra: \' is a quote inside a quoted value
    # In the shell's double quotes only \ " $ ` are special (and ! in an interactive bash: quote it apart)
    shell = shlex.quote(quoted) if "!" in quoted else '"' + re.sub(r'([\\"$`])', r"\\\1", quoted) + '"'
    return (f"cannot parse the override {override!r}{reason}: quote a value that holds spaces or symbols "
            f"such as ( ) [ ] , : = (quotes for Hydra inside the shell's), e.g. {shell}")


def hydra_output_files(cfg: DictConfig) -> dict[str, str]:
    """The `.hydra/` files Hydra's own job would write (config, hydra, overrides.yaml), as text.

    For a script whose YAML sets `hydra.output_subdir: null` so that it writes them itself, later: training
    writes them once the run has passed its checks, so a refused command leaves a run folder untouched.
    """
    hydra_cfg = HydraConfig.instance().cfg  # {"hydra": ...}, exactly what Hydra's run_job saves
    return {".hydra/config.yaml": OmegaConf.to_yaml(cfg), ".hydra/hydra.yaml": OmegaConf.to_yaml(hydra_cfg),
            ".hydra/overrides.yaml": OmegaConf.to_yaml(HydraConfig.get().overrides.task)}


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0].strip()
