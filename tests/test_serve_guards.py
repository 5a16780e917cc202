"""What a connection may cost (serving/connections.py) and what a request's text work may cost
(--request-timeout, endpoints.py), issue 42: a real server process on a real port, raw sockets for
the hostile clients, httpx for the good one, which keeps being answered throughout."""

import socket
import threading
import time

import httpx
import pytest

from servers import STOPPED, Server

pytestmark = pytest.mark.system

HOLA = {"q": "a b c", "source": "auto", "target": "tgt"}


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    s = Server(tiny_checkpoint, "--header-timeout", "1.5", "--body-timeout", "1.5", "--keep-alive-timeout", "1",
               "--max-connections", "24", "--request-timeout", "5", "--max-chars", "6000000")
    yield s
    err = s.stop()
    assert s.proc.returncode in STOPPED, err
    assert "Traceback" not in err, err


def good(server, timeout=10.0) -> float:
    """A well-behaved client's request: answered 200; its latency."""
    start = time.monotonic()
    r = httpx.post(f"{server.url}/translate", json=HOLA, timeout=timeout)
    assert r.status_code == 200, r.text
    return time.monotonic() - start


def raw(server) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return s


def answer(s: socket.socket) -> bytes:
    """What the server sent before closing (b"" if it closed without a word)."""
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def test_a_request_head_over_the_size_or_field_cap_is_431(server):
    for head in (b"X-Big: " + b"a" * 70_000 + b"\r\n",  # one field of 70 KB
                 b"".join(b"X-%d: v\r\n" % k for k in range(150))):  # 150 small fields
        s = raw(server)
        s.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\n" + head)
        got = answer(s)
        s.close()
        assert got.startswith(b"HTTP/1.1 431 "), got[:200]
        assert b"\"error\"" in got  # the server's one error shape
    good(server)


def test_huge_headers_from_many_clients_leave_the_server_s_memory_alone(server):
    before = rss_mb(server.proc.pid)

    def flood():
        s = raw(server)
        try:
            s.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nX-Big: ")
            for _ in range(50):  # 50 MB each, as fast as the server takes it
                s.sendall(b"a" * 1_000_000)
        except OSError:  # the server refused and closed: what it should do
            pass
        finally:
            s.close()
    clients = [threading.Thread(target=flood) for _ in range(4)]
    for c in clients:
        c.start()
    for c in clients:
        c.join(60)
    assert rss_mb(server.proc.pid) - before < 50, "200 MB of headers grew the server"
    good(server)


def test_slow_idle_and_stalled_clients_time_out_with_408(server):
    idle, head, body = raw(server), raw(server), raw(server)
    head.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\n")  # ... and the rest of its head never comes
    body.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"q\":")
    start = time.monotonic()
    assert good(server) < 5  # answered while they wait
    assert answer(idle) == b""  # nothing sent, nothing to answer: closed
    got_head, got_body = answer(head), answer(body)
    assert time.monotonic() - start < 8
    assert got_head.startswith(b"HTTP/1.1 408 ") and b"--header-timeout" in got_head, got_head
    assert got_body.startswith(b"HTTP/1.1 408 ") and b"--body-timeout" in got_body, got_body
    # a kept-alive connection that goes quiet is closed after --keep-alive-timeout
    with httpx.Client(base_url=server.url, timeout=10) as client:
        assert client.post("/translate", json=HOLA).status_code == 200
        time.sleep(2)
        assert client.post("/translate", json=HOLA).status_code == 200  # (httpx reconnects: a closed keep-alive is normal)


def test_connections_past_the_cap_make_room_so_good_clients_are_answered(server):
    idle = [raw(server) for _ in range(30)]  # past --max-connections 24
    slow = []
    for _ in range(30):
        s = raw(server)
        s.sendall(b"GET /health HTTP/1.1\r\n")
        slow.append(s)
    time.sleep(1.2)  # (the slow ones are now "arriving for over a second")
    try:
        for _ in range(5):
            assert good(server) < 5
    finally:
        for s in idle + slow:
            s.close()


def test_a_descriptor_limit_is_never_reached_by_idle_sockets(tiny_checkpoint):
    s = Server(tiny_checkpoint, "--header-timeout", "30", descriptors=256)
    sockets = []
    try:
        for _ in range(300):  # more than the server has descriptors
            sockets.append(socket.create_connection(("127.0.0.1", s.port), timeout=10))
        time.sleep(0.5)
        for _ in range(3):
            assert good(s) < 5
    finally:
        for c in sockets:
            c.close()
        err = s.stop()
    assert s.proc.returncode in STOPPED, err
    assert "--max-connections 1000: the descriptor limit (256) leaves room for 192" in err, err


def test_text_work_stops_at_the_request_timeout_and_never_starves_a_small_request(server):
    page = "<html><body>" + "".join(f"<p>a b <b>c d</b> e{k % 7}.</p>\n" for k in range(150_000)) + "</body></html>"  # ~4.3 MB: ~12 s of work
    results = []

    def big():
        start = time.monotonic()
        r = httpx.post(f"{server.url}/translate", json={"q": page, "format": "html"}, timeout=60)
        results.append((r.status_code, time.monotonic() - start, r.text[:200]))
    clients = [threading.Thread(target=big) for _ in range(4)]
    for c in clients:
        c.start()
    time.sleep(0.5)
    latencies = [good(server) for _ in range(5)]
    for c in clients:
        c.join(60)
    assert [code for code, _, _ in results] == [504] * 4, results
    assert all("--request-timeout" in text for _, _, text in results)
    assert max(t for _, t, _ in results) < 15, results  # 5 s of --request-timeout (the work would take ~12 s each), then it stopped
    assert max(latencies) < 5, latencies
