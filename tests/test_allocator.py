"""allocator.keep_freed_memory: large blocks come from the heap and stay there when freed (glibc)."""

import platform
import subprocess
import sys

import pytest

# A 20 MiB buffer allocated and freed, with glibc's mallinfo2 read around it: `hblkhd` counts the
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
buf = torch.empty(5 << 20).fill_(1.0)  # 20 MiB
during = libc.mallinfo2()
del buf
after = libc.mallinfo2()
print(applied, (during.hblkhd - before.hblkhd) >> 20, (after.arena - before.arena) >> 20)
"""


def _probe(mode: str) -> tuple[str, int, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True).stdout.split()
    return out[0], int(out[1]), int(out[2])


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_large_blocks_stay_in_the_heap_for_reuse():
    applied, mapped_mib, kept_mib = _probe("keep")
    assert applied == "True"
    assert mapped_mib == 0  # served from the heap, not by mmap...
    assert kept_mib >= 20  # ...and still there after the free, for the next step
    _, default_mapped, default_kept = _probe("default")
    assert default_mapped >= 20 and default_kept < 20  # the premise: glibc's default maps and unmaps it


def test_keep_freed_memory_is_idempotent():
    from seqtool import allocator

    first = allocator.keep_freed_memory()
    assert allocator.keep_freed_memory() == first
