"""A `seqtool serve` process for the tests: started on a free port, ready when /health says so."""

import signal
import socket
import subprocess
import sys
import time

import httpx

LINES = [" ".join("abcdefgh"[(i * j + i) % 8] for j in range(1 + i % 9)) for i in range(96)]
# after its drain uvicorn re-raises SIGTERM, so the process ends as one stopped by it (what process managers expect)
STOPPED = (0, -signal.SIGTERM)
FP32 = ["--device", "cpu", "--precision", "fp32", "--threads", "2", "--max-len-a", "0", "--max-len-b", "8"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, checkpoint, *options: str, port: int = 0, descriptors: int = 0):
        """descriptors: the server's descriptor limit (soft and hard), where a test needs a low one."""
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"

        def limit():
            import resource

            resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors, descriptors))
        self.proc = subprocess.Popen([sys.executable, "-m", "seqtool", "serve", "-c", str(checkpoint), "--port", str(self.port),
                                      *FP32, *options], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     preexec_fn=limit if descriptors else None)
        deadline = time.time() + 120
        while time.time() < deadline:
            assert self.proc.poll() is None, self.proc.communicate()[1]
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError("the server did not become ready in 120 s")

    def stop(self) -> str:
        """SIGTERM, as a process manager stops it; its stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=60)
        return err


def offline_translations(checkpoint) -> list[list[str]]:
    """What `seqtool translate` gives for LINES (beam 5, n-best 2), line by line."""
    out = subprocess.run([sys.executable, "-m", "seqtool", "translate", "-c", str(checkpoint), *FP32, "--nbest", "2"],
                         input="\n".join(LINES) + "\n", capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = [line.split("\t") for line in out.stdout.splitlines()]
    return [[rows[2 * i][2], rows[2 * i + 1][2]] for i in range(len(LINES))]


def translated(response) -> dict:
    """A response's JSON without its warnings (an untrained model's outputs run to their length cap,
    and the server says so: test_text_policy tests that)."""
    return {k: v for k, v in response.json().items() if k != "warnings"}
