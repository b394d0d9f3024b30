"""The generation tools: prompts in, streamed text out, an interactive session, the temperature tool.

Read in this order:
    config.py       GenerateConfig and TemperatureConfig (no torch)
    text.py         prompts in (files, escapes), streamed text out
    session.py      an interactive session that keeps its KV cache between turns
    cli.py          the body of scripts/generate.py
    temperature.py  the temperature tool: distributions and entropy against T

The decoding loop, the sampling filters and the window rule they run on live in `minigpt/sampling/`.
"""
