"""minigpt: small GPT-style transformers to read, train and sample from.

Read in this order, the layering of README's "Layout" (nothing imports what is listed after it):
    errors.py     UserError: bad input or a fault of the machine, one line on stderr, exit code 2
    signals.py    Ctrl-C, SIGTERM and the other stop signals: a clean stop
    model/        the transformer, one concept per file
    data/         text -> tokens -> batches
    device/       where it runs and in which precision
    sampling/     logits -> tokens, the KV-cached decoding loop
    checkpoint/   the checkpoint format and its one loader
    fast/         the workshop: the fastest decode step here that gives the plain step's tokens
    interop/      other formats: Hugging Face, GGUF, lm-eval
    inspect/      scoring a text, attention maps, plotting
    cluster/      several processes: the launchers' variables, the process group, a rank that dies
    training/     the training loop and what it needs
    generation/   the generate command over sampling/
    runs/         a training run kept safe around the loop: its folder, where it starts, resuming
    lab/          tools about the core: bench, speedrun, ablation, shape walk, plots
    config.py     every command's Hydra schema
    cli.py        what every command does around its library call
"""

__version__ = "0.1.0"
