"""Other formats of a model, in and out of minigpt's checkpoints.

    hf_gpt2.py        Hugging Face GPT-2 weights <-> `GPT` (the name-by-name mapping)
    hf_checkpoint.py  Hugging Face GPT-2 folders <-> minigpt checkpoint folders
"""
