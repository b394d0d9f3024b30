"""Where the model runs and in which precision: one module for training, generation and every tool.

    config.py    DeviceConfig (training: device, autocast dtype, compile, TF32, MFU peak) and the inference
                 keys of the tools (`device=`, `weights_dtype=`); no torch, so Hydra's schemas stay light
    runtime.py   the resolved choices: the torch device, autocast, the loss scaler, synchronisation, and
                 the peak FLOP/s that MFU divides by
"""
