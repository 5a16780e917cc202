"""`seqtool serve --workers N`: N server processes on one port, one model each.

One process decodes with one model at a time; past what its threads give, throughput scales by
running more processes (and memory by one model each; the server itself never shares a model
between processes). The kernel balances connections among them: every worker listens on the same
address with SO_REUSEPORT (nginx's `reuseport`, gunicorn's `--reuse-port`), so no proxy is needed on
one machine; across machines, any HTTP load balancer in front of several `seqtool serve` works the
same way, as every worker answers /health on its own.

The parent binds the address first (resolving port 0 once, holding the port while the workers
start), then starts each worker as `python -c ...` with its settings in the environment. It does
not serve. SIGTERM or Ctrl-C reaches every worker, which drain as a single server does; when a
worker ends on its own (killed, out of memory, its model unloadable) the parent stops the others
and exits 1 naming it. Workers are killed by the kernel if the parent dies (interrupts.die_with_parent):
no worker outlives it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence, Union

from . import log
from .config import DecodeConfig, ServeConfig
from .errors import ResourceError
from .interrupts import die_with_parent

ENV = "SEQTOOL_SERVE_WORKER"


def listener(host: str, port: int, listen: bool) -> socket.socket:
    """A TCP socket bound to (host, port) with SO_REUSEPORT, listening or only holding the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise ResourceError(f"--host {host} --port {port}: cannot listen there ({error.strerror})") from None
    if listen:
        sock.listen(2048)
        sock.set_inheritable(False)
    return sock


def default_threads(workers: int) -> int:
    """Each worker's share of the CPUs this process may use (at least one)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cpus // workers)


def run(checkpoints: Union[Path, Sequence[Path]], decode: DecodeConfig, config: ServeConfig) -> None:
    """Start config.workers workers and supervise them until SIGTERM/Ctrl-C or one ends on its own."""
    if not hasattr(socket, "SO_REUSEPORT"):
        raise ResourceError("--workers needs SO_REUSEPORT (Linux, macOS, BSD); run one server per port behind a load balancer")
    held = listener(config.host, config.port, listen=False)
    port = held.getsockname()[1]
    if decode.threads == 0 and decode.device in ("auto", "cpu"):
        decode = decode.replace(threads=default_threads(config.workers))
    paths = [str(p) for p in ([checkpoints] if isinstance(checkpoints, (str, Path)) else checkpoints)]
    setup = json.dumps({"parent": os.getpid(), "checkpoints": paths, "decode": decode.to_dict(),
                        "serve": config.replace(port=port, workers=1).to_dict()})
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
            procs.append(subprocess.Popen([sys.executable, "-c", "from seqtool.servepool import worker; worker()"],
                                          env={**os.environ, ENV: setup}, stdin=subprocess.DEVNULL))
        log.info(f"{config.workers} workers (pids {', '.join(str(p.pid) for p in procs)}) on http://{config.host}:{port}, "
                 f"{decode.threads or 'all'} thread{'' if decode.threads == 1 else 's'} each")
        failed = _supervise(procs, stopping)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        held.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    if failed is not None:
        index, proc = failed
        raise ResourceError(f"worker {index + 1} (pid {proc.pid}) {_how_it_ended(proc.returncode)}; the other workers were stopped")
    if stopping["signal"] == signal.SIGTERM:  # end as a process stopped by SIGTERM, like a single server
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


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
    """A worker's entry point: its settings from the environment, the shared port, one server."""
    setup = json.loads(os.environ.pop(ENV))
    die_with_parent(setup["parent"])  # whatever ends the parent ends the workers
    from .exits import handles_user_errors
    from .serve import serve

    config = ServeConfig.from_dict(setup["serve"])
    decode = DecodeConfig.from_dict(setup["decode"])
    checkpoints = [Path(p) for p in setup["checkpoints"]]

    @handles_user_errors
    def main() -> None:
        sock = listener(config.host, config.port, listen=True)
        serve(checkpoints[0] if len(checkpoints) == 1 else checkpoints, decode, config, sockets=[sock])

    main()
