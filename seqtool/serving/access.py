"""Who may ask, how often, and how much: API keys, the per-minute request limit, the body size limit.

- API keys (`--api-keys FILE`, LibreTranslate's): one key per line, blank lines and # comments
  skipped; a translation request must carry one, as `api_key` in its body (LibreTranslate's
  field) or as `Authorization: Bearer KEY`; none or a wrong one is 403.
- `--req-limit N`: requests per minute per key (per client address without keys), counted over
  the last 60 s (a sliding window, not a fixed minute: no burst of 2N at a minute's edge); beyond,
  429 with Retry-After saying when the oldest counted request leaves the window.
- The body limit: a body over `body_limit(max_chars)` bytes is refused with 413 as soon as its
  Content-Length (or, chunked, its bytes so far) says so, before it is read, parsed or matched.
"""

from __future__ import annotations

import hmac
import json
import math
import threading
import time
from collections import deque
from pathlib import Path
from typing import Optional

from ..errors import InputError
from .schemas import BadRequest
from ..textio import read_lines, strip_line_end


def body_limit(max_chars: int) -> int:
    """The most bytes a request body may have: every character JSON-escaped (\\uXXXX, 6 bytes) would
    already be past --max-chars at 8 bytes each; 64 KiB more for the fields around them."""
    return 8 * max_chars + 65536


def read_keys(path: Path) -> list[str]:
    """The keys of an --api-keys file; InputError naming it when it has none."""
    keys = []
    for line in read_lines(Path(path), "strict"):
        line = strip_line_end(line).lstrip("\ufeff").strip()
        if line and not line.startswith("#"):
            keys.append(line)
    if not keys:
        raise InputError(f"{path}: no API key in it (one per line; # starts a comment)")
    return keys


class Keys:
    def __init__(self, keys: list[str]):
        self.keys = [k.encode() for k in keys]

    def allows(self, key: Optional[str]) -> bool:
        """Compared in constant time per key, so timing does not tell how much of a key was right."""
        if not key:
            return False
        given = key.encode()
        return any(hmac.compare_digest(given, k) for k in self.keys)


def bearer(authorization: Optional[str]) -> Optional[str]:
    if authorization and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return None


class RateLimit:
    """At most `per_minute` requests per client in any 60 s."""

    WINDOW = 60.0

    def __init__(self, per_minute: int):
        self.per_minute = per_minute
        self.seen: dict[str, deque] = {}
        self.lock = threading.Lock()
        self.swept = time.monotonic()

    def admit(self, client: str, now: Optional[float] = None) -> Optional[int]:
        """None (and the request is counted) or the seconds to wait before the next one may pass."""
        now = time.monotonic() if now is None else now
        with self.lock:
            if now - self.swept > self.WINDOW:  # clients quiet for a minute are forgotten
                self.seen = {c: q for c, q in self.seen.items() if q and now - q[-1] < self.WINDOW}
                self.swept = now
            times = self.seen.setdefault(client, deque())
            while times and now - times[0] >= self.WINDOW:
                times.popleft()
            if len(times) >= self.per_minute:
                return max(1, math.ceil(self.WINDOW - (now - times[0])))
            times.append(now)
            return None


DRAIN = 64 * 2 ** 20  # the most of a refused body read (and dropped) so that its client can read the 413


def limit_body(app, limit: int):
    """ASGI middleware: 413 for a request whose Content-Length is over `limit` bytes, before anything
    parses it (a chunked body is counted as it is read: read_body). The body is read and dropped
    first, up to DRAIN bytes, so that the client, still sending, gets the answer rather than a reset
    connection; past DRAIN the connection is closed."""
    async def limited(scope, receive, send):
        if scope["type"] == "http":
            length = dict(scope.get("headers") or ()).get(b"content-length")
            if length is not None and length.isdigit() and int(length) > limit:
                if int(length) <= DRAIN:
                    while (await receive()).get("more_body"):
                        pass
                body = json.dumps({"error": too_large(limit)}).encode()
                await send({"type": "http.response.start", "status": 413,
                            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                        (b"connection", b"close")]})
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)
    return limited


def too_large(limit: int) -> str:
    return f"the request body is over {limit:,} bytes, more than this server's --max-chars allows"


async def read_body(request, limit: int) -> Optional[bytes]:
    """The body, or None when it passes `limit` bytes (a chunked body has no Content-Length); the
    rest of such a body is read and dropped, up to DRAIN bytes, so its client can read the answer."""
    from starlette.requests import ClientDisconnect

    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > DRAIN:
                break
            if size <= limit:
                chunks.append(chunk)
    except ClientDisconnect:  # gone before its body was read (or closed by --body-timeout): nobody to answer
        raise BadRequest(499, "client closed the request") from None
    return b"".join(chunks) if size <= limit else None
