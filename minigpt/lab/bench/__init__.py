"""Benchmarks: measured speed of training, generation, attention and data preparation.

Timing itself is the wing's harness (minigpt/fast/timing.py: interleaved rounds, medians), so the bench and
the decoding choices it reports time alike. Read in this order:
    resources.py        peak memory of a call
    peak.py             the denominators of MFU and MBU: this machine's matmul rate and read bandwidth
    reference.py        Hugging Face GPT-2 holding exactly minigpt's weights
    train_step.py       training-step throughput against the reference
    train_loop.py       sustained training with the trainer's own step code (only when asked for)
    busy.py             training beside a busy loop, threads measured and fixed (only when asked for)
    compile.py          does torch.compile pay for the Llama-style run (only when asked for)
    techniques.py       what each technique switch costs per training step (only when asked for)
    generation.py       decoding speed: minigpt's dtypes, eager and compiled, against HF and llama.cpp
    llama_cpp.py        llama.cpp on the generation section's shape
    default_decode.py   the Llama-style model's decoding, eager and compiled
    first_token.py      time to first token of a fresh `generate`, eager and compiled, cold and warm
    decode_batch.py     decoding throughput as the batch grows
    speculative.py      drafts' acceptance rate and speed-up
    step_spread.py      how far apart equal compiled steps measure: the noise a whole-step choice must beat
    decode_accuracy.py  what bfloat16 and int8 weights cost a trained model in accuracy
    attention.py        attention backends' time and memory at growing T
    data.py             preparing the default corpus, encoding, verifying a cache
    sections.py         the sections by name and `only=` selection (no torch)
    suite.py            which sections run, at which sizes
    format.py           cells and tables of the plain-text report
    report_decoding.py  the decoding sections' tables (also docs/decoding.md)
    report.py           the report: a plain-text table for people, JSON for tools
`scripts/bench.py` is the command; tests check the harness's correctness, never its timings.
"""
