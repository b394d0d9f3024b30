"""The torchrun environment: who am I, the process group, and the model wrapped for data parallelism.

`torchrun --nproc_per_node=N scripts/train.py ...` starts N copies of the script and tells each one its place
through environment variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Every copy trains the
same model on its own stream of batches; after each backward pass the gradients are averaged across copies, so
all of them take the same optimizer step. Nothing here is home-made: the collectives are torch.distributed's,
over gloo on CPU and NCCL on CUDA.

Two strategies:

    ddp   DistributedDataParallel: every rank holds the whole model; gradients are all-reduced (averaged)
          bucket by bucket while the backward pass is still running.
    fsdp  FSDP2 (`fully_shard`): every rank holds 1/N of each parameter, gradient and optimizer state; a
          block's weights are all-gathered just before it runs and freed after. For models that do not fit
          one device. Checkpoints gather the full tensors (to CPU), so they load anywhere, even without
          torch.distributed.

A single process (no torchrun) runs with `DistEnv()` and every function here is then a no-op.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from minigpt.cluster import peers
from minigpt.cluster.dist_env import DistEnv
from minigpt.errors import UserError

log = logging.getLogger(__name__)
# A collective that waits longer than this is a hang (a rank died or took another code path). torch's default
# is 10 minutes for NCCL and 30 for gloo; evaluation and checkpointing of the models here take far less.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)


# ---------------------------------------------------------------------------------------------- process group


def init_process_group(env: DistEnv) -> None:
    """Join the run's process group (torchrun's MASTER_ADDR/PORT rendezvous); nothing for a single process.

    With CUDA present the group gets both backends ("cpu:gloo,cuda:nccl"): NCCL moves the gradients between
    GPUs, gloo the small CPU-side messages (the stop flag, the broadcast config) without a GPU sync.
    """
    if not env.enabled or dist.is_initialized():
        return
    if torch.cuda.is_available():
        if env.local_rank >= torch.cuda.device_count():
            raise UserError(f"LOCAL_RANK={env.local_rank} but this machine has {torch.cuda.device_count()} "
                            "CUDA device(s); lower torchrun --nproc_per_node")
        torch.cuda.set_device(env.local_rank)  # NCCL and `cuda` tensors then mean this rank's own GPU
        backend, device_id = "cpu:gloo,cuda:nccl", torch.device("cuda", env.local_rank)
    else:
        backend, device_id = "gloo", None
    dist.init_process_group(backend=backend, rank=env.rank, world_size=env.world_size,
                            timeout=COLLECTIVE_TIMEOUT, device_id=device_id)
    peers.meet(env)  # every rank's host and PID, for naming the one that dies (peers.py)
    log.info("process group: rank %d of %d (%s)", env.rank, env.world_size, backend)


def destroy_process_group() -> None:
    """Leave the group (called in `finally`, so a failing run does not leave NCCL/gloo resources behind)."""
    if dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def process_group(env: DistEnv) -> Iterator[DistEnv]:
    """`with process_group(env):` joins the group for the block and always leaves it."""
    init_process_group(env)
    try:
        yield env
    finally:
        destroy_process_group()
        peers.wait_until_read(env)  # after a failure of its own: until the others have read why


def barrier(env: DistEnv) -> None:
    if env.enabled:
        dist.barrier()


def broadcast_object(obj: Any, env: DistEnv) -> Any:
    """Rank 0's `obj` (any picklable value) on every rank. Only between the run's own processes."""
    if not env.enabled:
        return obj
    box = [obj if env.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_object(obj: Any, env: DistEnv) -> list[Any] | None:
    """Every rank's `obj` (picklable), in rank order, on rank 0; None on the others. A collective (over gloo
    when the group has it: the objects stay in CPU memory). Only between the run's own processes."""
    if not env.enabled:
        return [obj]
    box = [None] * env.world_size if env.is_main else None
    dist.gather_object(obj, box, dst=0)
    return box


def any_rank(flag: bool, env: DistEnv) -> bool:
    """True on every rank if `flag` is true on any rank: the ranks decide together (to stop, to skip a step).

    The flag travels as a CPU tensor (gloo): no device sync. It is a collective, so every rank must call it
    at the same point of the loop.
    """
    if not env.enabled:
        return flag
    t = torch.tensor([int(flag)], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def max_over_ranks(values: list[float], env: DistEnv) -> list[float]:
    """The element-wise maximum of `values` over ranks (one small CPU all-reduce, gloo: no device sync).

    The trainer packs each step's joint decisions into it: the number of a stop signal (0 where none came)
    and rank 0's training clock (the others send -inf), so every rank stops at the same step and sets the same
    lr for the next one. A collective: every rank calls it at the same point of the loop.
    """
    if not env.enabled:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def agree_on_stop(stop_signal: int | None, seconds: float, env: DistEnv) -> tuple[int | None, float]:
    """After each step, in one tiny CPU all-reduce: the stop signal any rank got (its number; the highest if
    several), and rank 0's training clock `seconds` (the other ranks send -inf). Every rank then ends the run
    at the same step, for the same signal, and sets the same lr for the next one (an lr from each rank's own
    clock would let the replicas drift apart)."""
    signum, seconds = max_over_ranks([float(stop_signal or 0), seconds if env.is_main else -math.inf], env)
    return (int(signum) or None), seconds


def sum_over_ranks(values: list[float], env: DistEnv) -> list[float]:
    """Each of `values` summed over ranks (float64 on CPU: exact for counts up to 2^53), on every rank."""
    if not env.enabled:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


@contextlib.contextmanager
def main_process_first(env: DistEnv) -> Iterator[None]:
    """Rank 0 runs the block first (e.g. tokenising into the shared cache); the others then reuse its work."""
    if not env.is_main:
        barrier(env)
    yield
    if env.is_main:
        barrier(env)


# ---------------------------------------------------------------------------------------------- the model


def wrap_model(model: nn.Module, strategy: str, env: DistEnv, device: torch.device) -> nn.Module:
    """The module the training steps run through: `model` itself (one process), DDP around it, or `model`
    sharded in place by FSDP2. Load weights into `model` before calling this; build the optimizer after it
    (FSDP replaces the parameters by sharded DTensors). `strategy` is ddp or fsdp (trainer.strategy, which
    the training config checks)."""
    if strategy not in ("ddp", "fsdp"):
        raise ValueError(f"unknown strategy {strategy!r}")
    if not env.enabled:
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        # DDP broadcasts rank 0's parameters and buffers here, so every rank starts from the same weights.
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (env.world_size,))
    # One FSDP unit per block: only one block's full weights exist at a time (plus the root's: embeddings,
    # final norm and the head, which stay together because the head's weight is tied to the embedding).
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def is_sharded(model: nn.Module) -> bool:
    """True for an FSDP2 module (its parameters are DTensor shards)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Inside `gradient_sync(model, False)` the backward pass keeps its gradients local.

    With gradient accumulation only the last micro-batch's backward needs to average gradients across ranks;
    the earlier ones just add into `.grad`. Skipping their all-reduce (DDP `no_sync`) or reduce-scatter
    (FSDP2 `set_requires_gradient_sync`) saves n_micro - 1 rounds of communication per step, same result.
    """
    if enabled:
        yield
        return
    if hasattr(model, "no_sync"):  # DDP
        with model.no_sync():
            yield
    elif hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:  # a single process: nothing to skip
        yield


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every weight as a full CPU tensor, keyed by the plain module's names. A collective under FSDP: call it
    on every rank; rank 0 gets the tensors, the others an empty dict."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer state keyed by parameter *names* and gathered to full CPU tensors: the same for one
    process, DDP and FSDP, so a checkpoint resumes under any strategy. A collective under FSDP (rank 0 gets
    it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(model, optimizer, options=options)


def load_optimizer_state_dict(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Inverse of `optimizer_state_dict`: every rank passes the full state and keeps its own shard of it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's own part of a tensor: an FSDP parameter's shard (no communication), else the tensor."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def local_value(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor from a possibly replicated DTensor (FSDP's gradient norm), for logging."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def min_positive_over_ranks(value: int, env: DistEnv) -> int:
    """The smallest positive `value` over ranks, or 0 if no rank has one (e.g. the first step that failed)."""
    if not env.enabled:
        return value
    t = torch.tensor([value if value > 0 else 2**62], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item()) if t.item() < 2**62 else 0


def whole_model(model: nn.Module, env: DistEnv) -> nn.Module | None:
    """The model as one ordinary module on rank 0, for checkpoints and samples: `model` itself, or under
    FSDP a CPU copy built from the gathered shards (a collective: every rank calls it). Ranks > 0 get None."""
    if not is_sharded(model):
        return model if env.is_main else None
    weights = full_state_dict(model)
    if not env.is_main:
        return None
    from minigpt.model.factory import build_model

    with torch.random.fork_rng(devices=[]):  # its init draws would shift rank 0's dropout stream
        whole = build_model(model.config)
    whole.load_state_dict(weights)
    return whole
