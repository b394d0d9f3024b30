"""Checkpoints: the format in one place, and the one loader every tool uses.

Read in this order:
    format.py     the folder: its files, the atomic save, reading and verifying each file
    contents.py   what a training checkpoint holds: state.pt's and meta.json's keys, the run's counters
    load.py       finding a checkpoint (folder, run folder, newest run) and loading it for inference

Other formats (Hugging Face folders, GGUF) are converted to and from this one in `minigpt/interop/`.
"""
