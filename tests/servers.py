"""A `seqtool serve` process for the tests: on the port it bound itself (--port 0), ready when /health says so."""

import re
import signal
import subprocess
import sys
import threading
import time

import httpx

LINES = [" ".join("abcdefgh"[(i * j + i) % 8] for j in range(1 + i % 9)) for i in range(96)]
# after its drain uvicorn re-raises SIGTERM, so the process ends as one stopped by it (what process managers expect)
STOPPED = (0, -signal.SIGTERM)
FP32 = ["--device", "cpu", "--precision", "fp32", "--threads", "2", "--max-len-a", "0", "--max-len-b", "8"]


class Server:
    def __init__(self, checkpoint, *options: str, descriptors: int = 0):
        """`seqtool serve --port 0`: the port is the one the server bound and logged (none free_port() picked
        and another process could take first), ready when /health says so. descriptors: the server's
        descriptor limit (soft and hard), where a test needs a low one. stderr is read as it comes."""
        def limit():
            import resource

            resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors, descriptors))
        self.proc = subprocess.Popen([sys.executable, "-m", "seqtool", "serve", "-c", str(checkpoint), "--port", "0",
                                      *FP32, *options], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     preexec_fn=limit if descriptors else None)
        self.port, self.lines, bound = 0, [], threading.Event()

        def read():
            for line in self.proc.stderr:
                self.lines.append(line)
                found = re.search(r" on http://[\w.]+:(\d+)", line)
                if found and not self.port:
                    self.port = int(found.group(1))
                    bound.set()
            bound.set()  # (ended without saying: the process is gone)
        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        assert bound.wait(120) and self.port, f"the server said no port in 120 s: {self.stderr()}"
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 120
        while time.time() < deadline:
            assert self.proc.poll() is None, self.stderr()
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError("the server did not become ready in 120 s")

    def stderr(self) -> str:
        """What the server wrote on stderr so far (all of it once it has ended)."""
        if self.proc.poll() is not None:
            self.reader.join(60)
        return "".join(self.lines)

    def wait(self, timeout: float = 60) -> str:
        """Its end (without a signal from here); its stderr."""
        self.proc.wait(timeout)
        return self.stderr()

    def stop(self) -> str:
        """SIGTERM, as a process manager stops it; its stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait()


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
