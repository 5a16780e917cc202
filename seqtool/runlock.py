"""One run per directory: an advisory lock on SAVE_DIR/.seqtool.lock held for the whole of a training run.

Two `seqtool train` processes on one --save-dir would both resume last.pt, overwrite each other's
checkpoints and interleave metrics.jsonl. The lock (flock, released by the kernel when the process
ends, however it ends) makes the second one stop at once, naming the holder's PID. The file is
removed when the run ends (one killed with SIGKILL leaves it, unlocked: the next run takes it).
Where there is no flock (Windows) runs are not locked.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from .errors import InputError

LOCK_NAME = ".seqtool.lock"


class RunLock:
    def __init__(self, directory: Path):
        self.path = Path(directory) / LOCK_NAME
        self.fd: Optional[int] = None

    def acquire(self) -> None:
        try:
            import fcntl
        except ImportError:  # no flock here
            return
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise InputError(f"{self.path.parent}: another seqtool train (PID {holder}) is using this directory; "
                                 f"wait for it to finish or pick another --save-dir") from None
            try:  # the holder before us may have removed the file between our open and our lock: retry then
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd

    def release(self) -> None:
        """Remove the file, then drop the lock (in that order: whoever locks the file next finds it
        still named by the path, or opens a new one)."""
        if self.fd is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            os.close(self.fd)  # the lock goes with the descriptor
            self.fd = None

    def __del__(self) -> None:  # a Trainer built but never run
        self.release()
