"""Where the model runs and in which precision: one module for training, generation and every tool.

    config.py    DeviceConfig (training: device, autocast dtype, compile, TF32, MFU peak) and the inference
                 keys of the tools (`device=`, `weights_dtype=`); no torch, so Hydra's schemas stay light
    runtime.py   the resolved choices: the torch device, autocast (device.dtype=auto on a CPU decided by the
                 probe), the loss scaler, and the peak FLOP/s that MFU divides by
    probe.py     measurements of the machine: synchronisation, matmul FLOP/s, read bandwidth, and the CPU's
                 fp32-vs-bf16 probe, cached per machine in the data cache folder
"""
