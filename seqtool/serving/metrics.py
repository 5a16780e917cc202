"""The server's Prometheus metrics (GET /metrics), on a registry of its own, and the ASGI wrapper that
counts translation requests by status and times them."""

from __future__ import annotations

import time
from typing import Callable

BATCH_SECONDS_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.125, 0.15, 0.175, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5,
                         0.6, 0.8, 1, 1.5, 2, 3, 5, 10, 30)  # /metrics' batch times: fine enough for a median (bench/serve.py)
COUNTED = ("/translate", "/v1/translate")


class Metrics:
    def __init__(self, queue_depth: Callable[[], int]):
        import prometheus_client as prom

        self.prom = prom
        self.registry = r = prom.CollectorRegistry()
        self.requests = prom.Counter("seqtool_requests", "HTTP requests answered", ["endpoint", "status"], registry=r)
        self.latency = prom.Histogram("seqtool_request_seconds", "Time to answer a translation request", ["endpoint"], registry=r,
                                      buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
        self.batch_sizes = prom.Histogram("seqtool_batch_segments", "Segments decoded per batch", registry=r,
                                          buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
        self.target_tokens = prom.Counter("seqtool_target_tokens", "Target tokens decoded (best hypotheses, with EOS)", registry=r)
        self.decode_seconds = prom.Counter("seqtool_decode_seconds", "Seconds the runner spent decoding", registry=r)
        self.batch_seconds = prom.Histogram("seqtool_batch_seconds", "Seconds to decode one batch", registry=r,
                                            buckets=BATCH_SECONDS_BUCKETS)
        prom.Gauge("seqtool_queue_segments", "Segments waiting to be decoded", registry=r).set_function(queue_depth)

    def on_batch(self, segments: int, tokens: int, seconds: float) -> None:
        """The batcher's report of one decoded batch."""
        self.batch_sizes.observe(segments)
        self.target_tokens.inc(tokens)
        self.decode_seconds.inc(seconds)
        self.batch_seconds.observe(seconds)

    def page(self) -> tuple[bytes, str]:
        return self.prom.generate_latest(self.registry), self.prom.CONTENT_TYPE_LATEST

    def count(self, inner):
        """Requests by status and their latency, as plain ASGI: Starlette's BaseHTTPMiddleware would
        hide a client's disconnect from the endpoint (request.is_disconnected)."""
        async def counted(scope, receive, send):
            path = scope.get("path", "")
            if scope["type"] != "http" or path not in COUNTED:
                return await inner(scope, receive, send)
            t0, status = time.monotonic(), [500]

            async def send_status(message):
                if message["type"] == "http.response.start":
                    status[0] = message["status"]
                await send(message)
            try:
                await inner(scope, receive, send_status)
            finally:
                self.requests.labels(path, str(status[0])).inc()
                self.latency.labels(path).observe(time.monotonic() - t0)
        return counted
