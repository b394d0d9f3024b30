"""Where the model runs, in which precision and on how many threads: one module for training, generation and
every tool.

    config.py     DeviceConfig (training: device, autocast dtype, compile, TF32, MFU peak, threads) and the
                  inference keys of the tools (`device=`, `device.threads=`, `weights_dtype=`); no torch, so
                  Hydra's schemas stay light
    runtime.py    the resolved choices: the torch device, autocast (device.dtype=auto on a CPU decided by the
                  probe), SDPA's kernel for a CPU run's shape, the loss scaler, and the peak FLOP/s that MFU
                  divides by
    probe.py      measurements of the machine: synchronisation, matmul FLOP/s, read bandwidth, the CPU's
                  fp32-vs-bf16 probe (cached per machine in the data cache folder), SDPA's kernels timed
    cpu_load.py   how many cores other processes keep busy, from /proc/stat less this process's own time
    threads.py    the thread count every command starts with: one per free core, or device.threads
    allocator.py  a CPU run's malloc set to keep the memory a step frees for the next step
    governor.py   the thread count re-chosen while a run trains, when its speed drops or cores come free
"""
