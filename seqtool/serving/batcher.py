"""The server's queue and its one decoding thread: segments of many requests decoded in shared batches.

Owns the queue between HTTP requests and the model, and the one runner thread that decodes it.
Requests never call the model: each request's segments arrive tokenized (prepare.py did that off
the event loop) and are queued; the runner takes pending segments (the oldest first, up to
max_batch_tokens source tokens of one set of search options, or what is there once max_wait_ms has
passed since the later of the oldest one's arrival and the end of the last batch), decodes them in
one Translator call and hands each result back to its request on the request's event loop.

One request never fails another. Requests are validated in full before they are queued, so a batch
should not fail; if one does anyway, its requests are decoded again apart, and only the one at fault
gets the error. A request that times out or whose client goes away has its pending segments dropped,
and its segments in the running batch leave the search at its next step (search.py's `wanted`).
Nothing here knows HTTP (app.py does).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from .. import log, pipeline
from ..config import SearchOptions, ServeConfig
from ..pipeline import Segment
from ..errors import InputError, ResourceError


@dataclass(eq=False)
class Request:
    """One HTTP request's segments in the queue; `done` resolves (on the event loop) when all are translated."""
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future
    name: str = ""  # "request 3f2a", for the log
    results: list = field(default_factory=list)
    remaining: int = 0
    cancelled: bool = False


@dataclass(eq=False)
class _Queued:
    request: Request
    segment: Segment
    options: SearchOptions
    queued: float  # time.monotonic()
    slot: int  # the result's place in its request


NONE: frozenset = frozenset()


class TooLarge(InputError):
    """A request that could never be queued, however long it waited (413)."""


class Batcher:
    """The queue between requests and the model, and the one runner thread that decodes it."""

    def __init__(self, translator, config: ServeConfig, on_batch: Callable[[int, int, float], None] = lambda *a: None):
        self.translator, self.config, self.on_batch = translator, config, on_batch
        self.pending: deque[_Queued] = deque()
        self.cond = threading.Condition()
        self.stopping = False
        self.free_since = 0.0  # when the runner finished its last batch (time.monotonic())
        self.cancels = 0  # requests cancelled so far: a running batch looks for its own only when this moves
        self.thread = threading.Thread(target=self._run, name="seqtool-batcher", daemon=True)
        self.thread.start()

    @property
    def depth(self) -> int:
        return len(self.pending)

    def submit(self, segments: Sequence[Segment], count: int, options: SearchOptions, loop: asyncio.AbstractEventLoop,
               name: str = "", slots: Optional[Sequence[int]] = None) -> Request:
        """Queue one request of `count` segments, of which `segments` are the non-empty ones, each
        knowing its place in the request (its slot, default origin.line; the others are answered at
        once with an empty translation). TooLarge when the request alone
        exceeds the queue; ResourceError when the queue is too full for it now."""
        request = Request(loop, loop.create_future(), name, [([], [], None, 0)] * count, len(segments))
        if not segments:
            request.done.set_result(request.results)
            return request
        if len(segments) > self.config.queue_limit:
            raise TooLarge(f"{len(segments)} segments in one request; this server queues at most {self.config.queue_limit} "
                           "(--queue-limit): split the request")
        now = time.monotonic()
        with self.cond:
            if self.stopping:
                raise ResourceError("the server is shutting down")
            if len(self.pending) + len(segments) > self.config.queue_limit:
                raise ResourceError(f"the queue is full ({len(self.pending)} segments waiting, --queue-limit "
                                    f"{self.config.queue_limit}); retry in a moment")
            places = slots if slots is not None else [s.origin.line for s in segments]
            self.pending.extend(_Queued(request, s, options, now, slot) for s, slot in zip(segments, places))
            self.cond.notify()
        return request

    def cancel(self, request: Request) -> None:
        """A request that timed out or whose client went away: its pending segments are dropped, and
        those in the running batch leave the search at its next step."""
        with self.cond:
            request.cancelled = True
            self.cancels += 1
            self.pending = deque(q for q in self.pending if q.request is not request)

    def drain(self) -> None:
        """The server is stopping (SIGTERM): decode what is queued now, without waiting for company;
        take nothing new; the runner ends once the queue is empty."""
        with self.cond:
            self.stopping = True
            self.cond.notify()

    def stop(self) -> None:
        """Decode what is queued, then end the runner."""
        self.drain()
        self.thread.join()

    def _take(self) -> list[_Queued]:
        """Under the lock: the oldest segment's options, and pending segments with them, oldest
        first, up to the token budget (always at least one)."""
        options = self.pending[0].options
        batch: list[_Queued] = []
        tokens, rest = 0, deque()
        while self.pending:
            q = self.pending.popleft()
            if q.options == options and (not batch or tokens + len(q.segment.ids) <= self.config.max_batch_tokens):
                batch.append(q)
                tokens += len(q.segment.ids)
            else:
                rest.append(q)
        self.pending = rest
        return batch

    def _ready(self) -> bool:
        """Under the lock: whether the runner should decode now: the token budget is reached, or
        max-wait has passed since the later of the oldest segment's arrival and the end of the
        last batch. Counting from the end of the last batch too lets the clients it just answered
        send their next sentences into this one: closed-loop clients otherwise split into two
        cohorts that alternate, each batch half as large as the load allows (measured: 16 segments
        per batch at concurrency 32, bench/serve.py)."""
        if self.stopping:
            return True
        waited = time.monotonic() - max(self.pending[0].queued, self.free_since)
        return waited * 1000 >= self.config.max_wait_ms or \
            sum(len(q.segment.ids) for q in self.pending) >= self.config.max_batch_tokens

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.pending and not self.stopping:
                    self.cond.wait()
                if not self.pending:
                    return
                while not self._ready():
                    left = self.config.max_wait_ms / 1000 - (time.monotonic() - max(self.pending[0].queued, self.free_since))
                    self.cond.wait(timeout=max(left, 0.0005))
                    if not self.pending:
                        break
                batch = self._take() if self.pending else []
            if batch:
                self._decode(batch)
                self.free_since = time.monotonic()

    def _decode(self, batch: list[_Queued]) -> None:
        t0 = time.monotonic()
        try:
            results: list[Any] = self._translate(batch)
        except Exception as error:
            requests = list(dict.fromkeys(q.request for q in batch))
            if len(requests) == 1:
                log.error(f"{requests[0].name}: decoding failed: {type(error).__name__}: {error}")
                results = [error] * len(batch)
            else:  # retried apart: only the request at fault gets the error
                log.warn(f"a batch of {len(requests)} requests failed ({type(error).__name__}: {error}); decoding them apart")
                apart: dict[Request, Any] = {}
                for request in requests:
                    mine = [q for q in batch if q.request is request]
                    try:
                        apart[request] = iter(self._translate(mine))
                    except Exception as own:
                        log.error(f"{request.name}: decoding failed: {type(own).__name__}: {own}")
                        apart[request] = own
                results = [apart[q.request] if isinstance(apart[q.request], Exception) else next(apart[q.request]) for q in batch]
        self.on_batch(len(batch), sum(len(r[0][0].tokens) + 1 for r in results if not isinstance(r, Exception) and r[0]),
                      time.monotonic() - t0)
        for q, r in zip(batch, results):
            if not q.request.cancelled:
                q.request.loop.call_soon_threadsafe(_deliver, q, r)

    def _translate(self, batch: list[_Queued]) -> list[tuple]:
        """One pipeline run over the batch's segments; the segments of a request cancelled meanwhile
        leave the search at its next step."""
        seen = self.cancels

        def abandoned() -> frozenset:
            if self.cancels == seen:
                return NONE
            return frozenset(k for k, q in enumerate(batch) if q.request.cancelled)

        out = pipeline.run(self.translator, [q.segment for q in batch], batch[0].options, abandoned)
        return [(t.hypotheses, t.texts, t.alignments, t.capped) for t in out]


def _deliver(queued: _Queued, result: Any) -> None:
    """On the event loop: one segment's result into its request."""
    request = queued.request
    if request.done.done():
        return
    if isinstance(result, Exception):
        request.done.set_exception(result)
        return
    request.results[queued.slot] = result
    request.remaining -= 1
    if request.remaining == 0:
        request.done.set_result(request.results)
