"""The workshop: making decoding fast on this machine, apart from the classroom it speeds up.

One entry point, `fastest.fastest_step(model, rows=, compile=, cache=)`: the fastest decode step for this
model on this machine that gives the eager step's tokens. The classroom (model/, sampling/) decodes correctly
without any of this: a model's decode step is `sampling.decode.decode_forward`, and a model can be handed a
faster one's pieces (a layout of its matrices, a decode attention) without knowing how they were chosen.

Read in this order:
    timing.py       the one timing harness (interleaved rounds, summaries) and the margins a choice must
                    win by; the bench times with it too
    compiler.py     how the wing compiles: options, copies with graphs of their own, frozen weights, oneDNN
    packed.py       a linear layer's matrix in oneDNN's blocked layout, and its product as an operator
    streamed.py     products and one-query attention written as the sums they are, for Inductor to generate
    layouts.py      the ways a model's matrices can be stored (out_in, in_out, packed, streamed)
    attention.py    a decode step's one-query attention: the candidates, timed
    step.py         Plan (a plain record of how a step computes) and the DecodeStep built from it
    products.py     the products' layouts, oneDNN flag and freezing, timed on the matrices themselves
    int8.py         int8 weights with their activations' dtype timed
    whole_steps.py  whole decode steps timed: a compiled step against its streamed twin, the eager step alone
    gate.py         the numbers gate: a step is used only where it gives the eager step's logits and tokens
    kept.py         what a step chose and compiled (its plan, Inductor's artifacts), kept per machine, model
                    and dtype, so a later run skips choosing and compiling; damaged records chosen again
    fastest.py      fastest_step: measure a plan (or read a kept one), build the candidates, gate them, hand
                    back the first to pass

What each choice measured on one machine, and why it was made: docs/decoding.md.
"""
