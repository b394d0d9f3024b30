"""The generate command: prompts in, streamed text out, or an interactive session.

Read in this order:
    config.py       GenerateConfig, the keys of configs/generate.yaml (no torch)
    text.py         prompts in (files, escapes), streamed text out
    output.py       a stdout whose reader may leave early (`| head`)
    auto.py         compile=auto: eager or compiled, whichever the steps asked for are expected to pay for
    decoder.py      a checkpoint loaded in the weights dtype asked for (int8 included), with the fastest
                    decode step for it on this machine (minigpt/fast/), compiled as `compile=` says
    speculative.py  speculative decoding: a draft proposes, the model verifies (`draft=`)
    session.py      an interactive session that keeps its KV cache between turns
    run.py          what scripts/generate.py does: load a checkpoint, sample, stream, summarise

The decoding loop, the sampling filters and the window rule they run on live in `minigpt/sampling/`; how a
step is made fast, in `minigpt/fast/`; what the switches cost and gain is in docs/decoding.md.
"""
