"""The lab: tools *about* the core, kept apart from it. Nothing in the core imports anything here.

    config.py           the lab tools' Hydra schemas (no torch)
    bench/              scripts/bench.py: speed of training, generation, attention, data, against references
    stats.py            a mean over seeds with its 95% interval, the paired t-test against a baseline
    runs.py             the runs of a configs x seeds sweep as rows of data, and each config's summary
    speedrun.py         scripts/speedrun.py: which config learns the most for the same FLOPs, over seeds
    ablation.py         the ablation lab's measurements of each run (loss, gradients, attention entropy)
    ablation_report.py  its table, figures and the block of docs/ablation.md, over seeds
    scaling.py          scripts/scaling.py: a power law of val bpb against FLOPs over model sizes, checked
    shape_walk.py       scripts/shape_walk.py: every tensor shape of a forward pass, step by step
    pe_plots.py         scripts/pe_plots.py: positional encodings drawn
    loss_curves.py      scripts/loss_curves.py: training curves of several runs, read from TensorBoard files
    temperature.py      scripts/temperature.py: one next-token distribution at several temperatures
    tricks.py           scripts/tricks_report.py: the technique screen's rounds, each arm against its control
    generated_docs.py   scripts/update_docs.py: the files under docs/ the tools write, made afresh
"""
