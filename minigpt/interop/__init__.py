"""Other formats of a model, in and out of minigpt's checkpoints, and a standard evaluation harness.

Read in this order:
    architecture.py    which outside architecture a model is (gpt2, llama, qwen3, arcee), or what bars it
    family_weights.py  a model's weights under its family's names, what every format is written from
    fast_tokenizer.py  a minigpt tokenizer as a `tokenizers` BPE: the vocabulary and merges both formats carry
    staging.py         how every export is written: staged beside `out`, renamed when complete, or nothing
    hf_files.py        the files of a Hugging Face folder, read and written
    hf_gpt2.py         GPT-2's config.json and weights <-> `GPT` (the name-by-name mapping)
    hf_llama.py        Llama's, Qwen3's and Arcee's config.json and weights <-> `GPT`
    hf_tokenizer.py    minigpt tokenizers <-> Hugging Face fast tokenizers (tokenizer.json)
    hf_custom.py       a rotary model with technique switches as a folder with its own modeling code
    hf_remote/         that code (configuration_minigpt.py, modeling_minigpt.py), for trust_remote_code=True
    hf_export.py       a model -> a Hugging Face folder: its transformers class, else minigpt's own code
    hf_import.py       a Hugging Face folder -> a minigpt checkpoint (scripts/import_hf.py)
    gguf_vocab.py      a tokenizer as GGUF metadata, with llama.cpp's matching pre-tokenizer
    gguf_export.py     a model as one GGUF file (f32, f16, bf16, q8_0) for llama.cpp and Ollama
    export.py          scripts/export.py: the checkpoint read once, handed to the writer of format=hf | gguf,
                       and the one line that says what was written and why
    lm_eval_model.py   the `minigpt` model of lm-evaluation-harness (loglikelihood, rolling, generate_until)
    harness_task.py    the shipped offline task (tasks/): which line really comes next in a stdlib function
    harness.py         running lm-eval tasks on a checkpoint (scripts/evaluate.py harness_tasks=...)
    config.py          ExportConfig, ImportHFConfig (no torch: Hydra's schemas import it)
"""
