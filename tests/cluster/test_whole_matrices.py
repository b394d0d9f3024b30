"""cluster/whole_matrices.py: a function of whole matrices computed by one owner rank each, on 2 gloo ranks.

The training test (test_muon_distributed.py) meets only matrices whose rows split evenly over two ranks; here
FSDP2-style row shards of odd heights, down to a rank holding no row, go through `on_owners` and come back as
exactly the rows of the function computed on the whole matrix in one process (`my_rows` names the same rows),
and a state that only the owner updates comes back the same on both ranks.
"""

from __future__ import annotations

import os
from functools import partial

import pytest
import torch
import torch.multiprocessing as mp
from cluster_helpers import free_port

from minigpt.cluster import whole_matrices
from minigpt.cluster.dist_env import DistEnv
from minigpt.cluster.distributed import process_group
from minigpt.training.muon import newton_schulz_flops

SHAPES = [(5, 3), (1, 4), (7, 2), (4, 6)]  # (1, 4): rank 1 holds none of its rows


def _mixing(x: torch.Tensor) -> torch.Tensor:
    """(m, n) -> (m, n), every entry depending on every row: a shard alone gives another answer."""
    return x @ (x.t() @ x)


def _mixing_and_summing(sums: list[torch.Tensor], i: int, x: torch.Tensor) -> torch.Tensor:
    """`_mixing` of matrix i, adding its sum to sums[i] (computed on its owner only)."""
    sums[i] += x.sum()
    return _mixing(x)


def _worker(rank: int, port: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    with process_group(DistEnv(rank=rank, local_rank=rank, world_size=2)):
        gen = torch.Generator().manual_seed(0)  # the same matrices on both ranks
        wholes = [torch.randn(s, generator=gen) for s in SHAPES]
        costs = [newton_schulz_flops(s) for s in SHAPES]
        mesh = init_device_mesh("cpu", (2,))
        shards = [distribute_tensor(w, mesh, [Shard(0)]) for w in wholes]
        for params, parts in ((shards, [s.to_local() for s in shards]), (wholes, wholes)):  # FSDP2, DDP
            sums = [torch.zeros(1) for _ in SHAPES]  # a state of each matrix, that only its owner updates
            got = whole_matrices.on_owners(partial(_mixing_and_summing, sums), params, parts, costs,
                                           states=[[s] for s in sums])
            for whole, param, mine, total in zip(wholes, params, got, sums, strict=True):
                if param is whole:
                    want = _mixing(whole)
                else:
                    rows = torch.chunk(_mixing(whole), 2)  # FSDP2's split: ceil(m / 2) rows first
                    want = rows[rank] if rank < len(rows) else whole[:0]
                assert torch.equal(mine, want), (rank, whole.shape)
                assert torch.equal(whole_matrices.my_rows(_mixing(whole), param), want), (rank, whole.shape)
                torch.testing.assert_close(total, whole.sum().reshape(1))  # the owner's, on both ranks


@pytest.mark.slow
def test_uneven_shards_and_whole_copies_come_back_as_the_whole_matrix_s_result():
    import torch._dynamo  # noqa: F401 - the collectives import it; once here rather than in each fork

    mp.start_processes(_worker, args=(free_port(),), nprocs=2, start_method="fork")


def _best_makespan(costs: list[int], world_size: int) -> int:
    """The least possible work of the busiest rank, by trying every assignment."""
    best = sum(costs)
    for code in range(world_size ** len(costs)):
        load = [0] * world_size
        for cost in costs:
            load[code % world_size] += cost
            code //= world_size
        best = min(best, max(load))
    return best


@pytest.mark.parametrize("world_size", [2, 3])
def test_owners_balance_the_work_within_graham_s_bound(world_size: int):
    gen = torch.Generator().manual_seed(world_size)
    for _ in range(20):
        shapes = [tuple(int(d) for d in torch.randint(2, 40, (2,), generator=gen)) for _ in range(7)]
        costs = [newton_schulz_flops(s) for s in shapes]
        owner = whole_matrices.owners(costs, world_size)
        load = [sum(c for c, o in zip(costs, owner, strict=True) if o == r) for r in range(world_size)]
        assert max(load) <= (4 / 3) * _best_makespan(costs, world_size)
        assert owner == whole_matrices.owners(list(costs), world_size)  # the same on every rank


def test_owners_of_a_block_go_one_matrix_each_to_the_cheapest_rank():
    # a block of the default model (n_embd 96, one key/value head of 32, SwiGLU 256 wide): qkv, out, up, down
    shapes = [(160, 96), (96, 96), (512, 96), (96, 256)]
    costs = [newton_schulz_flops(s) for s in shapes]
    assert costs[0] == 4 * 96 * 96 * 160 + 2 * 96**3
    assert whole_matrices.owners(costs, 2) == [1, 1, 0, 1]  # up (the costliest) alone; the rest together
    assert whole_matrices.owners(costs, 8) == [2, 3, 0, 1]  # one each, from the costliest; ranks 4-7 idle
