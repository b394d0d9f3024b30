"""Several processes: one training spread over the processes of a machine, or over machines.

Read in this order:
    dist_env.py        this process's place in a multi-process run, read from its launcher (no torch)
    distributed.py     the process group, its collectives, and the model under DDP or FSDP2
    whole_matrices.py  a function of whole matrices (Muon's orthogonalisation) on several ranks: each matrix's
                       result computed once, by one rank, from FSDP2's shards or DDP's copies
    peers.py           when a rank dies: the survivors name it, and the last intact checkpoint, in one line
    launch.py          how a command runs as one process or one rank of many (torchrun, srun, submitit): rank
                       0 through Hydra, the others following the job it shares

Nothing here knows the training loop: the loop (minigpt/training/) calls the collectives, and a command tells
`Launch` what the other ranks do with rank 0's job (scripts/train.py: train it alongside).
"""
