"""Data: corpora -> tokenizer -> sharded token files -> batches.

    documents.py     Document, the split hash, data.paths -> files; SourceMissing
    sources.py       the corpora read whole (pystdlib, shakespeare, text), split train/val by file
    streaming.py     data=files: parquet / jsonl / txt corpora of any size, streamed and split by document
    tokenizers/      one Tokenizer interface: bpe (rustbpe-trained, tiktoken-run), gpt2, cl100k, char, byte
    encode.py        documents -> token arrays, in worker processes, a bounded amount at a time
    shards.py        the on-disk format: <split>_NNN.bin shards (ShardWriter) read as one stream (TokenSplit)
    verify.py        is a prepared folder still what its meta.json says (sizes, sha256, stamps)
    temporaries.py   the cache's half-built folders, named after their process; a killed one's are swept
    prepare.py       prepare_dataset(): a fingerprinted, verified folder of shards, meta.json, tokenizer/
    loader.py        BatchLoader: random windows over a whole split, seeded per rank, resumable
    eval_windows.py  eval_windows() / eval_batches(): fixed windows over all of val, target bytes
    config.py        DataConfig and TokenizerConfig, the `data.*` and `tokenizer.*` YAML keys
"""
