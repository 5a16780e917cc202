"""allocator.keep_freed_memory: large blocks come from the heap and stay there when freed (glibc)."""

import platform
import subprocess
import sys

import pytest

from seqtool import allocator

GLIBC = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")

# A 64 MiB buffer (above glibc's largest mmap threshold, 32 MiB) allocated and freed, with glibc's mallinfo2 read around it: `hblkhd` counts the
# bytes in blocks mapped with mmap (given back to the kernel on free, faulted in anew on the
# next allocation), `arena` the heap's bytes (kept, unless a trim gives its free top back).
PROBE = """
import ctypes, sys, torch
from seqtool import allocator
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
applied = allocator.keep_freed_memory() if sys.argv[1] == "keep" else None
before = libc.mallinfo2()
buf = torch.empty(16 << 20).fill_(1.0)  # 64 MiB
during = libc.mallinfo2()
del buf
after = libc.mallinfo2()
print(applied, (during.hblkhd - before.hblkhd) >> 20, (after.arena - before.arena) >> 20)
"""


def _probe(mode: str) -> tuple[str, int, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True).stdout.split()
    return out[0], int(out[1]), int(out[2])


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
@pytest.mark.system
def test_large_blocks_stay_in_the_heap_for_reuse():
    applied, mapped_mib, kept_mib = _probe("keep")
    assert applied == "True"
    assert mapped_mib == 0  # served from the heap, not by mmap...
    assert kept_mib >= 64  # ...and still there after the free, for the next step
    _, default_mapped, default_kept = _probe("default")
    assert default_mapped >= 64 and default_kept < 64  # the premise: glibc's default maps and unmaps it


@pytest.mark.unit
def test_keep_freed_memory_is_idempotent():
    from seqtool import allocator

    first = allocator.keep_freed_memory()
    assert allocator.keep_freed_memory() == first


@GLIBC
@pytest.mark.unit
def test_heap_trimmer_trims_at_most_once_a_period():
    trimmer = allocator.HeapTrimmer(1.0)
    assert trimmer.active
    calls = []
    trimmer._trim = lambda pad: calls.append(pad)
    assert [trimmer(t) for t in (10.0, 10.5, 10.99, 11.0, 11.2, 13.0)] == [True, False, False, True, False, True]
    assert calls == [0, 0, 0]  # malloc_trim(0): the free pages inside the heap too, not only its top
    assert trimmer(13.1, force=True) and trimmer(13.2, force=True)  # validation and checkpoint: at once
    assert calls == [0] * 5 and trimmer(13.5) is False  # a forced trim starts a new period


@pytest.mark.unit
def test_heap_trimmer_off_is_a_no_op():
    trimmer = allocator.HeapTrimmer(0.0)
    assert not trimmer.active and trimmer(100.0) is False


@GLIBC
@pytest.mark.unit
def test_malloc_trim_returns_freed_heap_pages():
    import ctypes

    trimmer = allocator.HeapTrimmer(1.0)
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def rss() -> int:
        return int(open("/proc/self/statm").read().split()[1]) * 4096

    blocks = [libc.malloc(64 << 10) for _ in range(1600)]  # 100 MiB of heap blocks (under the mmap threshold)
    for b in blocks:
        ctypes.memset(b, 1, 64 << 10)
    keep = blocks[-1]  # a live block at the top: trimming the top alone cannot return the rest
    for b in blocks[:-1]:
        libc.free(b)
    before = rss()
    assert trimmer(1e9)
    assert before - rss() > 50 << 20
    libc.free(keep)
