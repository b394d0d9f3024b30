"""Other formats of the model's weights: `hf_gpt2.py` maps Hugging Face GPT-2 folders to and from `GPT`."""
