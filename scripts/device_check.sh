#!/usr/bin/env bash
# A time-boxed (< 8 min) check of minigpt on a CUDA machine, writing one JSON file.
#
#   scripts/device_check.sh [OUT_PATH]            # on a GPU machine; OUT_PATH defaults to $OUT/device_check.json
#   scripts/device_check.sh --cpu-smoke [OUT_PATH] # without a GPU: tiny sizes, proves the script runs
#
# Made to succeed on its first try on a machine with no network whose Python has torch, tiktoken, safetensors,
# tensorboard, transformers, matplotlib, tqdm and pytest but not hydra-core, omegaconf, antlr4-python3-runtime or
# rustbpe. Before coming here, on a machine with network: `make device-wheels` (fills .whl/, git-ignored), and
# bring .whl along with the working tree (it is git-ignored, so copy it explicitly). Environment: PYTHON
# (default python3), DEVICE_WHEELS (default .whl).
#
# Steps, each under its own timeout so one stuck step cannot eat the budget:
#   1. install the wheels offline (pip --no-index --no-deps) into a fresh temporary folder, put it and this
#      working tree on PYTHONPATH (nothing is installed into the machine's Python), and record which packages
#      import, before anything imports minigpt
#   2. the CUDA-marked tests:               pytest -m cuda
#   3. scripts/bench.py on the device: matmul peaks and read bandwidth, training steps S and M against the HF
#      reference (fp32 and bf16 autocast, the fused loss), generation (cached / uncached / HF generate with
#      fp32 and bf16 weights, MBU, latency, prefill), attention backends, and a sustained GPT-2-small (124M)
#      training loop with bf16 autocast + torch.compile + SDPA (flash): tokens/s and MFU against the datasheet
#      peak (target: >= 40% on H100/H200)
#   4. merge everything (install log, test summary, bench results, nvidia-smi) into one JSON
set -uo pipefail

SMOKE=0
if [[ "${1:-}" == "--cpu-smoke" ]]; then SMOKE=1; shift; fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT_PATH="${1:-${OUT:-$ROOT/outputs/device_check}/device_check.json}"
WHEELS="${DEVICE_WHEELS:-$ROOT/.whl}"
PY="${PYTHON:-$(command -v python3 || command -v python)}"
WORK="$(mktemp -d)"
SITE="$WORK/site"
mkdir -p "$(dirname "$OUT_PATH")"
START=$(date +%s)
step() { echo "[device_check] $(( $(date +%s) - START ))s: $*" >&2; }

# 1. install ------------------------------------------------------------------------------------------
step "install the wheels of $WHEELS offline into $SITE ($PY)"
INSTALL_RC=0
shopt -s nullglob
WHEEL_FILES=("$WHEELS"/*.whl)
shopt -u nullglob
if (( ${#WHEEL_FILES[@]} )); then
  timeout 120 "$PY" -m pip install --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
    --target "$SITE" "${WHEEL_FILES[@]}" >"$WORK/install.log" 2>&1 || INSTALL_RC=$?
else
  echo "no wheels in $WHEELS: run \`make device-wheels\` on a machine with network and carry .whl here" \
    | tee "$WORK/install.log" >&2
  INSTALL_RC=3
fi
# the wheels first (they are what this check was prepared with), then minigpt from this working tree
export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
"$PY" - >"$WORK/imports.json" 2>>"$WORK/install.log" <<'PYEOF'
import importlib, json
mods = ["torch", "hydra", "omegaconf", "antlr4", "tiktoken", "rustbpe", "safetensors", "tensorboard", "tqdm",
        "numpy", "matplotlib", "pytest", "transformers", "minigpt.config"]
found = {}
for m in mods:
    try:
        found[m] = getattr(importlib.import_module(m), "__version__", "ok")
    except Exception as e:  # report, do not stop: the sections that need it will say so
        found[m] = f"missing: {type(e).__name__}: {e}"[:200]
print(json.dumps(found))
PYEOF

# 2. CUDA tests ---------------------------------------------------------------------------------------
# Only the files holding CUDA tests are collected: the others may import dev-only packages (hypothesis) the image
# need not have. Plugin autoloading is off, so the image's own pytest plugins cannot change the run.
CUDA_TESTS=($(grep -l "pytest.mark.cuda" tests/test_*.py))
step "pytest -m cuda (${#CUDA_TESTS[@]} files)"
TEST_RC=0
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 timeout 150 "$PY" -m pytest -m cuda -q -p no:cacheprovider "${CUDA_TESTS[@]}" \
  >"$WORK/pytest.log" 2>&1 || TEST_RC=$?

# 3. benchmarks ---------------------------------------------------------------------------------------
step "bench"
BENCH_RC=0
if [[ $SMOKE == 1 ]]; then
  BENCH_ARGS=(device=cpu quick=true 'only=[peak,train_loop]')
  BENCH_TIMEOUT=240
else
  # compile is measured where it matters (the training loop); per-step contenders stay eager to save time
  BENCH_ARGS=(device=cuda compile=false 'only=[peak,train_S,train_M,generation,attention,train_loop]')
  BENCH_TIMEOUT=330
fi
timeout "$BENCH_TIMEOUT" "$PY" scripts/bench.py "${BENCH_ARGS[@]}" "json_out=$WORK/bench.json" \
  >"$WORK/bench.txt" 2>"$WORK/bench.err" || BENCH_RC=$?
cat "$WORK/bench.txt" >&2

# 4. one JSON -----------------------------------------------------------------------------------------
step "write $OUT_PATH"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader >"$WORK/smi.txt" 2>&1 || true
"$PY" - "$WORK" "$OUT_PATH" "$SMOKE" "$INSTALL_RC" "$TEST_RC" "$BENCH_RC" "$(( $(date +%s) - START ))" <<'PYEOF'
import json, sys
from pathlib import Path
work, out, smoke, install_rc, test_rc, bench_rc, wall = sys.argv[1:]
work = Path(work)
tail = lambda name, n=30: "\n".join((work / name).read_text(errors="replace").splitlines()[-n:]) if (work / name).exists() else ""
bench = json.loads((work / "bench.json").read_text()) if (work / "bench.json").exists() else None
imports = (work / "imports.json").read_text() if (work / "imports.json").exists() else ""
result = {
    "mode": "cpu-smoke" if smoke == "1" else "cuda",
    "wall_s": int(wall),
    "install": {"rc": int(install_rc), "log_tail": tail("install.log", 10), "imports": json.loads(imports or "{}")},
    "tests": {"rc": int(test_rc), "summary": tail("pytest.log", 1), "log_tail": tail("pytest.log", 40)},
    "bench": {"rc": int(bench_rc), "results": bench, "table": (work / "bench.txt").read_text()
              if (work / "bench.txt").exists() else "", "stderr_tail": tail("bench.err", 20)},
    "nvidia_smi": tail("smi.txt", 5),
}
loop = (bench or {}).get("sections", {}).get("train_loop")
if loop and "error" not in loop:
    result["headline"] = {"train_tokens_per_s": loop["tokens_per_s"], "mfu": loop["mfu"],
                          "peak_source": loop["peak_source"], "mfu_target_met": loop["mfu"] >= 0.40}
Path(out).write_text(json.dumps(result, indent=2) + "\n")
print(json.dumps(result.get("headline", {})))
PYEOF
step "done (install rc $INSTALL_RC, tests rc $TEST_RC, bench rc $BENCH_RC)"
rm -rf "$WORK"
# pytest exits 5 when every test was deselected/skipped (no CUDA): not a failure of the check itself
[[ $INSTALL_RC == 0 && $BENCH_RC == 0 && ( $TEST_RC == 0 || $TEST_RC == 5 ) ]]
