"""A training run kept safe: its folder claimed, where it starts, and a resume that continues the same run.

Read in this order:
    train.py        `train(cfg, out_dir)`: claim the folder, work out the start, build the Trainer, fit
    resume.py       the checkpoint `trainer.resume` names (never one the run would overwrite), or none
    same_run.py     resuming continues the same run: another model or data is refused, a new course warned
    run_folder.py   nothing is written into a run folder before every check passes; one training per folder

The loop these wrap is minigpt/training/ (the Trainer, and how it starts from a checkpoint or a model); the
run's processes are minigpt/cluster/'s.
"""
