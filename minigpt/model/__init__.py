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

Read in this order, the order a batch of token ids flows through the network:
    embedding.py        token embedding + additive positional encodings (learned, sinusoidal, ablations)
    rope.py             rotary positions: q and k rotated by their position
    norm.py             LayerNorm and RMSNorm
    attention.py        causal multi-head self-attention, its backends (math, sdpa, online) and GQA
    online_softmax.py   the `online` backend: a softmax computed while streaming over key blocks
    ffn.py              the position-wise feed-forward network
    previous_token.py   two cheap ways to show each token its predecessor (technique switches)
    residual_scalars.py learned scalars on the stream, the embedding's return and the backout (switches)
    block.py            one block: attention then FFN, each in a residual connection and a norm
    init.py             how every weight starts (model.init: gpt2 | fan_in)
    kv_cache.py         the key/value cache that lets decoding feed one token per step
    chunked_loss.py     cross-entropy fused with the output projection, a chunk of rows at a time
    gpt.py              the whole model: token ids in, logits (and the loss) out
    factory.py          build_model: the one place a ModelConfig becomes a GPT, with its weights if given
    config.py           ModelConfig, validated before any tensor is allocated (no torch)
    int8.py             weight-only int8: the linear layers' matrices in a quarter of float32's bytes

Nothing is imported here, so `minigpt.model.config` can be imported without torch (the config schemas do).
"""
