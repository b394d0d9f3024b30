"""The bench's output: a plain-text table for people, and the same numbers as JSON for tools.

Times are medians with [min-max] of the repeats; speed-ups are ratios measured in the same run.
"""

from __future__ import annotations

import json
from pathlib import Path

from minigpt.lab.bench.attention import BACKENDS


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.0f} MiB"


def _t(t: dict, unit: float = 1e3, suffix: str = "ms") -> str:
    return f"{t['median'] * unit:.{2 if unit == 1 else 1}f} [{t['min'] * unit:.{2 if unit == 1 else 1}f}-" \
        f"{t['max'] * unit:.{2 if unit == 1 else 1}f}]" + (f" {suffix}" if suffix else "")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
    return [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.0f}%"


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


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


def format_generation(r: dict) -> list[str]:
    s = r["shape"]
    bw = r.get("read_bytes_per_s")
    out = [f"Generation: {s['n_layer']} layers x {s['n_embd']} wide, vocab {s['vocab_size']}, batch 1, "
           f"{r['prompt_tokens']} prompt + {r['new_tokens']} new tokens, greedy; weights "
           + ", ".join(f"{d} {_mib(b)}" for d, b in r["weight_bytes"].items())
           + (f"; MBU against {bw / 1e9:.1f} GB/s" if bw else "")]
    rows = [[n, f"{c['tokens_per_s']:.1f}", _t(c["time_s"], 1, ""), _pct(c.get("mbu")), _x(c["vs_reference"]),
             _x(c["vs_minigpt_cached_fp32"])] for n, c in r["contenders"].items()]
    out += _table(["contender", "tokens/s", "total s", "MBU", "vs best ref", "vs cached fp32"], rows)
    lat = r["latency"]
    positions = [k for k in next(iter(lat.values())) if not k.startswith("ratio")]
    cell = lambda v: _t(v) + (f", MBU {_pct(v['mbu'])}" if v.get("mbu") is not None else "")
    rows = [[n] + [cell(v[p]) for p in positions] + [f"{v[k]:.2f}" for k in v if k.startswith("ratio")]
            for n, v in lat.items()]
    out += ["Per-token decode latency (forward + argmax) by tokens in the cache:"]
    out += _table(["contender", *[f"~{p}" for p in positions], f"~{positions[-1]} / ~{positions[0]}"], rows)
    overhead = next((v for n, v in lat.items() if n.startswith("overhead")), None)
    if overhead and "minigpt fp32" in lat:
        p0 = positions[0]
        share = overhead[p0]["median"] / lat["minigpt fp32"][p0]["median"]
        out.append(f"Of minigpt fp32's step at ~{p0}, {overhead[p0]['median'] * 1e3:.1f} ms "
                   f"({share * 100:.0f}%) is overhead (the same ops on negligible weights), the rest reads "
                   "weights and cache")
    out += [f"  {n}" for n in r.get("notes", [])]
    pf = r["prefill"]
    out.append(f"Prefill of {pf['tokens']} tokens: minigpt {_t(pf['minigpt fp32'])}, "
               f"reference {_t(pf['reference fp32'])}")
    out.append(f"Greedy tokens equal to the reference: {r['greedy_tokens_equal_reference']}/{r['new_tokens']}"
               + (f"; bf16 equal to fp32: {r['bf16_greedy_tokens_equal_fp32']}/{r['new_tokens']}"
                  if "bf16_greedy_tokens_equal_fp32" in r else "")
               + f"; extra memory of a cached generation: {_mib(r['peak_mem_bytes'])}")
    return out


def format_compile(r: dict) -> list[str]:
    m, limit = r["model"], r["max_steps"]

    def verdict(even: float | None) -> str:
        if even is None:
            return "never (compiled steps are not faster)"
        return f"after {even:.0f} steps ({'within' if even <= limit else 'beyond'} the {limit})"

    return [f"torch.compile on the default run ({m['n_layer']} layers x {m['n_embd']} wide, vocab "
            f"{m['vocab_size']}, block {m['block_size']}, batch {r['batch_size']}): "
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
    out = [f"Technique switches on the default model (batch {r['batch_size']} x {r['block_size']}, vocab "
           f"{r['vocab_size']}, {r['dtype']}, {r['threads']} threads): the trainer's step, median of "
           f"{r['repeats']} interleaved calls of {r['steps_per_call']} steps"]
    rows = [[name, _t({"median": x["step_s"], "min": x["min_s"], "max": x["max_s"]}), f"{x['ratio']:.2f}x",
             f"{x['tokens_per_s']:,.0f}"] for name, x in r["rows"].items()]
    return out + _table(["switch", "step", "vs default", "tokens/s"], rows)


def format_report(results: dict) -> str:
    """The whole report as text; sections missing from `results` are skipped."""
    m = results["machine"]
    lines = [f"minigpt bench — {m['device']}, {m['threads']} threads, torch {m['torch']}, "
             f"{'quick' if m['quick'] else 'full'} run in {m.get('wall_s', 0):.0f} s"]
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
    if "generation" in sections:
        lines += ["", *format_generation(sections["generation"])]
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
    return "\n".join(lines)


def write_json(results: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
