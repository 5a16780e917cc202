"""The C allocator's policy for decoding on CPU: keep freed memory for reuse (glibc only).

Decoding frees and allocates the same large blocks every step and every batch: the logits
(rows x V), the caches' key/value buffers (megabytes each), the int8 kernels' scratch space.
glibc serves a block above its mmap threshold with fresh pages from the kernel, and trims
the heap's top when more than twice that is free. Either way the next step's block of the
same size is page-faulted in and zero-filled again. Profiled on int8 beam-5 decoding of 600
test lines: writing one position into a fresh cache buffer took 0.5-0.7 ms instead of 0.05 ms,
and the process took about 350,000 more minor page faults.

keep_freed_memory() turns mmap off for the allocator (M_MMAP_MAX 0: every block comes from the
heap) and raises the trim threshold to 1 GiB, so freed blocks stay in the heap and are reused
without faults. The peak RSS barely moves (the blocks were live at the peak anyway); the process
just does not give memory back between steps. Measured on the cpu-small int8 model (600 lines,
beam 5, 2 threads, 6 interleaved runs), with the mmap threshold raised to glibc's maximum (32 MiB)
rather than mmap off: median 2,880 target tokens/s against 2,446 (+18%). That maximum left the
blocks of a large vocabulary mapped: the logits of a 58,101-id model are 60 MB at 256 rows, and
int8 beam 4 on a model of opus-mt-en-de's shape (200 lines, 2 threads) took 1.7 million page
faults and ran at 610 target tokens/s; with mmap off, 330,000 faults and 695 tokens/s (peak
RSS 1.27 -> 1.40 GB).

It changes the whole process (as torch.set_num_threads does), so it is applied where decoding
owns the process: `Translator.load` on CPU. Training leaves glibc's defaults alone (there the
question is fragmentation, see kernels.limit_primitive_cache).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1  # mallopt parameters (malloc.h)
M_TOP_PAD = -2
M_MMAP_MAX = -4

MMAP_MAX = 0  # no block is served by mmap: every block comes from the heap, where freed ones stay
TRIM_THRESHOLD = 1 << 30
TOP_PAD = 64 << 20  # heap growth in steps of 64 MiB: fewer brk calls

_applied = False


def keep_freed_memory() -> bool:
    """Set glibc's thresholds (once per process). False where there is no glibc (macOS, musl,
    Windows): those allocators are left as they are."""
    global _applied
    if _applied:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = all(mallopt(p, v) == 1 for p, v in ((M_MMAP_MAX, MMAP_MAX), (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
                                              (M_TOP_PAD, TOP_PAD)))
    _applied = ok
    return ok


class HeapTrimmer:
    """Training on CPU: hand the heap's free pages back to the system between updates, at most once
    every `period` seconds (glibc only; elsewhere a no-op), and at once after each validation and
    checkpoint save.

    Every update frees and allocates the step's activations (blocks of 1-16 MB whose sizes change
    with each batch's shape). malloc_trim(0) returns the free pages inside the heap (madvise), not
    just its top. The cost is that the next update faults those pages in again: trimming every
    second cost a cpu-small bf16 run ~20% of its tokens/s (89,000 page faults an update). The
    heap growth it was fighting (peak RSS 2,593 MiB against fairseq's 1,657 over twenty minutes)
    turned out to be ideep's LRU cache, now capped (kernels.limit_primitive_cache); with it capped,
    the heap stays flat untrimmed, so training trims once a minute. Figures in bench/results.md."""

    def __init__(self, period: float):
        self.period = period
        self.last = 0.0
        self._trim = None
        if period > 0 and sys.platform.startswith("linux"):
            try:
                self._trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
                self._trim.argtypes = [ctypes.c_size_t]
            except (OSError, AttributeError):
                self._trim = None

    @property
    def active(self) -> bool:
        return self._trim is not None

    def __call__(self, now: float, force: bool = False) -> bool:
        """Trim if `period` seconds have passed since the last trim (now: time.monotonic()), or now
        when `force` (after a validation and checkpoint save: their blocks are all free then)."""
        if self._trim is None or (now - self.last < self.period and not force):
            return False
        self._trim(0)
        self.last = now
        return True
