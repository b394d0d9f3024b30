"""Benchmarks: measured speed of training, generation, attention and data preparation.

One concept per file: timing.py (interleaved repeats, medians, peak memory), peak.py (the MFU
denominator), reference.py (Hugging Face GPT-2 with the same weights), train_step.py,
generation.py and the decoding sections beside it (default_decode.py, decode_batch.py, speculative.py,
step_spread.py, decode_accuracy.py, llama_cpp.py), attention.py, data.py, busy.py (training beside a busy
loop, with the thread count measured and fixed), suite.py (which sections, what sizes), report.py (table,
JSON).
`scripts/bench.py` is the command; tests check the harness's correctness, never its timings.
"""
