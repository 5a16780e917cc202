"""The batcher of `seqtool serve`: many requests' segments, one model, shared batches.

Owns the queue between HTTP requests and the model, and the one runner thread that decodes it.
Requests never call the model: each request's segments are tokenized and queued; the runner takes
pending segments (the oldest first, up to max_batch_tokens source tokens of one set of search
options, or what is there once max_wait_ms has passed since the later of the oldest one's arrival
and the end of the last batch), decodes them in one Translator call and hands each result back to
its request on the request's event loop. A request that times out or whose client goes away has
its pending segments dropped. Nothing here knows HTTP (serve.py does).
"""

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from . import log
from .config import SearchOptions, ServeConfig
from .errors import ResourceError


@dataclass(eq=False)
class _Request:
    """One HTTP request's segments in the queue; `done` resolves (on the event loop) when all are translated."""
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future
    results: list = field(default_factory=list)
    remaining: int = 0
    cancelled: bool = False


@dataclass(eq=False)
class _Segment:
    request: _Request
    index: int  # place in its request (also its key for sampling)
    text: str
    ids: list[int]
    options: SearchOptions
    queued: float  # time.monotonic()
    prefix: list[int] = field(default_factory=list)  # target prefix ids (empty: none)
    constraints: list = field(default_factory=list)  # groups of alternative token sequences (Translator.constraint_ids)


class Batcher:
    """The queue between requests and the model, and the one runner thread that decodes it."""

    def __init__(self, translator, config: ServeConfig, on_batch: Callable[[int, int, float], None] = lambda *a: None):
        self.translator, self.config, self.on_batch = translator, config, on_batch
        self.pending: deque[_Segment] = deque()
        self.cond = threading.Condition()
        self.stopping = False
        self.free_since = 0.0  # when the runner finished its last batch (time.monotonic())
        self.thread = threading.Thread(target=self._run, name="seqtool-batcher", daemon=True)
        self.thread.start()

    @property
    def depth(self) -> int:
        return len(self.pending)

    def submit(self, texts: Sequence[str], options: SearchOptions, loop: asyncio.AbstractEventLoop,
               prefixes: Optional[Sequence[str]] = None, constraints: Optional[Sequence[list]] = None) -> _Request:
        """Queue one request's segments (empty ones are answered at once), with each one's target
        prefix and constraint items (terms.py) if given; ResourceError when the queue is full."""
        ids = self.translator.encode(0, list(texts)) if texts else []
        prefix_ids = self.translator.encode(0, list(prefixes), "target prefix of segment") if prefixes else [[] for _ in ids]
        groups = [self.translator.constraint_ids(c) for c in constraints] if constraints else [[] for _ in ids]
        request = _Request(loop, loop.create_future(), [None] * len(texts), 0)
        now = time.monotonic()
        segments = [_Segment(request, k, t, i, options, now, p, g)
                    for k, (t, i, p, g) in enumerate(zip(texts, ids, prefix_ids, groups)) if i]
        for k, i in enumerate(ids):
            if not i:  # an empty or whitespace-only segment keeps its place: an empty translation
                request.results[k] = ([], [], None)
        request.remaining = len(segments)
        if not segments:
            request.done.set_result(request.results)
            return request
        with self.cond:
            if self.stopping:
                raise ResourceError("the server is shutting down")
            if len(self.pending) + len(segments) > self.config.queue_limit:
                raise ResourceError(f"the queue is full ({len(self.pending)} segments waiting, --queue-limit "
                                    f"{self.config.queue_limit}); retry in a moment")
            self.pending.extend(segments)
            self.cond.notify()
        return request

    def cancel(self, request: _Request) -> None:
        """A request that timed out or whose client went away: its pending segments are dropped."""
        with self.cond:
            request.cancelled = True
            self.pending = deque(s for s in self.pending if s.request is not request)

    def stop(self) -> None:
        """Decode what is queued, then end the runner."""
        with self.cond:
            self.stopping = True
            self.cond.notify()
        self.thread.join()

    def _take(self) -> list[_Segment]:
        """Under the lock: the oldest segment's options, and pending segments with them, oldest
        first, up to the token budget (always at least one)."""
        options = self.pending[0].options
        batch, tokens, rest = [], 0, deque()
        while self.pending:
            s = self.pending.popleft()
            if s.options == options and (not batch or tokens + len(s.ids) <= self.config.max_batch_tokens):
                batch.append(s)
                tokens += len(s.ids)
            else:
                rest.append(s)
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
            sum(len(s.ids) for s in self.pending) >= self.config.max_batch_tokens

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

    def _decode(self, batch: list[_Segment]) -> None:
        t0 = time.monotonic()
        try:
            out = self.translator.translate_ids(0, [s.text for s in batch], [s.ids for s in batch], batch[0].options,
                                                keys=[s.index for s in batch], prefix_ids=[s.prefix for s in batch],
                                                constraint_ids=[s.constraints for s in batch])
            results: list[Any] = [(t.hypotheses, t.texts, t.alignments) for t in out]
        except Exception as error:  # every request of the batch gets the error; the server goes on
            log.error(f"decoding a batch of {len(batch)} segments failed: {type(error).__name__}: {error}")
            results = [error] * len(batch)
        self.on_batch(len(batch), sum(len(r[0][0].tokens) + 1 for r in results if not isinstance(r, Exception) and r[0]),
                      time.monotonic() - t0)
        for s, r in zip(batch, results):
            if not s.request.cancelled:
                s.request.loop.call_soon_threadsafe(_deliver, s, r)


def _deliver(segment: _Segment, result: Any) -> None:
    """On the event loop: one segment's result into its request."""
    request = segment.request
    if request.done.done():
        return
    if isinstance(result, Exception):
        request.done.set_exception(result)
        return
    request.results[segment.index] = result
    request.remaining -= 1
    if request.remaining == 0:
        request.done.set_result(request.results)
