"""Sampling from a model: from logits to tokens, and the KV-cached decoding loop that both training (its
samples at each evaluation) and the generate command run.

Read in this order:
    params.py       the sampling knobs (temperature, top-k, top-p) and their validation; no torch
    next_token.py   temperature, top-k, top-p and the seeded draw (the only place filters live)
    sequences.py    what both loops share: the sliding-window rule, stopping, one Sampled record per token
    naive.py        the deliberately simple uncached reference
    decode.py       the decode step (`decode_forward`), the KV-cached prefill + decode loop (batched,
                    streaming), and `sample_text`

The KV cache itself belongs to the model (`minigpt/model/kv_cache.py`).
"""
