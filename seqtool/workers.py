"""Decoding processes for CPU throughput: `--workers N` decodes N batches at once.

Owns the pool behind `Translator` when config.workers > 1 (CTranslate2 calls it inter_threads):
N processes, each with its own copy of the model and threads / N torch threads, take whole
batches (token ids in, hypotheses out) while the parent tokenizes, orders and writes. Results
come back in batch order, so the output is the one of a single process with threads / N
threads, line for line.

Processes, not threads: a decoding step is a few hundred small torch operations whose Python
side holds the GIL, and two threads of one process measured no faster than one process with a
thread pool of two (int8 beam 5, 600 test lines: 2,700-3,200 target tokens/s against 3,200).
Two processes against one process with two threads, on the 2-core benchmark VM (int8 beam 5,
2,251 lines): from 0.9x to 1.4x across runs (1.41x in the median of the last 5-round run), so
whether it pays depends on the machine; CPUs where intra-op threads scale poorly (small batches,
many cores) gain most.

The workers start with the spawn method (no fork of a process that holds OpenMP threads) and
load the checkpoint themselves (weights_only, as every load), so a program that embeds
`Translator(workers=N)` needs the usual `if __name__ == "__main__":` guard of multiprocessing.
They ignore SIGINT: Ctrl-C reaches the parent, which stops them; and they die with the parent
however it ends (interrupts.die_with_parent). A worker that dies (killed, out of memory) fails
the translation with an error instead of hanging it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from concurrent.futures.process import BrokenProcessPool
from typing import Callable, Iterable, Iterator

from .errors import ConfigError, ResourceError
from .procpool import WatchedPool, WorkerDied
from .interrupts import die_with_parent

_translator = None  # the worker process's own Translator


def _start(load: Callable[[], object], parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops the pool
    die_with_parent(parent)  # SIGTERM, SIGKILL or the OOM killer of the parent: no worker left behind
    global _translator
    _translator = load()


def _search(job):
    return _translator.search_batch(*job)


class WorkerPool:
    """`n` decoding processes, each holding what `load` returns: a picklable callable (e.g. a
    functools.partial of Translator.load with one worker's settings), so this module needs no
    import of the translator that uses it."""

    def __init__(self, load: Callable[[], object], n: int):
        self.n = n
        try:  # every worker started (and its model loaded) now, not inside the first translation
            self.pool = WatchedPool(n, multiprocessing.get_context("spawn"), _start, (load, os.getpid()))
        except BrokenProcessPool:
            raise ConfigError(f"--workers {n}: a decoding process failed to start (see its error above)") from None

    def search(self, jobs: Iterable[tuple]) -> Iterator:
        """search_batch(rows, keys, options, prefixes) of every job, in order, decoded by the workers in parallel."""
        try:
            yield from self.pool.map(_search, jobs)
        except WorkerDied as died:
            which = f" (PID {died.pid})" if died.pid is not None else ""
            raise ResourceError(f"a decoding worker process{which} died: killed, or out of memory; "
                                "use fewer --workers or a smaller --batch-size") from None

    def close(self) -> None:
        self.pool.shutdown()
