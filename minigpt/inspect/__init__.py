"""Looking inside a trained model: what training's evaluation and the look-inside commands share.

    config.py          EvaluateConfig and AttentionMapsConfig (no torch)
    perplexity.py      scoring a text: loss, perplexity and bits per byte (training's validation, evaluate.py)
    attention_maps.py  every head's attention drawn (TensorBoard images, scripts/attention_maps.py)
    plotting.py        matplotlib's headless Agg canvas, shared by every figure

Figures are drawn on the Agg canvas and written as PNG, never through pyplot's global state, so nothing
here needs a display.
"""
