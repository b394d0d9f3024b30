"""Checkpoints: minigpt's weights on disk, and the one loader every tool uses.

    format.py   the folder format: atomic save, meta.json, weights, resumable state, RNG streams
    load.py     finding a checkpoint (folder, run folder, newest run) and loading it for inference
    hf.py       Hugging Face GPT-2 folders <-> minigpt checkpoints (through interop/hf_gpt2.py)
"""
