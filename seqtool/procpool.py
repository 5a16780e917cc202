"""Process pools that fail fast when a worker is killed: binarize's encoders and translate's decoders.

Owns concurrent.futures.ProcessPoolExecutor with one addition, a watch on its workers. A worker
killed (SIGKILL, the OOM killer) while it was writing a result leaves half a message in the
executor's result pipe; the executor's manager thread then waits in recv() for the rest, never
looks at the dead process, and the result never comes (binarize --workers hung in about 1 run in 4
of a kill test, Python 3.11). So whoever waits for a result here waits in short slices and looks
at the workers between them; when one is gone, the others are killed (their work is lost either
way) and the pipe's last write end, an unused copy the executor keeps in this process, is
closed: the manager's recv() ends, the executor marks itself broken, and shutdown() can join it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

WAIT_SLICE = 0.05  # seconds between looks at the workers (and the caller's checks) while waiting


class WorkerDied(BrokenProcessPool):
    """A worker process is gone; pid: which (None when the executor found it first)."""

    def __init__(self, pid: int | None = None):
        super().__init__(f"worker process {pid} died" if pid is not None else "a worker process died")
        self.pid = pid


def _pid(_) -> int:
    return os.getpid()


def alive(pid: int) -> bool:
    """Whether child `pid` still runs (a zombie, not yet reaped by its pool, does not); where there
    is no /proc, every worker counts as alive and the executor's own check is all there is."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return not Path("/proc/self").exists()
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


class WatchedPool:
    """n worker processes (spawned: no fork of a process holding threads), every one started (and
    its initializer run) before the constructor returns; BrokenProcessPool if one fails to start."""

    def __init__(self, n: int, mp_context, initializer: Callable, initargs: tuple = ()):
        self.executor = ProcessPoolExecutor(n, mp_context=mp_context, initializer=initializer, initargs=initargs)
        try:  # n jobs submitted at once start n processes
            started = set(self.executor.map(_pid, range(n)))
        except BrokenProcessPool:
            self.executor.shutdown(wait=False, cancel_futures=True)
            raise
        self.processes = dict(getattr(self.executor, "_processes", None) or {})  # pid -> Process (its exit code)
        self.pids = sorted(started | set(self.processes))

    def submit(self, fn: Callable, *args: Any) -> Future:
        self.check_workers()
        try:
            return self.executor.submit(fn, *args)
        except BrokenProcessPool:
            raise WorkerDied(self._culprit()) from None

    def result(self, future: Future, between: Callable[[], None] = lambda: None) -> Any:
        """future's result; `between` runs in every wait slice (e.g. to take a Ctrl-C flag)."""
        while True:
            try:
                return future.result(timeout=WAIT_SLICE)
            except FutureTimeout:
                between()
                self.check_workers()
            except WorkerDied:
                raise
            except BrokenProcessPool:  # the executor saw it first (and stopped the others with SIGTERM)
                raise WorkerDied(self._culprit()) from None

    def map(self, fn: Callable, items: Iterable) -> Iterator:
        """fn(item) of every item, in order, computed by the workers in parallel."""
        futures = [self.submit(fn, item) for item in items]
        try:
            for future in futures:
                yield self.result(future)
        finally:
            for future in futures:
                future.cancel()

    def check_workers(self) -> None:
        dead = [pid for pid in self.pids if not alive(pid)]
        if not dead:
            return
        culprit = self._culprit() or dead[0]  # before the others are killed below
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        writer = getattr(getattr(self.executor, "_result_queue", None), "_writer", None)
        if writer is not None:
            writer.close()
        raise WorkerDied(culprit)

    def _culprit(self) -> int | None:
        """The worker that died on its own. Other workers end too once one is gone (the executor
        sends them SIGTERM; one may first exit 1 on its closed queue), so the first choice is a
        worker killed by another signal (SIGKILL: the OOM killer, kill -9), then one that exited
        with an error. A death can be reported before the process is reaped: up to a second."""
        deadline = time.monotonic() + 1.0
        while True:
            codes = {pid: process.exitcode for pid, process in self.processes.items()}
            killed = [pid for pid, code in codes.items() if code is not None and code < 0 and code != -signal.SIGTERM]
            if killed:
                return killed[0]
            if time.monotonic() > deadline:
                failed = [pid for pid, code in codes.items() if code not in (None, 0, -signal.SIGTERM)]
                return failed[0] if failed else None
            time.sleep(0.01)

    def shutdown(self) -> None:
        """Wait for the running jobs (the queued ones are cancelled), so no worker outlives this
        call. (wait=False left concurrent.futures' exit hook writing to a closed pipe: a traceback
        at exit, Python 3.11.)"""
        self.executor.shutdown(wait=True, cancel_futures=True)
