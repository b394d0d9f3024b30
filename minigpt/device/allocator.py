"""The CPU allocator for training and evaluation: the memory a step frees is kept for the next, not given back
to the kernel.

Every training step allocates and frees the same activations, gradients and loss buffers, many of them from a
few hundred KiB to a few MiB. glibc's malloc, the allocator of most Linux systems, serves a block above its
mmap threshold (128 KiB at first, raised to the largest such block freed, at most 32 MiB) with a fresh
mapping, and unmaps it when it is freed; and it hands the top of its heap back to the kernel whenever more
than twice that threshold lies free there. Either way the next step's allocation gets new pages, and the
kernel maps and zeroes each of them on first touch: a page fault per 4 KiB, thousands per step, which on a
small model is a tenth or more of the step (docs/performance.md).

`keep_freed_memory` sets the two thresholds once, before the first step: blocks up to 32 MiB (the most glibc
allows) come from the heap, and the heap is never trimmed. After the first steps every allocation reuses pages
already mapped. The process holds its peak memory until it exits, as torch's caching allocator does on a GPU.
Only larger blocks, which no small model's step makes, are still mapped and unmapped each time. Elsewhere
(macOS, musl) the allocator is left as it is. `device.keep_freed_memory=false` leaves it as it is for a
training run. Scoring a checkpoint (`scripts/evaluate.py`, inspect/perplexity.py) sets it too: a batch of
windows frees logits of the same size as the next one's, and the process ends when the scoring does.
"""

from __future__ import annotations

import ctypes
import platform

# mallopt's parameter numbers (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 * 2**20  # glibc's ceiling on 64-bit systems; a larger value is refused
NEVER_TRIM = 2**31 - 1  # the largest value mallopt's int takes: more free memory than a heap ever holds
KEPT = f"{MMAP_THRESHOLD_MAX // 2**20} MiB"  # what the lines below say


def keep_freed_memory(libc: ctypes.CDLL | None = None) -> str:
    """Make glibc's malloc keep freed blocks of up to MMAP_THRESHOLD_MAX for reuse; return a line saying so.

    `libc` is the C library to set (tests pass a stand-in); None: this process's own, where it is glibc."""
    if libc is None:
        if platform.libc_ver()[0] != "glibc":
            return "the system allocator, unchanged (not glibc)"
        libc = ctypes.CDLL(None)  # the process's own symbols, libc's among them
    # The mmap threshold first: once it is set, trimming can be turned off safely. The other order would be
    # worse than nothing if the first call failed: a fixed threshold left at 128 KiB maps every block afresh.
    if libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) != 1:
        return "the system allocator, unchanged (mallopt refused the mmap threshold)"
    if libc.mallopt(M_TRIM_THRESHOLD, NEVER_TRIM) != 1:
        return f"glibc's malloc serves blocks up to {KEPT} from its heap (mallopt refused to stop trimming)"
    return f"glibc's malloc keeps freed blocks up to {KEPT} for reuse"
