"""What a connection may cost before its request reaches the app: uvicorn's httptools protocol with
bounds on the request head, timeouts for slow clients, and a cap on open connections.

uvicorn's own protocol reads a request head of any size (four clients sending 200 MB headers took a
server from 548 MB to 2,163 MB), keeps a connection that never sends a byte, or sends its head or
body a byte at a time, open for ever (240 such sockets exhaust a 256-descriptor limit, and every new
client is reset). Here, per connection:

- the head (request line and headers) is at most MAX_HEAD_BYTES with at most MAX_HEADERS fields:
  431 beyond, counted as it arrives (httptools would buffer a field of any length);
- a head must arrive within --header-timeout of the connection opening (or of the previous
  response, or of its first byte), a body within --body-timeout of its head: 408 and the
  connection closed otherwise; an idle kept-alive connection closes after --keep-alive-timeout
  (uvicorn's own timer);
- at most --max-connections are open (and never more than the descriptor limit leaves room for):
  a new connection past the cap first closes the longest-idle kept-alive one, else the one whose
  request has been arriving longest (over a second: a good client sends its head in one go), else
  is answered 503 and closed. Good clients keep being answered while bad ones hold sockets.

The model's work is bounded elsewhere (--request-timeout, endpoints.py).
"""

from __future__ import annotations

import json
import resource
import time
from typing import Optional

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # no httptools: server.protocol() takes only MAX_HEAD_BYTES from here (h11's bound)
    HttpToolsProtocol = object  # type: ignore[misc,assignment]

from .. import log

MAX_HEAD_BYTES = 64 * 1024  # the request line and headers together (nginx: 4 x 8 KiB; h11: 16 KiB)
MAX_HEADERS = 100  # header fields per request (Go's net/http and Node's limits are of this order)
SLOW_SECONDS = 1.0  # a request arriving for longer than this may be closed to make room for a new connection
RESERVED_DESCRIPTORS = 64  # descriptors kept for the model, its files and the log


def connection_cap(wanted: int) -> int:
    """--max-connections within the descriptor limit (raised to its hard limit first): never so many
    sockets that accept() or the model's own files fail."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    room = max(8, soft - RESERVED_DESCRIPTORS)
    if wanted > room:
        log.warn(f"--max-connections {wanted}: the descriptor limit ({soft}) leaves room for {room}; at most {room} are open")
    return min(wanted, room)


class Limits:
    """The bounds GuardedProtocol enforces (from ServeConfig); one per server."""

    def __init__(self, header_timeout: float, body_timeout: float, max_connections: int):
        self.header_timeout, self.body_timeout = header_timeout, body_timeout
        self.max_connections = connection_cap(max_connections)
        self.said: dict[str, float] = {}

    def note(self, what: str) -> None:
        """A refused client is logged once a minute per kind (a flood does not flood the log)."""
        now = time.monotonic()
        if now - self.said.get(what, -60.0) >= 60.0:
            self.said[what] = now
            log.warn(f"{what} (said once a minute)")


def guarded(limits: Limits) -> type:
    """uvicorn's httptools protocol class bounded by `limits` (uvicorn.Config(http=...))."""

    class Guarded(GuardedProtocol):
        LIMITS = limits
    return Guarded


class GuardedProtocol(HttpToolsProtocol):
    LIMITS: Limits

    # -- state: "idle" (between requests), "head" (a head arriving), "body", "app" (the app has it) ---------
    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.state, self.since, self.refused = "idle", time.monotonic(), False
        self.raw = self.head_bytes = self.fields = 0  # bytes received of the head, bytes and fields parsed of it
        self.timer = None
        if len(self.server_state.connections) >= self.LIMITS.max_connections and not self._make_room():
            super().connection_made(transport)
            self._refuse(503, "Service Unavailable", "too many open connections (--max-connections); retry in a moment",
                         "a connection was refused: --max-connections are open")
            return
        super().connection_made(transport)
        self._arm(self.LIMITS.header_timeout, "no request head")

    def _make_room(self) -> bool:
        """Close one connection for a new one: the longest idle, else the slowest arriving request."""
        now = time.monotonic()
        others = [c for c in self.server_state.connections if isinstance(c, GuardedProtocol) and not c.transport.is_closing()]
        idle = [c for c in others if c.state == "idle"]
        slow = [c for c in others if c.state in ("head", "body") and now - c.since > SLOW_SECONDS]
        for group in (idle, slow):
            if group:
                victim = min(group, key=lambda c: c.since)
                victim._close()
                return True
        return False

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self.timer = self.loop.call_later(seconds, self._timed_out, what)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _timed_out(self, what: str) -> None:
        self.timer = None
        if self.state == "idle" and self.cycle is None:
            self._close()  # a connection that never sent a byte: nobody to answer
            return
        option = "--body-timeout" if self.state == "body" else "--header-timeout"
        seconds = self.LIMITS.body_timeout if self.state == "body" else self.LIMITS.header_timeout
        self._refuse(408, "Request Timeout", f"{what} within {seconds:g} s ({option})", f"a slow client was closed: {what} in time")

    def _close(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self.transport.close()

    def _refuse(self, status: int, reason: str, message: str, logged: str) -> None:
        """Answer `status` with the server's error shape and close the connection."""
        self.refused = True
        self._disarm()
        self.LIMITS.note(logged)
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete and self.state == "app":
            self.transport.close()  # the app is answering: a second response cannot be written
            return
        body = json.dumps({"error": message}).encode()
        self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
                             % (status, reason.encode(), len(body), body))
        self.transport.close()

    # -- bytes in ----------------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        before = self.state
        super().data_received(data)
        if self.refused or self.transport.is_closing():
            return
        if before in ("idle", "head") and self.state == "head":  # the whole chunk was head (one begun after a body in
            self.raw += len(data)                                  # the same chunk: its start is not counted)
        if self.state == "head" and (max(self.raw, self.head_bytes) > MAX_HEAD_BYTES or self.fields > MAX_HEADERS):
            self._too_large()

    def _too_large(self) -> None:
        self._refuse(431, "Request Header Fields Too Large",
                     f"the request head is over {MAX_HEAD_BYTES:,} bytes or {MAX_HEADERS} fields; this server takes no more",
                     "a request head over the size limit was refused")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.state, self.since = "head", time.monotonic()
        self.raw = self.head_bytes = self.fields = 0
        self._arm(self.LIMITS.header_timeout, "no complete request head")

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self.head_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields += 1
        self.head_bytes += len(name) + len(value) + 4
        if self.fields <= MAX_HEADERS:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self.head_bytes > MAX_HEAD_BYTES or self.fields > MAX_HEADERS:
            self.state = "refused"
            self._too_large()
            return
        self.state, self.since = "body", time.monotonic()
        self._arm(self.LIMITS.body_timeout, "no complete request body")
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self.refused:
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self.refused:
            return
        self.state = "app"
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self.state, self.since = "idle", time.monotonic()
        self._disarm()  # uvicorn arms its keep-alive timer (--keep-alive-timeout)
        super().on_response_complete()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._disarm()
        super().connection_lost(exc)
