"""What every command does around its library call: compose once, convert once, end in one line.

Scripts call `to_object(cfg, Schema)` once at start-up (library code only ever sees dataclasses), run their
`@hydra.main` function through `run_cli`, and put `reports_user_errors` under `@hydra.main` for what happens
inside the job. Between them, every command ends in one of these ways:

    bad input, a fault of the machine    `error: <one line>`, exit code 2 (UserError, an unwritable path)
    a stop signal (Ctrl-C, SIGTERM, ...)  `interrupted by SIGTERM ...`, exit code 128+N (minigpt/signals.py)
    a reader that left (`... | head -1`)  nothing more is printed; the command goes on and ends as it would

and a command that fails leaves no empty run folder behind (Hydra creates it before the job starts).
"""

from __future__ import annotations

import copy
import functools
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import HydraException, OverrideParseException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, read_write
from omegaconf.errors import OmegaConfBaseException

from minigpt import signals
from minigpt.errors import (
    USER_ERROR_EXIT_CODE,
    AlreadyReported,
    UserError,
    exit_with_error,
    shell_override,
    unwritable_path_message,
)
from minigpt.generation.output import ClosableOutput

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., object])


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
    """Run a script's `@hydra.main` function so that every way it can end is one of the module doc's.

    Hydra reports a config error (a misspelled key, a wrong type) as a multi-line report and a trimmed
    traceback, and re-raises nothing. With HYDRA_FULL_ERROR=1 it re-raises instead, so we set it for
    ourselves and print the first line of what reaches us — unless the user set it, asking for the full
    report. An OSError (a run folder that cannot be created) ends the same way. `UserError`s from the
    library are turned into one line inside the job, by `reports_user_errors` under `@hydra.main`.
    """
    full_report = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    signals.install_policy()
    try:
        with _readers_may_leave():
            main()
    except signals.Interrupted as e:  # while Hydra composed, before the job
        print(e.message(), file=sys.stderr)
        sys.exit(e.exit_code)
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
    except AssertionError as e:  # OmegaConf's, for an override into a group that is null: see below
        key = _override_into_null_group(e)
        if key is None or full_report:
            raise
        group = key.split(".")[0]
        exit_with_error(f"cannot set {key}: this command has no `{group}` unless you choose one; add "
                        f"{group}=<option> before it (`ls configs/{group}` lists them, `--info defaults` "
                        "shows what is chosen)")


def reports_user_errors(main: F) -> F:
    """Under `@hydra.main`: a `UserError` or an unwritable path ends the job as one line and exit code 2, a
    stop signal as one line and 128+N; either way the run folder Hydra made for this command goes again if
    nothing was written into it."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except BaseException as e:
            _remove_made_folders()
            if isinstance(e, signals.Interrupted):
                print(e.message(), file=sys.stderr)
                sys.exit(e.exit_code)
            if isinstance(e, AlreadyReported):
                sys.exit(USER_ERROR_EXIT_CODE)
            if isinstance(e, UserError):
                exit_with_error(str(e))
            if isinstance(e, OSError):  # e.g. a checkpoint or data folder on a read-only or full disk
                exit_with_error(unwritable_path_message(e))
            raise

    return wrapper  # type: ignore[return-value]


def unparsable_override_message(override: str, message: str) -> str:
    """One line for an override Hydra's grammar refuses (`prompt=def main(`): why, and the same override
    quoted so that it parses, ready to paste into a shell (`errors.shell_override`)."""
    details = [line.strip() for line in message.splitlines()[1:]]
    details = [d for d in details if d and not d.startswith("See ") and set(d) != {"^"}]
    reason = f" ({details[0]})" if details else ""
    key, sep, value = override.partition("=")
    if not sep:
        return f"cannot parse the override {override!r}{reason}: write key=value"
    return (f"cannot parse the override {override!r}{reason}: quote a value that holds spaces or symbols "
            f"such as ( ) [ ] , : = (quotes for Hydra inside the shell's), e.g. {shell_override(key, value)}")


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


def _override_into_null_group(e: AssertionError) -> str | None:
    """The key of `data.cache_dir=...` when OmegaConf asserted on it while Hydra applied it to a config group
    that is null here (evaluate.yaml's `data: null`): an input error that OmegaConf reports as a failed
    assertion. None for any other assertion, which stays the bug it is."""
    for frame, _ in traceback.walk_tb(e.__traceback__):
        if frame.f_code.co_name == "_apply_overrides_to_config" and "override" in frame.f_locals:
            return str(frame.f_locals["override"].key_or_group)
    return None


# ------------------------------------------------------------------------------- the run folder, the console

_made: list[Path] = []  # the folders Hydra is about to create for this command's run, innermost first


class RunFolderCallback(Callback):
    """Keeps a command that fails from leaving a run folder behind. Listed in every primary config that makes
    a run folder, as `hydra/callbacks: run_folder`.

    Hydra makes the run folder (`hydra.run.dir`, with any missing parents) and writes `.hydra/` into it (the
    composed config, Hydra's own, the overrides) before the job starts. `on_run_start` notes which folders do
    not exist yet, so that a command that fails can take them away again (`reports_user_errors`), and takes
    over the writing of `.hydra/`: `on_job_end` writes the same three files once the job has succeeded, so a
    refused command leaves an existing folder as it was, too. (scripts/train.py, whose config sets
    `hydra.output_subdir: null`, writes them itself once the run has passed its checks.)
    """

    def __init__(self) -> None:
        self._subdir: str | None = None  # where Hydra would have written .hydra/, in the run folder

    def on_run_start(self, config: DictConfig, **kwargs: object) -> None:
        folder, missing = Path(str(config.hydra.run.dir)).absolute(), []
        while not folder.exists() and folder != folder.parent:
            missing.append(folder)
            folder = folder.parent
        _made[:] = missing
        self._subdir = config.hydra.output_subdir
        with read_write(config.hydra):
            config.hydra.output_subdir = None  # run_job writes nothing before the job

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: object) -> None:
        if self._subdir is None or job_return.status != JobStatus.COMPLETED:
            return
        hydra_cfg = copy.deepcopy(job_return.hydra_cfg)
        with read_write(hydra_cfg.hydra):
            hydra_cfg.hydra.output_subdir = self._subdir  # as it would have read
        folder = Path(config.hydra.runtime.output_dir) / self._subdir
        folder.mkdir(parents=True, exist_ok=True)
        files = {"config.yaml": job_return.cfg, "hydra.yaml": hydra_cfg,
                 "overrides.yaml": job_return.overrides}
        for name, content in files.items():
            (folder / name).write_text(OmegaConf.to_yaml(content), encoding="utf-8")


def _remove_made_folders() -> None:
    """Remove the folders Hydra made for this run, innermost first, as long as they are empty but for the
    log the job opened (a log of a command that was refused goes with its folder)."""
    for folder in _made:
        try:
            for log in folder.glob("*.log") if folder == _made[0] else ():
                if {p.name for p in folder.iterdir()} == {log.name}:
                    log.unlink()
            folder.rmdir()
        except OSError:  # something was written into it after all, or it is gone already
            break
    _made.clear()


class _ReaderMayLeave:
    """sys.stdout / sys.stderr for a command whose reader may stop reading (`| head -1`): after the first
    write that finds the pipe closed, writes are dropped (`generation.output.ClosableOutput`), so neither
    logging ("--- Logging error ---" per line) nor print reports a closed pipe as a failure."""

    def __init__(self, stream) -> None:
        self._stream, self._out = stream, ClosableOutput(stream)

    def write(self, text: str) -> int:
        self._out.write(text)
        return len(text)

    def flush(self) -> None:
        if not self._out.reader_gone:
            self._out.write("")

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextmanager
def _readers_may_leave() -> Iterator[None]:
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _ReaderMayLeave(sys.stdout), _ReaderMayLeave(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
