"""Convert GPT-2 weights between the Hugging Face format and minigpt checkpoints.

    python scripts/import_gpt2.py HF_FOLDER CHECKPOINT [--tokenizer TOKENIZER_DIR]
    python scripts/import_gpt2.py --export CHECKPOINT HF_FOLDER

Import: HF_FOLDER holds config.json and model.safetensors (or pytorch_model.bin, read with
weights_only=True), e.g. a local download of `gpt2`; CHECKPOINT becomes a minigpt checkpoint folder that
`scripts/generate.py checkpoint=CHECKPOINT` samples from. Its tokenizer is tiktoken's gpt2 encoding
(tiktoken's cache, or the network once) unless --tokenizer names a minigpt tokenizer folder.
Export: any checkpoint whose model GPT-2 can express (learned positions, pre-norm LayerNorm, biases,
GELU/ReLU) becomes a folder GPT2LMHeadModel.from_pretrained reads. Nothing existing is overwritten.
A pure file tool, so plain arguments rather than Hydra; bad input: one line on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from minigpt import signals
from minigpt.errors import UserError, exit_with_error


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source", type=Path, help="HF folder (import) or minigpt checkpoint/run folder (--export)")
    p.add_argument("dest", type=Path, help="new checkpoint folder (import) or new HF folder (--export)")
    p.add_argument("--export", action="store_true", help="minigpt checkpoint -> HF folder")
    p.add_argument("--tokenizer", type=Path, default=None, help="a minigpt tokenizer folder (import only)")
    args = p.parse_args(argv)
    from minigpt.interop.hf_checkpoint import export_checkpoint, import_to_checkpoint

    signals.install_policy()  # a stop signal ends it in one line; the checkpoint is written atomically
    try:
        if args.export:
            print(f"exported to {export_checkpoint(args.source, args.dest)}")
        else:
            print(f"imported to {import_to_checkpoint(args.source, args.dest, args.tokenizer)}")
    except UserError as e:
        exit_with_error(str(e))
    except signals.Interrupted as e:
        print(e.message(), file=sys.stderr)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
