"""Sampling from a trained model: prefill once, then decode one token per step with a KV cache.

Read in this order:
    kv_cache.py     the preallocated per-layer K/V buffers, left padding, positions and masks
    sampling.py     temperature, top-k, top-p and the seeded draw (the only place filters live)
    window.py       the sliding-window rule once a sequence outgrows block_size
    stopping.py     end-of-text, stop strings, per-row bookkeeping of a batch
    generate.py     the KV-cached prefill + decode loop (batched, streaming)
    naive.py        the uncached reference it is tested against
    session.py      an interactive session that keeps its cache between turns
    text.py         prompts in, streamed text out
    temperature.py  the temperature tool: distributions and entropy against T
    cli.py          the body of scripts/generate.py

Nothing is imported here: `minigpt.model` imports `kv_cache` while it is itself being imported.
"""
