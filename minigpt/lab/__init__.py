"""The lab: tools *about* the core, kept apart from it. Nothing in the core imports anything here.

    config.py           the lab tools' Hydra schemas (no torch)
    bench/              scripts/bench.py: speed of training, generation, attention, data, against references
    stats.py            a mean over seeds with its 95% interval, the paired t-test against a baseline
    runs.py             a sweep's runs as rows of data, each config's summary, resumable tools' state files
    speedrun.py         scripts/speedrun.py: which config learns the most for the same FLOPs, over seeds
    side_by_side.py     scripts/side_by_side.py: another project's recipe on minigpt's bins, batches, scorer
    side_by_side_throughput.py  how many tokens per second each arm of the side-by-side trains, interleaved
    reference_parity.py the side-by-side's arms from the same weights: logits and each step's updates compared
    ablation.py         the ablation lab's measurements of each run (loss, gradients, attention entropy)
    ablation_rows.py    what the design claims about each of its rows, written once
    ablation_report.py  its table, figures and the block of docs/ablation.md, over seeds
    compare_sequential.py  the confidence sequence that decides a comparison, and its simulation
    compare_runs.py     training runs as Hydra multiruns of train.py, side by side or a few at a time
    compare.py          scripts/compare.py: paired seeds until better, worse, equivalent or the cap
    compare_speed.py    its speed gate: the same losses first, then tokens per second
    compare_report.py   its printed report and the blocks of docs/comparisons.md
    scaling_fit.py      L(N, D) = E + A/N^alpha + B/D^beta: the Huber fit, the bootstrap, the optimum
    scaling.py          scripts/scaling.py: IsoFLOP profiles fitted, a larger budget predicted, then run
    scaling_report.py   its JSON, figure, TensorBoard logs and the block of docs/scaling.md
    shape_walk.py       scripts/shape_walk.py: every tensor shape of a forward pass, step by step
    pe_plots.py         scripts/pe_plots.py: positional encodings drawn
    loss_curves.py      scripts/loss_curves.py: training curves of several runs, read from TensorBoard files
    temperature.py      scripts/temperature.py: one next-token distribution at several temperatures
    tricks.py           scripts/tricks_report.py: the technique screen's rounds, each arm against its control
    generated_docs.py   scripts/update_docs.py: the files under docs/ the tools write, made afresh
"""
