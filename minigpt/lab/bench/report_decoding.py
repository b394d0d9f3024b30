"""The decoding sections of the bench's report: plain-text tables (Markdown-compatible), one function each.

`render_decoding_doc` turns a bench JSON into the measured part of docs/decoding.md: the same tables, with the
machine they were measured on (scripts/decoding_doc.py; `make docs` keeps the checked-in file current).
"""

from __future__ import annotations

from minigpt.lab.bench.format import mib, other_load, pct, table, timing, x

DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "int8": "int8"}


def format_generation(r: dict) -> list[str]:
    s = r["shape"]
    bw = r.get("read_bytes_per_s")
    out = [f"Generation: {s['n_layer']} layers x {s['n_embd']} wide, vocab {s['vocab_size']}, batch 1, "
           f"{r['prompt_tokens']} prompt + {r['new_tokens']} new tokens, greedy; weights read per token "
           + ", ".join(f"{d} {mib(b)}" for d, b in r["weight_bytes"].items())
           + (f"; MBU against {bw / 1e9:.1f} GB/s" if bw else "")]
    rows = [[n, f"{c['tokens_per_s']:.1f}", timing(c["time_s"], 1, ""), pct(c.get("mbu")),
             x(c["vs_reference"]), x(c["vs_minigpt_fp32"]),
             "-" if c.get("compile_s") is None else f"{c['compile_s']:.0f} s"]
            for n, c in r["contenders"].items()]
    header = ["contender", "tokens/s", "total s", "MBU", "vs best HF", "vs minigpt fp32", "compile"]
    out += table(header, rows)
    if r.get("targets"):
        out.append("Targets (minigpt's best setting per dtype against llama.cpp's weights of the same size):")
        out += table(["minigpt", "llama.cpp", "ratio", "target", "met"],
                     [[t["ours"], t["theirs"], x(t["ratio"]), f">= {t['target']}x",
                       "yes" if t["met"] else "no"] for t in r["targets"]])
    lat = r["latency"]
    positions = [k for k in next(iter(lat.values())) if not k.startswith("ratio")]
    cell = lambda v: timing(v) + (f", MBU {pct(v['mbu'])}" if v.get("mbu") is not None else "")
    rows = [[n] + [cell(v[p]) for p in positions] + [f"{v[k]:.2f}" for k in v if k.startswith("ratio")]
            for n, v in lat.items()]
    out += ["Per-token decode latency (forward + argmax) by tokens in the cache:"]
    out += table(["contender", *[f"~{p}" for p in positions], f"~{positions[-1]} / ~{positions[0]}"], rows)
    out += _overhead(lat, positions[0])
    out += [f"  {n}" for n in r.get("notes", [])]
    out += [f"  {name}: {'; '.join(notes)}" for name, notes in r.get("setups", {}).items()]
    pf = r["prefill"]
    out.append(f"Prefill of {pf['tokens']} tokens: minigpt {timing(pf['minigpt fp32'])}, "
               f"reference {timing(pf['reference fp32'])}")
    equal = r.get("greedy_tokens_equal_fp32", {})
    out.append(f"Greedy tokens equal to the reference: {r['greedy_tokens_equal_reference']}/{r['new_tokens']}"
               + "".join(f"; {n} equal to fp32: {v}/{r['new_tokens']}" for n, v in equal.items()
                         if n != "minigpt fp32")
               + f"; extra memory of a cached generation: {mib(r['peak_mem_bytes'])}")
    return out


def _overhead(lat: dict, p0: str) -> list[str]:
    out = []
    for suffix in ("", " compiled"):
        rows = (v for n, v in lat.items() if n.startswith("overhead") and n.endswith(suffix or ")"))
        overhead = next(rows, None)
        step = lat.get(f"minigpt fp32{suffix}")
        if overhead and step:
            share = overhead[p0]["median"] / step[p0]["median"]
            out.append(f"Of minigpt fp32{suffix}'s step at ~{p0}, {overhead[p0]['median'] * 1e3:.2f} ms "
                       f"({share * 100:.0f}%) is overhead (the same ops on negligible weights{suffix}), "
                       "the rest reads weights and cache")
    return out


def format_default_decode(r: dict) -> list[str]:
    m = r["model"]
    out = [f"The Llama-style model's decoding (`model=demo`, {m['n_layer']} layers x {m['n_embd']} wide, "
           f"{m['n_head']} heads, {m['n_kv_head']} KV head, vocab {m['vocab_size']}, {r['params']:,} "
           "parameters), batch 1, "
           f"{r['prompt_tokens']} prompt + {r['new_tokens']} new tokens, greedy, {r['threads']} threads:"]
    out += table(["decode step", "tokens/s", "total s", "step alone (~64 cached)"],
                 [[n, f"{row['tokens_per_s']:.0f}", timing(row["time_s"], 1, ""), timing(row["step_s"])]
                  for n, row in r["rows"].items()])
    out.append(f"Target: >= {r['target_tokens_per_s']:.0f} tokens/s: {'met' if r['met'] else 'not met'}")
    return out


def format_decode_batch(r: dict) -> list[str]:
    s = r["shape"]
    out = [f"Batch decoding: {s['n_layer']} layers x {s['n_embd']} wide, vocab {s['vocab_size']}, "
           f"{r['prompt_tokens']} prompt + {r['new_tokens']} new tokens per row, greedy, decode step "
           f"{'compiled' if r['compile'] else 'eager'}: tokens/s of all rows, ms per step (a token per row)"]
    sizes = [str(b) for b in r["batch_sizes"]]
    cell = lambda row: f"{row['tokens_per_s']:.0f}, {row['step_s'] * 1e3:.1f} ms"
    rows = [[DTYPE_NAMES.get(d, d)] + [cell(per[b]) for b in sizes] + [str(per["saturates_at"])]
            for d, per in r["rows"].items()]
    return out + table(["weights", *[f"batch {b}" for b in sizes], "saturates at"], rows)


def format_speculative(r: dict) -> list[str]:
    s = r["shape"]
    out = [f"Speculative decoding: {s['n_layer']} layers x {s['n_embd']} wide (float32, redrawn weights), "
           f"vocab {s['vocab_size']}, {r['prompt_tokens']} prompt + {r['new_tokens']} new tokens, greedy, "
           f"decode steps {'compiled' if r['compile'] else 'eager'}:"]
    rows = []
    for name, row in r["rows"].items():
        extra = ["-", "-", "-", "-"] if name == "plain" else [
            pct(row["acceptance_rate"]), f"{row['tokens_per_forward']:.2f}", x(row["speedup"]),
            "yes" if row["same_tokens"] else "NO"]
        rows.append([name, f"{row['tokens_per_s']:.1f}", *extra])
    header = ["draft", "tokens/s", "accepted", "tokens per forward", "speed-up", "same tokens"]
    return out + table(header, rows)


def format_decode_accuracy(r: dict) -> list[str]:
    if "skipped" in r:
        return [f"Decoding accuracy: skipped ({r['skipped']})"]
    m = r["model"]
    out = [f"Decoding accuracy of {r['checkpoint']} ({m['n_layer']} layers x {m['n_embd']} wide, vocab "
           f"{m['vocab_size']}) against its float32 self:"]
    rows = []
    for name in r["logits"]:
        lg, greedy = r["logits"][name], r["greedy"][name]
        rows.append([DTYPE_NAMES[name], f"{lg['max_abs']:.3f} ({lg['max_over_std']:.3f} std)",
                     f"{lg['mean_abs']:.4f}", pct(greedy["agreement"]),
                     ", ".join(str(i) for i in greedy["first_divergence"]), f"{r['val'][name]['loss']:.4f}",
                     f"{r['val'][name]['bpb']:.4f}"])
    fp32 = r["val"]["fp32"]
    rows.insert(0, ["float32", "-", "-", "-", "-", f"{fp32['loss']:.4f}", f"{fp32['bpb']:.4f}"])
    return out + table(["weights", "max logit error", "mean", f"greedy agreement ({r['new_tokens']} tokens)",
                        "first divergence", "val loss", "bits/byte"], rows)


def format_step_spread(r: dict) -> list[str]:
    if "skipped" in r:
        return [f"Spread of whole-step timings: skipped ({r['skipped']})"]
    s = r["shape"]
    out = [f"How far apart equal decode steps measure: {s['n_layer']} layers x {s['n_embd']} wide, vocab "
           f"{s['vocab_size']}, batch 1, compiled, each step on a copy of its own; the median over "
           f"interleaved rounds of each round's ratio, in {r['runs']} runs (the whole-step choice takes a "
           f"twin at {r['margin']}x):"]
    rows = []
    for dtype, per in r["dtypes"].items():
        for pair, ratios in per["ratios"].items():
            rows.append([DTYPE_NAMES.get(dtype, dtype), pair, ", ".join(f"{v:.3f}" for v in ratios),
                         f"{min(ratios):.3f}-{max(ratios):.3f}"])
    out += table(["weights", "pair", "paired speed-up by run", "range"], rows)
    out += [f"{DTYPE_NAMES.get(d, d)} steps as chosen: {per['kernels']}" for d, per in r["dtypes"].items()]
    return out


def format_first_token(r: dict) -> list[str]:
    if "skipped" in r:
        return [f"Time to first token: skipped ({r['skipped']})"]
    load = ""
    if r.get("busy_cores_before") is not None:
        load = (f"; other processes kept {r['busy_cores_before']:.2f} cores busy before it, "
                f"{r['busy_cores_after']:.2f} after")
    out = [f"Time to first token of {r['checkpoint']} on {r['machine']}: a fresh `generate max_new_tokens=1` "
           f"process per run, launch to exit, greedy, batch 1; the steady state from one run of "
           f"{r['steady_tokens']} tokens in the same setting{load}:"]
    rows = [[name, timing(row["launch_to_exit_s"], 1, "s"),
             "-" if row["compile_s"] is None else f"{row['compile_s']:.1f} s",
             "-" if row["tokens_per_s"] is None else f"{row['tokens_per_s']:.0f}"]
            for name, row in r["rows"].items()]
    out += table(["setting", "launch to first token", "compiling (summary line)", "tokens/s after"], rows)
    out += [f"  {name}: {row['summary']}" for name, row in r["rows"].items()]
    return out


FORMATTERS = {"generation": format_generation, "default_decode": format_default_decode,
              "first_token": format_first_token,
              "decode_batch": format_decode_batch, "speculative": format_speculative,
              "step_spread": format_step_spread, "decode_accuracy": format_decode_accuracy}


def render_decoding_doc(results: dict, command: str) -> str:
    """The measured part of docs/decoding.md from a bench JSON holding the decoding sections (`command`
    rewrites that JSON)."""
    m = results["machine"]
    native = (f"bfloat16 is native there ({', '.join(m['bf16_units'])})" if m.get("bf16_units")
              else "bfloat16 is not native there: its bfloat16 rows are emulated and still to be taken on "
                   "a CPU with avx512_bf16 or AMX")
    run = "a --quick run (small sizes, single repeats)" if m.get("quick") else "a full run"
    threads = f"{m['threads']} thread{'s' if m['threads'] != 1 else ''}"
    lines = ["Rendered by `scripts/decoding_doc.py` (`make docs`) from docs/decoding.json, which",
             f"`{command}` rewrites.", "",
             f"These numbers: {run} on {m['device']}, {threads}, torch {m['torch']}; {native}"
             f"{other_load(m)}.",
             "Ratios within one run (interleaved repeats, medians) carry from machine to machine; absolute",
             "speeds are the machine's and its load's.", ""]
    for name, fmt in FORMATTERS.items():
        section = results["sections"].get(name)
        if section is not None:
            body = [f"{name}: FAILED ({section['error']})"] if "error" in section else fmt(section)
            lines += [*_markdown(body), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _markdown(lines: list[str]) -> list[str]:
    """Report lines as Markdown: a blank line around each table, text lines as paragraphs of their own."""
    out: list[str] = []
    for line in lines:
        in_table = line.startswith("|")
        if out and (in_table != out[-1].startswith("|") or not in_table):
            out.append("")
        out.append(line.strip() if not in_table else line)
    return out
