"""Data: corpora -> tokenizer -> token bins -> batches.

    sources.py     the corpora (pystdlib, shakespeare, text) read into documents, split train/val by file
    tokenizers/    one Tokenizer interface: bpe (rustbpe-trained, tiktoken-run), gpt2, cl100k, char, byte
    prepare.py     prepare_dataset(): a fingerprinted folder of train.bin, val.bin, meta.json, tokenizer/
    loader.py      BatchLoader (random windows, resumable) and iter_eval_batches (sequential, exact)
    config.py      DataConfig and TokenizerConfig, the `data.*` and `tokenizer.*` YAML keys
"""
