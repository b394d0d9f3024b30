"""Seeing inside a transformer: attention maps, the shape walk, positional encodings, loss curves, perplexity.

Every tool is a plain library function (typed arguments in, a figure, a table or numbers out), so the
tests call them directly; `scripts/` holds the thin command-line entry points. Figures are drawn on
matplotlib's headless Agg canvas and written as PNG (see plotting.py), never through pyplot's global
state, so nothing here needs a display.
"""
