"""Training: `train(cfg, out_dir)` turns a TrainConfig into a trained checkpoint.

Read in this order (the loop first, then what it calls, in the order a step meets it):
    config.py       TrainConfig and its sections (optim, trainer, logging), the YAML keys; no torch
    trainer.py      `train()` and the Trainer: build everything, then the loop (evaluate, step, log, save)
    resume.py       where a run starts: its seeds, a checkpoint it continues, or a model it fine-tunes
    same_run.py     resuming continues the same run: another model or data is refused, a new course warned
    step.py         one optimizer step: accumulate gradients, clip, update; the guard against divergence
    optim.py        AdamW's parameter groups and the learning-rate schedule (the only place it lives)
    budget.py       when the run ends (steps and/or training time) and the clock that measures it (MFU)
    evaluation.py   validation loss and bits per byte on fixed windows, samples, attention images
    reporting.py    the progress bar or plain lines, and TensorBoard's fixed metric names
    run_folder.py   nothing is written into a run folder before every check passes; one training per folder
    dist_env.py     this process's place in a multi-process run, read from its launcher (no torch)
    distributed.py  the process group, its collectives, and the model under DDP or FSDP2
    peers.py        when a rank dies: the survivors name it, and the last intact checkpoint, in one line
    launch.py       how scripts/train.py runs as one process or one rank of many (torchrun, srun, submitit)

Only rank 0 writes (logs, TensorBoard, checkpoints); every decision that ends or changes a step (stop, skip,
save `best`) is taken by all ranks together. The checkpoint files themselves are `minigpt/checkpoint/`'s.
"""
