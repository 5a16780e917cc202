"""`seqtool serve --workers N`: N server processes on one port, one model each.

One process decodes with one model at a time; past what its threads give, throughput scales by
running more processes (and memory by one model each; the server itself never shares a model
between processes). The parent binds and listens on the address (exclusively: a second server on
the port is refused, as a single server is) and hands that one socket to every worker, which all
accept from it (gunicorn's and uvicorn's own pre-fork model); across machines, any HTTP load
balancer in front of several `seqtool serve` works the same way, as every worker answers /health
on its own.

Workers start as `python -c ...` with their settings in the environment. The parent does not
serve. SIGTERM or Ctrl-C reaches every worker, which drain as a single server does. When a worker
ends on its own, the parent stops the others and exits 1: with the worker's own one-line reason
when it could not load the model (a missing or damaged checkpoint), else naming how it ended
(killed, out of memory). Workers are killed by the kernel if the parent dies
(interrupts.die_with_parent): no worker outlives it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence, Union

from .. import log
from ..config import DecodeConfig, SearchOptions, ServeConfig
from ..errors import ResourceError, SeqtoolError
from ..interrupts import die_with_parent
from .server import check, listener, serve

ENV = "SEQTOOL_SERVE_WORKER"


def default_threads(workers: int) -> int:
    """Each worker's share of the CPUs this process may use (at least one)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cpus // workers)


def run(checkpoints: Union[Path, Sequence[Path]], decode: DecodeConfig, options: SearchOptions, config: ServeConfig) -> None:
    """Start config.workers workers and supervise them until SIGTERM/Ctrl-C or one ends on its own (one
    worker: this process serves, server.serve)."""
    if config.workers == 1:
        return serve(checkpoints, decode, options, config)
    check(options, config)
    sock = listener(config.host, config.port)
    port = sock.getsockname()[1]
    if decode.threads == 0 and decode.device in ("auto", "cpu"):
        decode = decode.replace(threads=default_threads(config.workers))
    paths = [str(p) for p in ([checkpoints] if isinstance(checkpoints, (str, Path)) else checkpoints)]
    reasons_read, reasons_write = os.pipe()  # a worker that cannot start writes its one line here
    setup = json.dumps({"parent": os.getpid(), "checkpoints": paths, "decode": decode.to_dict(), "options": options.to_dict(),
                        "socket": sock.fileno(),
                        "reasons": reasons_write, "serve": config.replace(port=port, workers=1).to_dict()})
    stopping = {"signal": None}

    def stop(signum, frame):
        stopping["signal"] = signum
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    procs: list[subprocess.Popen] = []
    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for _ in range(config.workers):
            procs.append(subprocess.Popen([sys.executable, "-c", "from seqtool.serving.pool import worker; worker()"],
                                          env={**os.environ, ENV: setup}, stdin=subprocess.DEVNULL,
                                          pass_fds=(sock.fileno(), reasons_write)))
        os.close(reasons_write)
        log.info(f"{config.workers} workers (pids {', '.join(str(p.pid) for p in procs)}) on http://{config.host}:{port}, "
                 f"{decode.threads or 'all'} thread{'' if decode.threads == 1 else 's'} each")
        failed = _supervise(procs, stopping)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        sock.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    reasons = _read_all(reasons_read)
    if failed is not None:
        index, proc = failed
        if reasons:  # the worker's own line: the checkpoint is missing, damaged, ...
            raise SeqtoolError(reasons[0])
        raise ResourceError(f"worker {index + 1} (pid {proc.pid}) {_how_it_ended(proc.returncode)}; the other workers were stopped")
    if stopping["signal"] == signal.SIGTERM:  # end as a process stopped by SIGTERM, like a single server
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def _read_all(fd: int) -> list[str]:
    with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as pipe:
        return [line for line in pipe.read().splitlines() if line]


def _supervise(procs: list[subprocess.Popen], stopping: dict) -> Optional[tuple[int, subprocess.Popen]]:
    """Wait for every worker; the first that ended on its own (not after our SIGTERM), if any."""
    while True:
        for i, p in enumerate(procs):
            if p.poll() is not None and stopping["signal"] is None:
                stopping["signal"] = "failure"
                for other in procs:
                    if other.poll() is None:
                        other.send_signal(signal.SIGTERM)
                for other in procs:
                    other.wait()
                return i, p
        if all(p.poll() is not None for p in procs):
            return None
        time.sleep(0.1)


def _how_it_ended(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def worker() -> None:
    """A worker's entry point: its settings from the environment, the parent's socket, one server.
    A user's error (the model cannot be loaded) goes to the parent as one line, which it prints."""
    import socket

    setup = json.loads(os.environ.pop(ENV))
    die_with_parent(setup["parent"])  # whatever ends the parent ends the workers
    from .server import serve

    config = ServeConfig.from_dict(setup["serve"])
    decode = DecodeConfig.from_dict(setup["decode"])
    options = SearchOptions.from_dict(setup["options"])
    checkpoints = [Path(p) for p in setup["checkpoints"]]
    sock = socket.socket(fileno=setup["socket"])
    try:
        serve(checkpoints[0] if len(checkpoints) == 1 else checkpoints, decode, options, config, sock=sock)
    except SeqtoolError as error:
        with os.fdopen(setup["reasons"], "w", encoding="utf-8") as reasons:
            reasons.write(str(error).replace("\n", " ") + "\n")
        raise SystemExit(1)
