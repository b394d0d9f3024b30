"""BatchLoader and iter_eval_batches against direct slices of the token file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from minigpt.data.loader import BatchLoader, iter_eval_batches
from minigpt.errors import UserError

T, B = 8, 4


def write_bin(
    folder: Path, n: int, dtype: str = "uint16", name: str = "train.bin"
) -> tuple[Path, np.ndarray]:
    """Distinct token values (a permutation), so every window's position in the file is unambiguous."""
    folder.mkdir(parents=True, exist_ok=True)
    tokens = np.random.default_rng(0).permutation(n).astype({"uint16": "<u2", "uint32": "<u4"}[dtype])
    tokens.tofile(folder / name)
    (folder / "meta.json").write_text(json.dumps({"dtype": dtype}))
    return folder / name, tokens


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_batches_are_windows_of_the_file_shifted_by_one(tmp_path: Path, dtype: str) -> None:
    path, tokens = write_bin(tmp_path, 1000, dtype)
    where = {int(t): i for i, t in enumerate(tokens)}
    loader = BatchLoader(path, T, B, seed=0)
    for _ in range(5):
        x, y = loader.next_batch()
        assert x.shape == y.shape == (B, T) and x.dtype == y.dtype == torch.int64
        assert x.is_contiguous() and y.is_contiguous()
        for row_x, row_y in zip(x.tolist(), y.tolist(), strict=True):
            start = where[row_x[0]]
            assert row_x == tokens[start : start + T].tolist()
            assert row_y == tokens[start + 1 : start + T + 1].tolist()


def test_every_start_is_reachable_and_none_overruns(tmp_path: Path) -> None:
    path, tokens = write_bin(tmp_path, T + 3)  # exactly 3 valid starts: 0, 1, 2
    where = {int(t): i for i, t in enumerate(tokens)}
    loader = BatchLoader(path, T, 16, seed=1)
    starts = {where[int(v)] for _ in range(10) for v in loader.next_batch()[0][:, 0]}
    assert starts == {0, 1, 2}


def test_seed_and_rank_select_the_stream(tmp_path: Path) -> None:
    path, _ = write_bin(tmp_path, 5000)

    def batches(**kw) -> list[torch.Tensor]:
        loader = BatchLoader(path, T, B, **kw)
        return [loader.next_batch()[0] for _ in range(3)]

    same = batches(seed=3), batches(seed=3)
    assert all(torch.equal(a, b) for a, b in zip(*same, strict=True))
    for other in (batches(seed=4), batches(seed=3, rank=1, world_size=2)):
        assert not all(torch.equal(a, b) for a, b in zip(same[0], other, strict=True))


def test_state_dict_resumes_the_exact_sequence(tmp_path: Path) -> None:
    path, _ = write_bin(tmp_path, 5000)
    loader = BatchLoader(path, T, B, seed=7)
    for _ in range(3):
        loader.next_batch()
    torch.save(loader.state_dict(), tmp_path / "state.pt")
    expected = [loader.next_batch() for _ in range(4)]

    resumed = BatchLoader(path, T, B, seed=7)
    resumed.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    got = [resumed.next_batch() for _ in range(4)]
    for (ex, ey), (gx, gy) in zip(expected, got, strict=True):
        assert torch.equal(ex, gx) and torch.equal(ey, gy)


def test_state_from_rank0_replays_on_another_rank(tmp_path: Path) -> None:
    path, _ = write_bin(tmp_path, 5000)
    rank0 = BatchLoader(path, T, B, seed=7, rank=0, world_size=2)
    rank1 = BatchLoader(path, T, B, seed=7, rank=1, world_size=2)
    for _ in range(5):
        rank0.next_batch()
        rank1.next_batch()
    fresh1 = BatchLoader(path, T, B, seed=7, rank=1, world_size=2)
    fresh1.load_state_dict(rank0.state_dict())
    assert torch.equal(fresh1.next_batch()[0], rank1.next_batch()[0])


def test_eval_batches_cover_the_split_in_order(tmp_path: Path) -> None:
    n = 103
    path, tokens = write_bin(tmp_path, n, name="val.bin")
    batches = list(iter_eval_batches(path, T, B))
    xs = torch.cat([x for x, _ in batches])  # (windows, T)
    ys = torch.cat([y for _, y in batches])
    n_windows = (n - 1) // T  # 12 windows -> batches of 4, 4, 4
    assert [len(x) for x, _ in batches] == [4, 4, 4]
    assert xs.flatten().tolist() == tokens[: n_windows * T].tolist()
    assert ys.flatten().tolist() == tokens[1 : n_windows * T + 1].tolist()
    assert len(list(iter_eval_batches(path, T, B, max_batches=2))) == 2
    # Two ranks split the batches between them; together they are the single-rank sequence.
    parts = [list(iter_eval_batches(path, T, B, rank=r, world_size=2)) for r in (0, 1)]
    assert [len(p) for p in parts] == [2, 1]
    assert torch.equal(torch.cat([parts[0][0][0], parts[1][0][0], parts[0][1][0]]), xs)


def test_eval_last_batch_may_be_partial(tmp_path: Path) -> None:
    path, tokens = write_bin(tmp_path, 5 * T + 1, name="val.bin")
    sizes = [len(x) for x, _ in iter_eval_batches(path, T, B)]
    assert sizes == [4, 1]


def test_too_short_split_is_a_user_error(tmp_path: Path) -> None:
    path, _ = write_bin(tmp_path, T)  # needs T + 1
    with pytest.raises(UserError, match=r"fewer than block_size \+ 1 = 9.*model.block_size"):
        BatchLoader(path, T, B, seed=0)
    with pytest.raises(UserError, match="fewer than block_size"):
        next(iter_eval_batches(path, T, B))


def test_missing_files_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        BatchLoader(tmp_path / "train.bin", T, B, seed=0)
    (tmp_path / "train.bin").write_bytes(b"\x00" * 100)
    with pytest.raises(UserError, match="meta.json"):
        BatchLoader(tmp_path / "train.bin", T, B, seed=0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_batches_match_cpu(tmp_path: Path) -> None:
    path, _ = write_bin(tmp_path, 5000)
    cpu = BatchLoader(path, T, B, seed=5).next_batch()
    gpu = BatchLoader(path, T, B, seed=5, device="cuda").next_batch()
    assert gpu[0].device.type == "cuda"
    assert torch.equal(cpu[0], gpu[0].cpu()) and torch.equal(cpu[1], gpu[1].cpu())
