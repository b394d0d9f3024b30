"""Time to first token: what a user waits for between launching `generate` and its first token, eager and
compiled, with the decode-step cache cold and warm.

Each measurement is a fresh process: `scripts/generate.py` on a trained checkpoint (`make train`'s newest run
under outputs/train, unless one is given), one new token, greedy, timed from launch to exit (the token and the
summary line are the last things it does); then one run of STEADY_TOKENS tokens, whose summary line gives the
steady state (decode tokens/s) of the same setting. The settings, in this order:

    eager             compile=false
    compiled, cold    compile=true with an empty decode-step cache and an empty Inductor disk cache: choosing
                      the step, compiling it, packaging it
    compiled, warm    compile=true again, on what the cold run kept: the packaged step loaded and gated

The decode-step cache and Inductor's disk cache are folders of the section's own, so a user's are neither read
nor written.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from minigpt.checkpoint.load import find_latest_checkpoint
from minigpt.data.encode import cpu_count
from minigpt.device.cpu_load import CpuLoad
from minigpt.device.probe import cpu_model
from minigpt.fast.timing import Timing

GENERATE = Path(__file__).resolve().parents[3] / "scripts" / "generate.py"
STEADY_TOKENS = 256  # past the default model's 128-token context: window rebuilds included, as in use


def launch_to_exit(checkpoint: Path, compile: str, cache_dir: Path, run_dir: Path, env: dict,
                   tokens: int = 1) -> tuple[float, str]:
    """Seconds from launching `generate` on `checkpoint` for `tokens` tokens to its exit, and its summary
    line."""
    command = [sys.executable, str(GENERATE), f"checkpoint={checkpoint}", f"max_new_tokens={tokens}",
               "temperature=0",
               f"compile={compile}", f"cache_dir={cache_dir}", "stream=false", f"hydra.run.dir={run_dir}"]
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1200)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [""])[-1]
        raise RuntimeError(f"generate compile={compile} failed: {last}")
    return seconds, (proc.stderr.strip().splitlines() or [""])[-1]


def _number(pattern: str, summary: str) -> float | None:
    found = re.search(pattern, summary)
    return float(found.group(1)) if found else None


def bench_first_token(checkpoint: str | Path | None = None, *, repeats: int = 3,
                      compile: bool = True) -> dict:
    """See the module docstring (`compile=False`: eager only): per setting, the seconds from launch to exit
    (`repeats` runs; one cold compiled run, since each empties the caches), its summary line's compile
    seconds and the steady state's tokens/s. {"skipped": why} where no trained checkpoint is found."""
    try:
        ckpt = Path(checkpoint) if checkpoint is not None else find_latest_checkpoint(Path("outputs"))
    except Exception as e:  # noqa: BLE001 (a UserError with the fix: train one)
        return {"skipped": str(e)}
    busy = CpuLoad().measure(0.5)
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="minigpt-bench-first-token-") as tmp:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / "inductor")}
        cache = Path(tmp) / "cache"
        settings = (("eager", "false", repeats), ("compiled, cold", "true", 1),
                    ("compiled, warm", "true", repeats))[:3 if compile else 1]
        for i, (setting, flag, runs) in enumerate(settings):
            seconds, summary = [], ""
            for j in range(runs):
                s, summary = launch_to_exit(ckpt, flag, cache, Path(tmp) / f"run-{i}-{j}", env)
                seconds.append(s)
            steady = "" if setting.endswith("cold") else launch_to_exit(  # cold: it leaves the cache warm
                ckpt, flag, cache, Path(tmp) / f"run-{i}-steady", env, STEADY_TOKENS)[1]
            rows[setting] = {"launch_to_exit_s": Timing.from_samples(seconds).to_dict(), "summary": summary,
                             "compile_s": _number(r"compiled in ([\d.]+) s", summary),
                             "tokens_per_s": _number(r"decode: ([\d.]+) tokens/s", steady)}
    return {"checkpoint": str(ckpt), "machine": f"{cpu_model()} ({cpu_count()} cores)",
            "steady_tokens": STEADY_TOKENS, "rows": rows, "busy_cores_before": busy,
            "busy_cores_after": CpuLoad().measure(0.5)}
