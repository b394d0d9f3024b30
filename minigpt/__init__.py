"""minigpt: small GPT-style transformers to read, train and sample from."""

__version__ = "0.1.0"
