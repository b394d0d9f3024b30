"""Sharded splits and BatchLoader against direct slices of the concatenated shard files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from minigpt.data.loader import BatchLoader
from minigpt.data.shards import DTYPES, ShardWriter, TokenSplit
from minigpt.errors import UserError

T, B = 8, 4


def write_split(folder: Path, tokens: np.ndarray, shard_tokens: int, dtype: str = "uint16",
                split: str = "train") -> TokenSplit:
    """`tokens` written through ShardWriter in uneven pieces (as the encoder hands them over), reopened."""
    folder.mkdir(parents=True, exist_ok=True)
    with ShardWriter(folder, split, dtype, shard_tokens) as writer:
        for piece in np.array_split(tokens, 7):
            writer.write(piece)
        records = writer.close()
    return TokenSplit(split, [folder / r["file"] for r in records], dtype)


def distinct_tokens(n: int, dtype: str = "uint16") -> np.ndarray:
    """A permutation, so every window's position in the stream is unambiguous."""
    return np.random.default_rng(0).permutation(n).astype(DTYPES[dtype])


def test_shards_hold_the_stream_in_order_and_read_across_boundaries(tmp_path: Path) -> None:
    tokens = distinct_tokens(1000)
    split = write_split(tmp_path, tokens, shard_tokens=64)
    sizes = [p.stat().st_size for p in split.paths]
    assert sizes == [128] * 15 + [80]  # 15 full shards of 64 uint16 tokens, then the 40 left
    on_disk = np.concatenate([np.fromfile(p, dtype="<u2") for p in split.paths])  # independent of TokenSplit
    assert np.array_equal(on_disk, tokens) and len(split) == 1000
    for start, length in [(0, 1000), (60, 10), (63, 1), (64, 64), (100, 300), (999, 1), (1000, 0)]:
        assert np.array_equal(split.read(start, length), tokens[start : start + length])
    with pytest.raises(IndexError):
        split.read(995, 10)


def test_an_exact_multiple_of_the_shard_size_leaves_no_empty_shard(tmp_path: Path) -> None:
    split = write_split(tmp_path, distinct_tokens(128), shard_tokens=64)
    assert [p.name for p in split.paths] == ["train_000.bin", "train_001.bin"]


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_batches_are_windows_of_the_stream_shifted_by_one(tmp_path: Path, dtype: str) -> None:
    tokens = distinct_tokens(1000, dtype)
    split = write_split(tmp_path, tokens, shard_tokens=50, dtype=dtype)  # 20 shards: most windows cross one
    where = {int(t): i for i, t in enumerate(tokens)}
    loader = BatchLoader(split, T, B, seed=0)
    for _ in range(20):
        x, y = loader.next_batch()
        assert x.shape == y.shape == (B, T) and x.dtype == y.dtype == torch.int64
        assert x.is_contiguous() and y.is_contiguous()
        for row_x, row_y in zip(x.tolist(), y.tolist(), strict=True):
            start = where[row_x[0]]
            assert row_x == tokens[start : start + T].tolist()
            assert row_y == tokens[start + 1 : start + T + 1].tolist()


def test_window_starts_are_uniform_over_the_whole_stream(tmp_path: Path) -> None:
    # 3 shards of 6 tokens and T = 8: 18 - 8 = 10 valid starts, all but one window crossing a boundary.
    tokens = distinct_tokens(18)
    split = write_split(tmp_path, tokens, shard_tokens=6)
    where = {int(t): i for i, t in enumerate(tokens)}
    loader = BatchLoader(split, T, 500, seed=1)
    starts = [where[int(v)] for _ in range(20) for v in loader.next_batch()[0][:, 0]]
    counts = np.bincount(starts, minlength=18)
    assert counts[10:].sum() == 0  # no start past N - T - 1 = 9: no window overruns the stream
    # 10,000 draws over 10 starts: each count is ~Binomial(10000, 0.1), sd 30; 5 sd either side.
    assert np.all(np.abs(counts[:10] - 1000) < 150), counts


def test_seed_and_rank_select_the_stream(tmp_path: Path) -> None:
    split = write_split(tmp_path, distinct_tokens(5000), shard_tokens=1000)

    def batches(**kw) -> list[torch.Tensor]:
        loader = BatchLoader(split, T, B, **kw)
        return [loader.next_batch()[0] for _ in range(3)]

    same = batches(seed=3), batches(seed=3)
    assert all(torch.equal(a, b) for a, b in zip(*same, strict=True))
    for other in (batches(seed=4), batches(seed=3, rank=1, world_size=2)):
        assert not all(torch.equal(a, b) for a, b in zip(same[0], other, strict=True))


def test_the_shard_size_does_not_change_the_batches(tmp_path: Path) -> None:
    tokens = distinct_tokens(3000)
    one = BatchLoader(write_split(tmp_path / "one", tokens, shard_tokens=10_000), T, B, seed=5)
    many = BatchLoader(write_split(tmp_path / "many", tokens, shard_tokens=97), T, B, seed=5)
    for _ in range(5):
        assert all(torch.equal(a, b) for a, b in zip(one.next_batch(), many.next_batch(), strict=True))


def test_state_dict_resumes_the_exact_sequence(tmp_path: Path) -> None:
    split = write_split(tmp_path, distinct_tokens(5000), shard_tokens=700)
    loader = BatchLoader(split, T, B, seed=7)
    for _ in range(3):
        loader.next_batch()
    torch.save(loader.state_dict(), tmp_path / "state.pt")
    expected = [loader.next_batch() for _ in range(4)]

    resumed = BatchLoader(split, T, B, seed=7)
    resumed.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    got = [resumed.next_batch() for _ in range(4)]
    for (ex, ey), (gx, gy) in zip(expected, got, strict=True):
        assert torch.equal(ex, gx) and torch.equal(ey, gy)


def test_state_from_rank0_replays_on_another_rank(tmp_path: Path) -> None:
    split = write_split(tmp_path, distinct_tokens(5000), shard_tokens=700)
    rank0 = BatchLoader(split, T, B, seed=7, rank=0, world_size=2)
    rank1 = BatchLoader(split, T, B, seed=7, rank=1, world_size=2)
    for _ in range(5):
        rank0.next_batch()
        rank1.next_batch()
    fresh1 = BatchLoader(split, T, B, seed=7, rank=1, world_size=2)
    fresh1.load_state_dict(rank0.state_dict())
    assert torch.equal(fresh1.next_batch()[0], rank1.next_batch()[0])


def test_too_short_split_is_a_user_error(tmp_path: Path) -> None:
    split = write_split(tmp_path, distinct_tokens(T), shard_tokens=3)  # needs T + 1
    with pytest.raises(UserError, match=r"fewer than block_size \+ 1 = 9.*model.block_size"):
        BatchLoader(split, T, B, seed=0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_batches_match_cpu(tmp_path: Path) -> None:
    split = write_split(tmp_path, distinct_tokens(5000), shard_tokens=700)
    cpu = BatchLoader(split, T, B, seed=5).next_batch()
    gpu = BatchLoader(split, T, B, seed=5, device="cuda").next_batch()
    assert gpu[0].device.type == "cuda"
    assert torch.equal(cpu[0], gpu[0].cpu()) and torch.equal(cpu[1], gpu[1].cpu())


def test_a_loader_draws_the_batch_sizes_it_is_given_and_replays_them_on_another_rank(tmp_path: Path) -> None:
    tokens = np.random.default_rng(0).permutation(2000).astype(np.uint16)
    split = write_split(tmp_path, tokens, shard_tokens=300)

    def sizes(i: int) -> int:
        return 1 + i % 3

    def loader(rank: int) -> BatchLoader:
        return BatchLoader(split, 8, 3, seed=5, rank=rank, world_size=2, batch_sizes=sizes)

    one = loader(1)
    where = {int(t): i for i, t in enumerate(tokens)}
    for i in range(7):
        x, y = one.next_batch()
        assert x.shape == (sizes(i), 8)
        for row_x, row_y in zip(x.tolist(), y.tolist(), strict=True):
            start = where[row_x[0]]
            assert row_x == tokens[start:start + 8].tolist() and row_y == tokens[start + 1:start + 9].tolist()
    zero = loader(0)
    for _ in range(7):
        zero.next_batch()
    replayed = loader(1)
    replayed.load_state_dict(zero.state_dict())  # rank 0's state, replayed on rank 1's stream
    assert torch.equal(replayed.next_batch()[0], one.next_batch()[0])
