"""Signals: Ctrl-C and SIGTERM during training stop cleanly, but never in the middle of writing a
checkpoint (Interrupts); every process seqtool starts ends with it (die_with_parent); and work
done for someone with a deadline stops at it (set_deadline, check_deadline: a server request's
CPU work outside the model is bounded by --request-timeout)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from contextvars import ContextVar
from typing import Any, Iterator, Optional


class Interrupts:
    """Ctrl-C and SIGTERM (torchrun's, a scheduler's) stop training as a KeyboardInterrupt, which
    saves last.pt, except while a checkpoint is being written: raised inside torch.save, it breaks
    the zip writer (a RuntimeError "unexpected pos") and loses the save in progress. So inside
    held() a signal is only noted, and raised when the write is done; once the run is stopping
    (the interrupt's own save), further signals are ignored."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.previous: dict[int, Any] = {}
        self.holding = self.pending = self.stopping = False

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():  # only it may set handlers
            return
        for signum in self.SIGNALS:
            if signal.getsignal(signum) is not signal.SIG_IGN:  # nohup'd or backgrounded: stay deaf
                self.previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous.clear()

    def _handle(self, signum, frame) -> None:
        if self.holding or self.stopping:
            self.pending = True
            return
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
        if self.pending and not self.stopping:
            self.pending = False
            raise KeyboardInterrupt


def die_with_parent(parent: int) -> None:
    """In a child process: be killed (SIGKILL) when the parent process `parent` ends, however it ends
    (Ctrl-C, SIGTERM, SIGKILL, the OOM killer), so no decoding or tokenizer process outlives the
    command that started it. Linux (prctl PR_SET_PDEATHSIG); elsewhere a no-op. A parent that died
    before this call is noticed at once: the child exits."""
    try:
        import ctypes

        if ctypes.CDLL(None).prctl(1, signal.SIGKILL) != 0:  # PR_SET_PDEATHSIG
            return
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # orphaned already (re-parented) before the signal was armed
        os._exit(1)


class TimeUp(BaseException):
    """Work done for someone stopped at their deadline (check_deadline). A BaseException, as
    KeyboardInterrupt and asyncio's CancelledError are: code that recovers from a bad input
    (`except Exception`) must not recover from it."""


# The monotonic time the current work is for until (None: no deadline). A context variable: each
# asyncio task (a server request) has its own, and asyncio.to_thread carries it into the worker thread.
_DEADLINE: ContextVar[Optional[float]] = ContextVar("seqtool_deadline", default=None)


def set_deadline(at: Optional[float]) -> None:
    """From now on, in this context (a request's task and the threads it starts), work stops at `at`."""
    _DEADLINE.set(at)


def time_left() -> Optional[float]:
    """Seconds to this context's deadline (None: none)."""
    at = _DEADLINE.get()
    return None if at is None else at - time.monotonic()


def check_deadline() -> None:
    """TimeUp once this context's deadline has passed. Called between units of work (a text, a
    block, a segment), each of them bounded (linear in its size), so work stops soon after it."""
    at = _DEADLINE.get()
    if at is not None and time.monotonic() > at:
        raise TimeUp("the deadline passed")
