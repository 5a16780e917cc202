"""`seqtool serve` with one process: bind the address, run uvicorn on it until SIGTERM/Ctrl-C, and
end as `translate` does when the model cannot be loaded (one line, exit 1).

The address is bound before anything else, so a busy port is the one line printed (no "ready"
after it), and `--port 0` logs the port the kernel gave. The socket is exclusive (no
SO_REUSEPORT): a second server on a busy port is refused, whether it has workers or not; a
server's own workers share its one socket (pool.py).
"""

from __future__ import annotations

import importlib.util
import socket
import sys
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from .. import log
from ..config import DecodeConfig, SearchOptions, ServeConfig
from ..errors import ConfigError, ResourceError
from ..fields import split
from .app import create_app, require_fastapi


def listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port), this process's alone; ResourceError naming the
    address when it is taken or cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT only; a listening socket still refuses
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as error:
        sock.close()
        raise ResourceError(f"--host {host} --port {port}: cannot listen there ({error.strerror})") from None
    return sock


# the defaults a server's caps bound: (SearchOptions field, its option, ServeConfig's cap, the cap's option)
CAPPED = (("beam", "--beam", "max_beam", "--max-beam"), ("nbest", "--nbest", "max_nbest", "--max-nbest"),
          ("max_len_b", "--max-len-b", "max_len", "--max-len"))


def check(options: SearchOptions, config: ServeConfig) -> None:
    """The server's own defaults within its caps (before anything starts)."""
    for field, option, cap_field, cap_option in CAPPED:
        value, cap = getattr(options, field), getattr(config, cap_field)
        if value > cap:
            raise ConfigError(f"{option} {value} is over {cap_option} {cap}: the server's defaults must be within its caps")


def within_caps(recorded: dict, config: ServeConfig) -> dict:
    """A checkpoint's recorded decoding defaults (checkpoint.recorded_decoding) lowered to the server's
    caps, with a warning for each: the checkpoint's default is a suggestion (an imported model's
    num_beams), where a --beam given on the command line over --max-beam is refused (check)."""
    out = dict(recorded)
    for field, _, cap_field, cap_option in CAPPED:
        value, cap = out.get(field), getattr(config, cap_field)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > cap:
            log.warn(f"the checkpoint's default {field} {value} is over {cap_option} {cap}; serving with {field} {cap}")
            out[field] = cap
    return out


def protocol(config: ServeConfig) -> dict:
    """uvicorn.Config's protocol settings: httptools' parser with connections.py's bounds (head
    size, slow clients, open connections); without httptools, h11's head size bound alone."""
    if importlib.util.find_spec("httptools") is None:
        from .connections import MAX_HEAD_BYTES

        log.warn("httptools not installed: slow clients are not timed out and connections are not capped "
                 "(pip install 'seqtool[serve]' installs it)")
        return {"http": "h11", "h11_max_incomplete_event_size": MAX_HEAD_BYTES}
    from .connections import Limits, guarded

    return {"http": guarded(Limits(config.header_timeout, config.body_timeout, config.max_connections))}


def settings_given(checkpoints: list[Path], given: dict[str, Any]) -> tuple:
    """`seqtool serve`'s (checkpoints, DecodeConfig, SearchOptions, ServeConfig) from the settings given
    (field name -> value, options.py): the server's over ServeConfig's defaults, the model's over the
    checkpoint's recorded decoding defaults (a student's beam 1; lowered to the caps: only a --beam
    given over --max-beam is refused)."""
    from ..translate import recorded_defaults, settings

    mine, rest = split(given, ServeConfig)
    config = ServeConfig(**mine)
    decode, options = settings(recorded=within_caps(recorded_defaults(checkpoints), config), **rest)
    return checkpoints[0] if len(checkpoints) == 1 else checkpoints, decode, options, config


def serve(checkpoints: Union[Path, Sequence[Path]], decode: DecodeConfig, options: SearchOptions, config: ServeConfig,
          sock: Optional[socket.socket] = None) -> None:
    """Run the server until SIGTERM/Ctrl-C (then drain and stop). sock: a listening socket to serve on
    instead of binding host:port (a worker of pool.py). Raises the loading error when the model
    cannot be loaded, once the server has stopped."""
    require_fastapi()
    check(options, config)
    import uvicorn

    if sock is None:
        sock = listener(config.host, config.port)
    config = config.replace(port=sock.getsockname()[1])
    try:
        app = create_app(checkpoints, decode, options, config)
        service = app.state.service

        class Server(uvicorn.Server):
            def handle_exit(self, sig, frame):  # SIGTERM, Ctrl-C: what is queued is decoded now, not after --max-wait-ms
                if service.batcher is not None:
                    service.batcher.drain()
                super().handle_exit(sig, frame)

        server = Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=int(config.request_timeout) + 5,
                                       timeout_keep_alive=config.keep_alive_timeout, **protocol(config)))

        def stop() -> None:
            server.should_exit = True
        service.on_failure = stop
        missing = [name for name in ("httptools", "uvloop") if importlib.util.find_spec(name) is None]
        if missing:  # uvicorn falls back to its pure-Python parser / asyncio's loop
            log.info(f"{' and '.join(missing)} not installed: uvicorn runs its pure-Python fallbacks, which take more "
                     f"CPU time per request (pip install 'seqtool[serve]' installs them)")
        # a request's text work runs in threads (endpoints.Service.work): a thread that computes keeps the GIL for
        # the switch interval each time the event loop's thread asks for it back, and a small request asks dozens
        # of times (every socket call, every hop to the batcher); at 5 ms, two heavy requests starved one of
        # "a b c" for 5.1 s in CI (the convoy effect). 1 ms keeps it answered beside them.
        sys.setswitchinterval(0.001)
        server.run(sockets=[sock])
    finally:
        sock.close()
    if service.failed is not None:  # a SeqtoolError is the user's one line (exit 1); anything else a bug (exit 2)
        raise service.failed
