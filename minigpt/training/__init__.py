"""Training: the loop that turns a TrainConfig into a trained model (the Trainer), and what it calls.

Read in this order (the loop first, then what it calls, in the order a step meets it):
    config.py           TrainConfig and its sections (optim, trainer, logging), the YAML keys; no torch
    trainer.py          the Trainer: build everything, then the loop (evaluate, step, log, save)
    start.py            where the run starts: scratch, a checkpoint it continues, or a model it fine-tunes
    seeding.py          the run's random streams: seeded, saved with each checkpoint, restored on resume
    step.py             one optimizer step: accumulate gradients, clip, update; the guard against divergence
    optim.py            the optimizer's parameter groups and the learning-rate schedule (its only home)
    muon.py             Muon for the blocks' matrices, AdamW for the rest, in one optimizer
    budget.py           when the run ends (steps, training time, tokens, FLOPs) and the clock that measures it
    batch_schedule.py   each step's batch: batch-size and sequence-length warmup
    evaluation.py       validation loss and bits per byte on fixed windows, samples, attention images
    reporting.py        the progress bar or plain lines, and TensorBoard's fixed metric names

Only rank 0 writes (logs, TensorBoard, checkpoints); every decision that ends or changes a step (stop, skip,
save `best`) is taken by all ranks together. Around the loop: `train(cfg, out_dir)`, the run kept safe
(its folder, where it starts, the same run when resumed) is minigpt/runs/; several processes are
minigpt/cluster/'s; the checkpoint files themselves are minigpt/checkpoint/'s.
"""
