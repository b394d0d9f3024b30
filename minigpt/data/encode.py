"""Documents -> token shards, in parallel worker processes, with a bounded amount in memory at a time.

Documents are grouped into chunks of about ENCODE_CHUNK_CHARS characters. A chunk becomes one flat array
per split ([<|endoftext|>, ids...] per document, concatenated), handed to that split's `ShardWriter` in
corpus order, whichever worker encoded it: the tokens never depend on `data.num_workers`.

Workers are processes started with `spawn` (a fresh interpreter that loads the tokenizer from the folder it
was saved to; `fork` would copy a parent that may hold torch's threads and their locks). Like every spawned
process, each imports the launching script again, so a script that calls `prepare_dataset` must keep its
work under `if __name__ == "__main__":` (minigpt's scripts do; a notebook needs nothing). They start only
once the corpus has passed POOL_MIN_CHARS: starting one costs an interpreter plus the imports of numpy,
tiktoken and the launching script, more than a small corpus takes to encode -- which tiktoken does on
`num_workers` threads anyway, since its Rust encoder releases the GIL. At most
IN_FLIGHT_PER_WORKER chunks per worker are queued, so memory stays near
workers x IN_FLIGHT_PER_WORKER x chunk size, whatever the size of the corpus.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from minigpt import signals
from minigpt.data.documents import Document
from minigpt.data.shards import DTYPES, ShardWriter
from minigpt.data.tokenizers import Tokenizer, load_tokenizer
from minigpt.errors import UserError

ENCODE_CHUNK_CHARS = 4_000_000  # a few MB of text per task: enough to hide the hand-over, small in memory
POOL_MIN_CHARS = 32_000_000  # seconds of one core's bpe encoding: past this, the workers' start-up is repaid
IN_FLIGHT_PER_WORKER = 2  # one chunk being encoded, one waiting: no worker idles while results are written

Chunk = dict[str, list[str]]  # split -> the texts of its documents in this chunk, in order


@dataclass
class SplitCounts:
    documents: int = 0
    chars: int = 0
    bytes: int = 0  # UTF-8 bytes of the text

    def add(self, other: SplitCounts) -> None:
        self.documents += other.documents
        self.chars += other.chars
        self.bytes += other.bytes


Encoded = dict[str, tuple[np.ndarray, SplitCounts]]  # split -> (flat tokens, what they came from)


def encode_chunk(tokenizer: Tokenizer, chunk: Chunk, dtype: str, num_threads: int) -> Encoded:
    """Each split's texts as [eot, ids...] per document, concatenated into one (N,) array."""
    out: Encoded = {}
    for split, texts in chunk.items():
        rows = tokenizer.encode_batch(texts, num_threads=num_threads)
        flat = np.empty(sum(len(r) + 1 for r in rows), dtype=DTYPES[dtype])
        pos = 0
        for row in rows:
            flat[pos] = tokenizer.eot_id
            flat[pos + 1 : pos + 1 + len(row)] = row
            pos += len(row) + 1
        counts = SplitCounts(len(texts), sum(map(len, texts)), sum(len(t.encode("utf-8")) for t in texts))
        out[split] = (flat, counts)
    return out


def encode_corpus(
    tagged_docs: Iterable[tuple[str, Document]],
    tokenizer: Tokenizer,
    tokenizer_dir: Path,
    writers: dict[str, ShardWriter],
    *,
    num_workers: int,
    progress: bool,
    total_chars: int | None = None,
) -> dict[str, SplitCounts]:
    """Encode every (split, document) into `writers[split]`, in order; return what each split received.

    `num_workers`: 0 = one per CPU core, 1 = this process only. `tokenizer_dir` holds `tokenizer` saved,
    for the workers to load.
    """
    workers = num_workers or cpu_count()
    dtype = next(iter(writers.values())).dtype_name
    counts = {split: SplitCounts() for split in writers}
    # disable=None: show the bar only on a terminal, so logs and CI output stay free of it.
    bar = tqdm(total=total_chars, unit="char", unit_scale=True, desc="encode",
               disable=None if progress else True)
    pool: ProcessPoolExecutor | None = None
    pending: deque[Future[Encoded]] = deque()

    def write(encoded: Encoded) -> None:
        for split, (tokens, got) in encoded.items():
            writers[split].write(tokens)
            counts[split].add(got)
            bar.update(got.chars)

    try:
        seen = 0
        for chunk, chars in _chunks(tagged_docs, ENCODE_CHUNK_CHARS):
            seen += chars
            if pool is None and workers > 1 and seen > POOL_MIN_CHARS:
                pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                           initializer=_init_worker, initargs=(str(tokenizer_dir),))
            if pool is None:
                write(encode_chunk(tokenizer, chunk, dtype, num_threads=workers))
                continue
            # Ctrl-C reaches the whole process group: only this process stops (and ends the pool). The
            # workers start at the first submit and keep the stop signals ignored from their first line.
            with signals.ignored() if not pending else contextlib.nullcontext():
                pending.append(pool.submit(_encode_in_worker, chunk, dtype))
            while len(pending) >= workers * IN_FLIGHT_PER_WORKER:
                write(pending.popleft().result())
        while pending:
            write(pending.popleft().result())
    except BrokenProcessPool:
        raise UserError(
            "an encoding worker process died (killed for lack of memory, or started by a script that works "
            "when imported: call prepare_dataset under `if __name__ == \"__main__\":`); "
            "data.num_workers=1 encodes in this process"
        ) from None
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        bar.close()
    return counts


def cpu_count() -> int:
    """The cores this process may run on (a job scheduler's CPU mask included, unlike os.cpu_count())."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _chunks(tagged_docs: Iterable[tuple[str, Document]], max_chars: int) -> Iterator[tuple[Chunk, int]]:
    chunk: Chunk = {}
    size = 0
    for split, doc in tagged_docs:
        if size and size + len(doc.text) > max_chars:
            yield chunk, size
            chunk, size = {}, 0
        chunk.setdefault(split, []).append(doc.text)
        size += len(doc.text)
    if size:
        yield chunk, size


_worker_tokenizer: Tokenizer | None = None  # set once per worker process by _init_worker


def _init_worker(tokenizer_dir: str) -> None:
    global _worker_tokenizer
    _worker_tokenizer = load_tokenizer(Path(tokenizer_dir))


def _encode_in_worker(chunk: Chunk, dtype: str) -> Encoded:
    assert _worker_tokenizer is not None, "the pool's initializer loads the tokenizer"
    return encode_chunk(_worker_tokenizer, chunk, dtype, num_threads=1)  # the processes are the parallelism
