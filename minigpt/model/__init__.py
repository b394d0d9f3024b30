"""The transformer: a GPT-style decoder built from one concept per file.

Shape legend, used in every docstring and `# (...)` comment of this package:

    B    batch size
    T    time: the number of tokens in this forward call (queries)
    S    key/value length: T without a cache, cached length + T with one
    C    n_embd, the width of the residual stream
    H    n_head, the number of query heads
    H_kv n_kv_head, the number of key/value heads (H_kv < H is grouped-query attention)
    D    head size, C // H
    V    vocab_size
    L    n_layer

Data flow (read the files in this order): config.py (every choice, validated), embedding.py (token
embedding + positional encoding), previous_token.py (the smear and the bigram table), rope.py, norm.py,
attention.py (+ online_softmax.py), ffn.py, block.py, residual_scalars.py, kv_cache.py, init.py (how the
weights start), chunked_loss.py (the head and the loss fused, chunk by chunk), gpt.py, factory.py;
int8.py, packed.py and streamed.py (the ways a decode step's products and one-query attention can be
computed, chosen by generation/kernels.py) stand beside them.
Nothing is imported here, so `minigpt.model.config` can be imported without torch (the config schemas do).
"""
