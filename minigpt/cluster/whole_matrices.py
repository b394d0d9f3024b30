"""A function of whole matrices on several ranks: each matrix's result computed once, by one rank, and sent
where it is used.

Muon's orthogonalisation (minigpt/training/muon.py) is such a function: it needs a whole matrix and costs far
more than the rest of an optimizer step, so two things would go wrong if every rank simply computed it on what
it holds: under FSDP2 a rank holds only some rows of each matrix (a shard), which has other singular vectors
than the whole; under DDP every rank holds the whole matrix and would repeat every orthogonalisation, N times
the work for one result. Instead every matrix gets one *owner*, and the owners' work is balanced (`owners`):

    FSDP2 (`_on_shards`), matrix X (m x n) sharded by rows over N ranks:
        1. every rank sends its rows of X to X's owner                            (gather)
        2. the owner computes f(X) of the whole matrix                            (once, on one rank)
        3. the owner sends every rank the rows of f(X) that rank holds            (scatter)
    DDP (`_on_replicas`), every rank holding the whole X:
        1. the owner computes f(X)                                                (once, on one rank)
        2. the owner sends the result to every other rank                         (broadcast)

The collectives are issued asynchronously, in the same order (the matrices') on every rank, so a rank computes
its next matrix while the result of its last one is still travelling. A function that also updates a little
state of its matrix (NorMuon's running second moments) names it (`states`): the owner broadcasts it after
computing, so that every rank holds the same state, and a checkpoint written by any rank is the whole of it.

FSDP2 splits a matrix's rows as `torch.chunk` does: every rank gets c = ceil(m / N) rows, the last ones fewer
or none. The collectives want equal pieces, so each rank's rows travel padded with zero rows to c, and the
owner drops the padding; a rank's rows of the matrix are [r c, r c + its rows) (`my_rows`). Communication
per step (`communication_bytes`, docs/clusters.md): each matrix crosses the network twice under FSDP2 (to its
owner and back: 2 (N - 1) c n values) and N - 1 times under DDP (the whole result to every other rank:
(N - 1) m n values); the states travel N - 1 times each.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

MatrixFn = Callable[[int, torch.Tensor], torch.Tensor]  # (i, (m, n)) -> (m, n), of matrix i, whole only


def owners(costs: list[int], world_size: int) -> list[int]:
    """The rank that computes each matrix's result, given what each costs: the costliest matrix first, each to
    the rank with the least work so far (Graham's longest-processing-time rule, within 4/3 of the best
    balance; ties go to the lower rank and the earlier matrix, so every rank computes the same answer)."""
    load, owner = [0] * world_size, [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):
        rank = min(range(world_size), key=lambda r: load[r])
        owner[i], load[rank] = rank, load[rank] + costs[i]
    return owner


def communication_bytes(shapes: list[tuple[int, int]], world_size: int, sharded: bool,
                        element_size: int = 4, state_bytes: int = 0) -> int:
    """Bytes the ranks receive from each other in one `on_owners` call, all ranks together: under FSDP2
    (`sharded`) each matrix's padded rows from the N - 1 other ranks and back to them, under DDP the whole
    result once for each of the N - 1 ranks that do not own it; and the `states` (`state_bytes` in all, every
    matrix's together) once for each of the N - 1."""
    n_other = world_size - 1
    if sharded:
        values = sum(2 * n_other * -(-m // world_size) * n for m, n in shapes)
    else:
        values = sum(n_other * m * n for m, n in shapes)
    return values * element_size + n_other * state_bytes


def my_rows(whole: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """(m, ...) -> the rows of `whole` that this rank holds of `param` (m, n): all of them unless `param` is
    an FSDP2 shard, whose rows are [r c, r c + its rows), c = ceil(m / N)."""
    if not isinstance(param, DTensor):
        return whole
    start = dist.get_rank() * -(-param.shape[0] // dist.get_world_size())
    return whole[start:start + param.to_local().shape[0]]


def on_owners(fn: MatrixFn, params: list[torch.Tensor], parts: list[torch.Tensor], costs: list[int],
              states: list[list[torch.Tensor]] | None = None) -> list[torch.Tensor]:
    """This rank's part of `fn(i, X)` for every matrix X (the i-th), each computed by its owner only.

    `params` are the matrices, all FSDP2 shards (DTensors split by rows) or all whole (DDP); `parts` this
    rank's part of each X (its rows, or the whole matrix); `costs` what `fn` costs on each, for `owners`;
    `states[i]` the tensors that `fn(i, X)` updates in place, the same shapes on every rank, afterwards the
    owner's everywhere. A collective: every rank calls it with the same matrices in the same order.
    """
    owner = owners(costs, dist.get_world_size())
    states = states or [[] for _ in params]
    sharded = [isinstance(p, DTensor) for p in params]
    if all(sharded) and params:
        for p in params:
            if p.placements != (Shard(0),) or p.device_mesh.size() != dist.get_world_size():
                raise ValueError(f"FSDP2 shards by rows over every rank expected, not {p.placements}")
        shapes = [(p.shape[0], p.shape[1]) for p in params]  # a DTensor's shape is the whole matrix's
        return _on_shards(fn, shapes, parts, owner, states)
    if any(sharded):
        raise ValueError("the matrices are either all FSDP2 shards or all whole")
    return _on_replicas(fn, parts, owner, states)


def _broadcast(tensors: list[torch.Tensor], src: int) -> list[dist.Work]:
    """Every rank's `tensors` set to rank `src`'s, asynchronously: the works to wait for."""
    return [dist.broadcast(t, src=src, async_op=True) for t in tensors]


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """(r, n) -> (rows, n), zero rows below; contiguous, as the collectives want it."""
    if x.shape[0] == rows:
        return x.contiguous()
    return torch.cat([x, x.new_zeros(rows - x.shape[0], x.shape[1])])


def _on_shards(fn: MatrixFn, shapes: list[tuple[int, int]], parts: list[torch.Tensor], owner: list[int],
               states: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """FSDP2: gather each matrix's rows on its owner, compute there, scatter the result's rows back (and
    broadcast the matrix's states)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunk = [-(-m // world) for m, _ in shapes]  # c = ceil(m / N): every rank's padded share of the rows
    gathered, gathers = [], []
    for (_, n), part, c, o in zip(shapes, parts, chunk, owner, strict=True):
        pieces = [part.new_empty(c, n) for _ in range(world)] if o == rank else None  # (c, n) per rank
        gathers.append(dist.gather(_pad_rows(part, c), pieces, dst=o, async_op=True))
        gathered.append(pieces)
    rows, scatters = [], []
    for i, ((m, n), part, c, o) in enumerate(zip(shapes, parts, chunk, owner, strict=True)):
        chunks = None
        if o == rank:
            gathers[i].wait()
            whole = torch.cat(gathered[i])[:m]  # (m, n): the padding rows dropped
            chunks = list(_pad_rows(fn(i, whole), world * c).split(c))  # N x (c, n)
        mine = part.new_empty(c, n)
        scatters.append(dist.scatter(mine, chunks, src=o, async_op=True))
        scatters += _broadcast(states[i], o)
        rows.append(mine)
    for work in gathers + scatters:
        work.wait()
    return [mine[:part.shape[0]] for mine, part in zip(rows, parts, strict=True)]  # (this rank's rows, n)


def _on_replicas(fn: MatrixFn, wholes: list[torch.Tensor], owner: list[int], states: list[list[torch.Tensor]]
                 ) -> list[torch.Tensor]:
    """DDP: compute each matrix's result on its owner and broadcast it, and its states, to the other ranks."""
    rank = dist.get_rank()
    results, broadcasts = [], []
    for i, (whole, o) in enumerate(zip(wholes, owner, strict=True)):
        result = fn(i, whole).contiguous() if o == rank else torch.empty_like(whole)
        broadcasts += _broadcast([result, *states[i]], o)
        results.append(result)
    for work in broadcasts:
        work.wait()
    return results
