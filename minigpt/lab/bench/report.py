"""The bench's output: a plain-text table for people, and the same numbers as JSON for tools.

Times are medians with [min-max] of the repeats; speed-ups are ratios measured in the same run.
"""

from __future__ import annotations

import json
from pathlib import Path

from minigpt.lab.bench.attention import BACKENDS
from minigpt.lab.bench.busy import format_busy
from minigpt.lab.bench.format import mib as _mib
from minigpt.lab.bench.format import other_load
from minigpt.lab.bench.format import pct as _pct
from minigpt.lab.bench.format import table as _table
from minigpt.lab.bench.format import timing as _t
from minigpt.lab.bench.format import x as _x
from minigpt.lab.bench.report_decoding import FORMATTERS as DECODING_FORMATTERS


def format_peak(p: dict) -> list[str]:
    out = [f"Peak (square {p['n']}x{p['n']} matmuls, {p['threads']} threads, {p['device_name']}): "
           f"fp32 {p['fp32_flops'] / 1e9:.1f} GFLOP/s, bf16 {p['bf16_flops'] / 1e9:.1f} GFLOP/s; "
           f"read bandwidth {p['read_bytes_per_s'] / 1e9:.1f} GB/s ({_mib(p['read_bytes'])} buffer)"]
    if p.get("datasheet_tflops"):
        out.append(f"Datasheet dense bf16 peak: {p['datasheet_tflops']:.0f} TFLOP/s")
    return out


def format_train(name: str, r: dict) -> list[str]:
    s = r["shape"]
    head = (f"Training step {name}: {s['n_layer']} layers x {s['n_embd']} wide x {s['n_head']} heads, "
            f"vocab {s['vocab_size']}, block {s['block_size']}, batch {s['batch_size']} "
            f"({r['tokens_per_step']} tokens/step); MFU against the peak of each row's dtype")
    rows = [[n, f"{c['tokens_per_s']:.0f}", _t(c["step_s"], 1, ""), _pct(c["mfu"]), _mib(c["peak_mem_bytes"]),
             _x(c.get("speedup_vs_reference")), _x(c.get("speedup_vs_best_reference")),
             "-" if c.get("compile_s") is None else f"{c['compile_s']:.0f} s"]
            for n, c in r["contenders"].items()]
    header = ["contender", "tokens/s", "step s", "MFU", "peak mem", "vs ref fp32", "vs best ref", "compile"]
    notes = [f"  {n}" for n in r.get("notes", [])]
    default = r.get("trainer_default")
    if default:
        row = r["contenders"].get(default["row"] or "")
        ratio = (f": {_x(row.get('speedup_vs_best_reference'))} the best reference" if row
                 else " (not measured here)")
        notes.append(f"  `make train` runs {default['row'] or default['dtype']}{ratio} "
                     f"[dtype {default['reason']}; compile {default['compile']}]")
    return [head, *_table(header, rows), *notes]


def format_compile(r: dict) -> list[str]:
    m, limit = r["model"], r["max_steps"]

    def verdict(even: float | None) -> str:
        if even is None:
            return "never (compiled steps are not faster)"
        return f"after {even:.0f} steps ({'within' if even <= limit else 'beyond'} the {limit})"

    return [f"torch.compile on the Llama-style run (`model=demo`, {m['n_layer']} layers x {m['n_embd']} "
            f"wide, vocab {m['vocab_size']}, block {m['block_size']}, batch {r['batch_size']}): "
            f"step {_t(r['eager_step_s'])} eager vs {_t(r['compiled_step_s'])} compiled "
            f"({r['speedup']:.2f}x); a first run compiles in {r['compile_s']:.0f} s and wins it back "
            f"{verdict(r['break_even_steps'])}, a later one (Inductor's cache filled) in "
            f"{r['compile_warm_s']:.0f} s, {verdict(r['break_even_steps_warm'])}"]


def format_attention(r: dict) -> list[str]:
    out = [f"Attention forward (causal, batch {r['batch']}, {r['heads']} head(s), head size {r['head_dim']}, "
           f"online block {r['online_block_size']}): time, extra peak memory"]
    rows = []
    for t, row in r["lengths"].items():
        cells = [f"{_t(row[b]['time_s'])}, {_mib(row[b]['peak_mem_bytes'])}" for b in BACKENDS]
        rows.append([t, _mib(row["scores_bytes"]), *cells])
    return out + _table(["T", "(T,T) fp32", *BACKENDS], rows)


def format_data(r: dict) -> list[str]:
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in r["phases_s"].items() if k != "total")
    return [f"Data: prepare {r['corpus']} with {r['tokenizer']} from scratch in {r['prepare_s']:.1f} s "
            f"({phases}); {r['tokens'].get('train', 0):,} train tokens; "
            f"encode {r['encode_mb_per_s']:.2f} MB/s (one call per document), "
            f"{r['encode_batch_mb_per_s']:.2f} MB/s (threaded batch)",
            *format_data_verify(r)]


def format_data_verify(r: dict) -> list[str]:
    if "verify_s" not in r:
        return []
    v, syn = r["verify_s"], r["synthetic"]
    return [f"Data cache reuse: {r['shard_mb']:.1f} MB of shards verified in {v['stamp'] * 1e3:.1f} ms by "
            f"stamps, {v['hash'] * 1e3:.1f} ms by sha256 (whole reuse {r['reuse_prepare_s']:.2f} s); "
            f"{syn['mb']} MB in {syn['shards']} shards: written in {syn['write_s']:.1f} s, verified in "
            f"{syn['verify_s']['stamp'] * 1e3:.1f} ms by stamps, {syn['verify_s']['hash']:.2f} s by sha256 "
            f"({syn['hash_mb_per_s']:,.0f} MB/s); loader {syn['loader_tokens_per_s'] / 1e6:.1f}M tokens/s "
            f"at B x T = {syn['loader_shape'][0]} x {syn['loader_shape'][1]}"]


def format_train_loop(r: dict) -> list[str]:
    s = r["shape"]
    mem = f", peak memory {_mib(r['peak_mem_bytes'])}" if r.get("peak_mem_bytes") else ""
    return [f"Training loop: {s['n_layer']} layers x {s['n_embd']} wide, vocab {s['vocab_size']}, block "
            f"{s['block_size']}, batch {r['batch_size']}, {r['dtype']}, compile {r['compile']}, "
            f"{r['attention']} attention: "
            f"{r['tokens_per_s']:,.0f} tokens/s over {r['steps']} steps ({r['step_s'] * 1e3:.1f} ms/step, "
            f"warm-up {r['warmup_s']:.1f} s), MFU {r['mfu'] * 100:.1f}% of the {r['peak_source']} peak "
            f"{r['peak_flops'] / 1e9:,.0f} GFLOP/s{mem}; loss {r['loss_first']:.3f} -> {r['loss_last']:.3f}"]


def format_techniques(r: dict) -> list[str]:
    out = [f"Technique switches on the Llama-style model (batch {r['batch_size']} x {r['block_size']}, vocab "
           f"{r['vocab_size']}, {r['dtype']}, {r['threads']} threads): the trainer's step, median of "
           f"{r['repeats']} interleaved calls of {r['steps_per_call']} steps"]
    rows = [[name, _t({"median": x["step_s"], "min": x["min_s"], "max": x["max_s"]}), f"{x['ratio']:.2f}x",
             f"{x['tokens_per_s']:,.0f}", f"{x['cpu_ratio']:.2f}x" if "cpu_ratio" in x else "-"]
            for name, x in r["rows"].items()]
    return out + _table(["switch", "step", "vs default", "tokens/s", "CPU time vs default"], rows)


def format_report(results: dict) -> str:
    """The whole report as text; sections missing from `results` are skipped."""
    m = results["machine"]
    why = f" ({m['threads_reason']})" if m.get("threads_reason") else ""
    lines = [f"minigpt bench — {m['device']}, {m['threads']} threads{why}, torch {m['torch']}, "
             f"{'quick' if m['quick'] else 'full'} run in {m.get('wall_s', 0):.0f} s{other_load(m)}"]
    sections = dict(results["sections"])
    for name, r in list(sections.items()):
        if "error" in r:
            lines += ["", f"{name}: FAILED ({r['error']})"]
            del sections[name]
    if "peak" in sections:
        lines += ["", *format_peak(sections["peak"])]
    for name in ("train_S", "train_M"):
        if name in sections:
            lines += ["", *format_train(name.removeprefix("train_"), sections[name])]
    for name, fmt in DECODING_FORMATTERS.items():
        if name in sections:
            lines += ["", *fmt(sections[name])]
    if "attention" in sections:
        lines += ["", *format_attention(sections["attention"])]
    if "data" in sections:
        lines += ["", *format_data(sections["data"])]
    if "train_loop" in sections:
        lines += ["", *format_train_loop(sections["train_loop"])]
    if "compile" in sections:
        lines += ["", *format_compile(sections["compile"])]
    if "techniques" in sections:
        lines += ["", *format_techniques(sections["techniques"])]
    if "busy" in sections:
        lines += ["", *format_busy(sections["busy"])]
    return "\n".join(lines)


def write_json(results: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
