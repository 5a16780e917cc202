"""`seqtool serve` as users run it: a real server process on a real port, real HTTP clients (httpx)."""

import asyncio
import json
import os
import pathlib
import signal
import socket
import sys
import time

import httpx
import pytest

from servers import LINES, STOPPED, Server, offline_translations, translated


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    s = Server(tiny_checkpoint, "--max-lines", "100", "--max-chars", "2000", "--max-wait-ms", "20")
    yield s
    err = s.stop()
    assert s.proc.returncode in STOPPED, err
    assert "Traceback" not in err


@pytest.fixture(scope="module")
def offline(tiny_checkpoint):
    return offline_translations(tiny_checkpoint)


@pytest.mark.system
def test_sixty_four_concurrent_clients_each_get_their_own_translations_in_order(server, offline):
    """Requests of 1-5 segments from 64 clients at once share the server's batches; every client
    gets, in its order, exactly what offline `seqtool translate` gives for its lines."""
    asks = [[(c * 7 + k) % len(LINES) for k in range(1 + c % 5)] for c in range(64)]

    async def client(http, ids):
        r = await http.post("/v1/translate", json={"segments": [LINES[i] for i in ids], "nbest": 2})
        assert r.status_code == 200, r.text
        return [[t["text"], t["alternatives"][0]["text"]] for t in r.json()["translations"]]

    async def everyone():
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=httpx.Limits(max_connections=64)) as http:
            return await asyncio.gather(*(client(http, ids) for ids in asks))

    got = asyncio.run(everyone())
    for ids, answer in zip(asks, got):
        assert answer == [offline[i] for i in ids]
    metrics = httpx.get(f"{server.url}/metrics").text
    batched = [line for line in metrics.splitlines() if line.startswith("seqtool_batch_segments_count")]
    assert batched and float(batched[0].split()[-1]) < 64  # fewer model calls than requests: they were batched


@pytest.mark.system
def test_libretranslate_request_and_answer_shapes(server, offline):
    r = httpx.post(f"{server.url}/translate", json={"q": LINES[3], "source": "auto", "target": "tgt"})
    assert r.status_code == 200 and translated(r) == {"translatedText": offline[3][0]}
    r = httpx.post(f"{server.url}/translate", json={"q": [LINES[1], "", LINES[2]], "source": "src", "target": "tgt",
                                                     "format": "text", "alternatives": 1})
    assert r.status_code == 200
    assert translated(r) == {"translatedText": [offline[1][0], "", offline[2][0]],
                        "alternatives": [[offline[1][1]], [], [offline[2][1]]]}
    languages = httpx.get(f"{server.url}/languages").json()
    assert languages[0]["code"] == "src" and languages[0]["targets"] == ["tgt"]


@pytest.mark.system
def test_native_answers_keep_empty_segments_in_place_with_scores(server, offline):
    r = httpx.post(f"{server.url}/v1/translate", json={"segments": [LINES[5], "   ", LINES[6]], "scores": True})
    assert r.status_code == 200
    t = r.json()["translations"]
    assert [x["text"] for x in t] == [offline[5][0], "", offline[6][0]]
    assert all(isinstance(x["score"], float) for x in t)


@pytest.mark.system
def test_sampling_with_a_seed_repeats_whatever_shares_the_batch(server):
    body = {"segments": LINES[:6], "nbest": 3, "sampling": {"topk": 5, "seed": 11}}
    alone = httpx.post(f"{server.url}/v1/translate", json=body).json()

    async def crowd():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
            others = [http.post("/v1/translate", json={**body, "segments": LINES[10 + k: 14 + k]}) for k in range(8)]
            mine = http.post("/v1/translate", json=body)
            return (await asyncio.gather(mine, *others))[0].json()

    assert asyncio.run(crowd()) == alone
    assert httpx.post(f"{server.url}/v1/translate", json={**body, "sampling": {"topk": 5, "seed": 12}}).json() != alone


@pytest.mark.parametrize("body, status, words", [
    ("{not json", 422, "body: not valid JSON"),
    (json.dumps({"segments": "one string"}), 422, "segments: Input should be a valid list"),
    (json.dumps({"segments": ["a"], "beam": 2, "nbest": 3}), 422, "nbest must be between 1 and beam (2)"),
    (json.dumps({"segments": ["a"] * 101}), 413, "101 segments in one request; this server takes at most 100"),
    (json.dumps({"segments": ["a b c d " * 300]}), 413, "2,400 characters in one request (segments, prefixes, constraints and glossary together); this server takes at most 2,000 (--max-chars)"),
    (json.dumps({"segments": ["a"], "alignment": True}), 400, "started without --alignments"),
])
@pytest.mark.system
def test_bad_requests_get_their_status_and_one_line_naming_the_problem(server, body, status, words):
    r = httpx.post(f"{server.url}/v1/translate", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    assert words in r.json()["error"] and "Traceback" not in r.text


@pytest.mark.system
def test_wrong_languages_are_refused_naming_the_model_s(server):
    r = httpx.post(f"{server.url}/translate", json={"q": "a", "source": "de", "target": "tgt"})
    assert r.status_code == 400 and r.json()["error"] == "this model translates src -> tgt; got source 'de', target 'tgt'"


@pytest.mark.system
def test_health_models_and_metrics(server):
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"
    model = httpx.get(f"{server.url}/v1/models").json()["models"][0]
    assert (model["source"], model["target"], model["precision"], model["vocabulary"]) == ("src", "tgt", "fp32", 24)
    assert model["parameters"] > 0 and len(model["config_sha256"]) == 64
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text)}
    assert {"seqtool_requests", "seqtool_request_seconds", "seqtool_batch_segments", "seqtool_batch_seconds",
            "seqtool_queue_segments", "seqtool_target_tokens"} <= set(families)
    count = {f.name: next(s.value for s in f.samples if s.name.endswith("_count"))
             for f in families.values() if f.name in ("seqtool_batch_segments", "seqtool_batch_seconds")}
    assert count["seqtool_batch_seconds"] == count["seqtool_batch_segments"]  # every batch timed
    assert "<title>seqtool</title>" in httpx.get(f"{server.url}/").text
    assert httpx.get(f"{server.url}/openapi.json").json()["paths"].keys() >= {"/translate", "/v1/translate"}


# The runner decodes a request's segments once --max-wait-ms has passed (or a batch's worth of tokens
# is queued). The tests below that need segments to stay queued give it 600,000 ms, which never
# passes during a test, and wait for what the server says (/health's "queue") instead of sleeping
# and hoping: nothing they check races a timer of theirs against one of the server's.
NEVER = "600000"


def _queue(s: Server) -> int:
    return httpx.get(f"{s.url}/health", timeout=30).json()["queue"]


def _wait_for_queue(s: Server, segments: int, timeout: float = 60.0) -> None:
    """Until /health says `segments` segments are queued (a generous deadline: a loaded machine)."""
    deadline = time.monotonic() + timeout
    while (queued := _queue(s)) != segments:
        assert time.monotonic() < deadline, f"{queued} segments queued after {timeout:g} s, not {segments}"
        time.sleep(0.02)


def _post_and_wait(s: Server, segments: list[str]) -> socket.socket:
    """A client that sends POST /v1/translate and waits for the answer on a connection of its own;
    closing the socket is the client going away."""
    body = json.dumps({"segments": segments}).encode()
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=60)
    sock.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return sock


@pytest.fixture(scope="module")
def patient(tiny_checkpoint):
    """A server whose runner waits for company longer than any test (a queue of at most 4 segments;
    --request-timeout 600 s, longer than any wait below, so only a client going away drops a request)."""
    s = Server(tiny_checkpoint, "--max-wait-ms", NEVER, "--queue-limit", "4", "--request-timeout", "600")
    yield s
    try:
        err = s.stop()
    finally:
        s.proc.kill()  # (a no-op once it has stopped; else a request left queued would hold it up to 600 s)
    assert s.proc.returncode in STOPPED and "Traceback" not in err, err


@pytest.mark.system
def test_a_full_queue_is_503_with_retry_after(patient):
    """The first request's 4 segments wait in the queue (its limit): the next request is refused at
    once with 503 and Retry-After, and is not queued."""
    first = _post_and_wait(patient, LINES[:4])
    try:
        _wait_for_queue(patient, 4)
        second = httpx.post(f"{patient.url}/v1/translate", json={"segments": LINES[4:5]}, timeout=60)
        assert second.status_code == 503 and second.headers["Retry-After"] == "1"
        assert "the queue is full (4 segments waiting, --queue-limit 4)" in second.json()["error"]
        assert _queue(patient) == 4
    finally:
        first.close()
    _wait_for_queue(patient, 0)  # (the next test's way in)


@pytest.mark.system
def test_a_client_that_goes_away_has_its_segments_dropped(patient):
    """Segments that could only leave the queue by being decoded (after 600 s) or dropped: the
    client closes its connection and they are dropped."""
    client = _post_and_wait(patient, LINES[:4])
    _wait_for_queue(patient, 4)
    client.close()
    _wait_for_queue(patient, 0)


@pytest.mark.system
def test_a_request_past_its_timeout_is_504_and_its_segments_dropped(tiny_checkpoint):
    """--request-timeout (1 s) is the one timer that can fire here: the runner would wait 600 s."""
    s = Server(tiny_checkpoint, "--max-wait-ms", NEVER, "--request-timeout", "1")
    try:
        r = httpx.post(f"{s.url}/v1/translate", json={"segments": LINES[:3]}, timeout=60)
        assert r.status_code == 504 and "not translated within 1 s (--request-timeout)" in r.json()["error"]
        assert _queue(s) == 0  # dropped before the 504 was sent
    finally:
        err = s.stop()
    assert s.proc.returncode in STOPPED and "Traceback" not in err, err


@pytest.mark.system
def test_sigterm_answers_what_is_in_flight_then_exits(tiny_checkpoint, offline):
    """SIGTERM while a request's segments wait in the queue (for company they would wait ten minutes
    for): the server stops taking connections at once, decodes what is queued now and answers that
    request, then exits."""
    s = Server(tiny_checkpoint, "--max-wait-ms", "600000")

    async def refused() -> bool:
        try:
            async with httpx.AsyncClient(timeout=5) as fresh:  # a new connection each time
                await fresh.get(f"{s.url}/health")
            return False
        except httpx.TransportError:
            return True

    async def scenario():
        async with httpx.AsyncClient(base_url=s.url, timeout=60) as http:
            pending = asyncio.create_task(http.post("/v1/translate", json={"segments": LINES[:2]}))
            deadline = time.monotonic() + 60
            while (await http.get("/health")).json()["queue"] != 2:  # queued, waiting for company
                assert time.monotonic() < deadline and not pending.done()
                await asyncio.sleep(0.02)
            s.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 60
            while not await refused():
                assert time.monotonic() < deadline, "still taking connections 60 s after SIGTERM"
                await asyncio.sleep(0.02)
            return await pending

    answered = asyncio.run(scenario())
    assert answered.status_code == 200, answered.text
    assert [t["text"] for t in answered.json()["translations"]] == [offline[0][0], offline[1][0]]
    err = s.stop()
    assert s.proc.returncode in STOPPED and "Traceback" not in err


@pytest.mark.system
def test_target_prefixes_per_segment_as_translate_gives_them(server, tiny_checkpoint):
    from seqtool.translate import Translator

    segments, prefixes = LINES[:4], ["h g", "", "a a", "b"]
    r = httpx.post(f"{server.url}/v1/translate", json={"segments": segments, "target_prefix": prefixes}, timeout=60)
    assert r.status_code == 200, r.text
    t = Translator.load(tiny_checkpoint, device="cpu", precision="fp32", threads=2, max_len_a=0.0, max_len_b=8)
    assert [x["text"] for x in r.json()["translations"]] == t.translate(segments, target_prefix=prefixes)
    r = httpx.post(f"{server.url}/v1/translate", json={"segments": segments, "target_prefix": ["x"]}, timeout=60)
    assert r.status_code == 422 and "target_prefix: 1 prefixes for 4 segments" in r.json()["error"]


@pytest.mark.system
def test_constraints_and_a_glossary_per_request_as_translate_keeps_them(server, tiny_checkpoint):
    from seqtool.translate import Translator

    segments = ["a b c", "d e", "f g h"]
    body = {"segments": segments, "constraints": [["h g"], [], [["e e", "f f"]]], "glossary": {"d": "c a"}}
    r = httpx.post(f"{server.url}/v1/translate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    t = Translator.load(tiny_checkpoint, device="cpu", precision="fp32", threads=2, max_len_a=0.0, max_len_b=8)
    want = t.translate(segments, constraints=[["h g"], ["c a"], [["e e", "f f"]]])
    assert [x["text"] for x in r.json()["translations"]] == want
    for bad, words in (({"constraints": [["x"]]}, "constraints: 1 lists for 3 segments"),
                       ({"constraints": [[""], [], []]}, "constraints of segment 1: item 1")):
        r = httpx.post(f"{server.url}/v1/translate", json={"segments": segments, **bad}, timeout=60)
        assert r.status_code == 422 and words in r.json()["error"], r.text


def _alive(pid: int) -> bool:
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _worker_pids(s: "Server", want: int) -> set:
    """The worker processes that answer /health, each request on a fresh connection (the kernel picks
    a worker per connection), until `want` of them have answered."""
    seen: set = set()
    deadline = time.time() + 120
    while len(seen) < want and time.time() < deadline:
        try:
            r = httpx.get(f"{s.url}/health", timeout=5)
            if r.status_code == 200:
                seen.add(r.json()["pid"])
        except httpx.TransportError:
            pass
        time.sleep(0.02)
    return seen


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.system
def test_workers_share_one_port_each_with_its_own_model_and_stop_together(tiny_checkpoint, offline):
    """--workers 2: two server processes behind one port, the kernel spreading connections; every
    client gets its own translations whichever worker answers; SIGTERM stops both."""
    s = Server(tiny_checkpoint, "--workers", "2", "--threads", "1")
    pids = _worker_pids(s, 2)
    assert len(pids) == 2 and s.proc.pid not in pids
    assert all(int(pathlib.Path(f"/proc/{p}/stat").read_text().split()[3]) == s.proc.pid for p in pids)
    asks = [[(c * 5 + k) % len(LINES) for k in range(1 + c % 3)] for c in range(24)]

    async def client(ids):
        async with httpx.AsyncClient(base_url=s.url, timeout=120) as http:  # a connection of its own
            r = await http.post("/v1/translate", json={"segments": [LINES[i] for i in ids], "nbest": 2})
            assert r.status_code == 200, r.text
            return [[t["text"], t["alternatives"][0]["text"]] for t in r.json()["translations"]]

    async def everyone():
        return await asyncio.gather(*(client(ids) for ids in asks))

    for ids, answer in zip(asks, asyncio.run(everyone())):
        assert answer == [offline[i] for i in ids]
    err = s.stop()
    assert s.proc.returncode in STOPPED and "Traceback" not in err, err
    deadline = time.time() + 10
    while any(_alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.system
def test_a_worker_that_dies_stops_the_others_and_the_server_exits_naming_it(tiny_checkpoint):
    s = Server(tiny_checkpoint, "--workers", "2", "--threads", "1")
    pids = sorted(_worker_pids(s, 2))
    assert len(pids) == 2
    os.kill(pids[0], signal.SIGKILL)
    err = s.wait(60)
    assert s.proc.returncode == 1
    assert f"(pid {pids[0]}) was killed by SIGKILL; the other workers were stopped" in err.strip().splitlines()[-1]
    deadline = time.time() + 10
    while _alive(pids[1]) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(pids[1])


@pytest.mark.unit
def test_serve_without_its_extra_says_what_to_install(monkeypatch):
    import builtins

    from seqtool.serving import app as serve
    from seqtool.errors import ConfigError

    real = builtins.__import__

    def no_uvicorn(name, *args, **kwargs):
        if name == "uvicorn":
            raise ImportError("No module named 'uvicorn'", name="uvicorn")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_uvicorn)
    with pytest.raises(ConfigError, match=r"needs uvicorn: pip install 'seqtool\[serve\]'"):
        serve.require_fastapi()


@pytest.mark.system
def test_alignments_when_the_server_offers_them(tiny_checkpoint):
    s = Server(tiny_checkpoint, "--alignments")
    try:
        r = httpx.post(f"{s.url}/v1/translate", json={"segments": [LINES[4], ""], "alignment": True, "nbest": 2,
                                                                 "loop_guard": 0})  # (no guard: one token a word)
        assert r.status_code == 200, r.text
        first, empty = r.json()["translations"]
        for item in (first, *first["alternatives"]):
            pairs = [tuple(map(int, p.split("-"))) for p in item["alignment"].split()]
            assert len(pairs) == len(item["text"].split()) or item["text"] == ""
            assert all(0 <= i < len(LINES[4].split()) + 1 for i, _ in pairs)
        assert empty["text"] == "" and empty.get("alignment", "") == ""
    finally:
        s.stop()


@pytest.mark.system
def test_the_page_translates_in_a_real_browser(server, offline):
    """The page at / in headless Chromium (the system's, with its chromedriver; .ci/run installs
    both): a user types two lines, asks for 2 alternatives, presses Translate."""
    import shutil

    browser, driver_path = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
    if not (browser and driver_path):
        pytest.skip("needs Chromium and its driver: apt-get install chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        driver.get(server.url + "/")
        wait = WebDriverWait(driver, 30)
        wait.until(lambda d: "src → tgt" in d.find_element(By.ID, "model").text)
        driver.find_element(By.ID, "source").send_keys(f"{LINES[7]}\n{LINES[8]}")
        nbest = driver.find_element(By.ID, "nbest")
        nbest.clear()
        nbest.send_keys("2")
        driver.find_element(By.ID, "go").click()
        wait.until(lambda d: d.find_element(By.ID, "output").text.strip())
        assert driver.find_element(By.ID, "output").text.splitlines() == [offline[7][0].strip(), offline[8][0].strip()]
        alternatives = [li.text for li in driver.find_elements(By.CSS_SELECTOR, "#alternatives li")]
        assert alternatives == [offline[7][1].strip(), offline[8][1].strip()]  # (the page shows text, spaces trimmed)
        assert driver.find_element(By.ID, "error").text == ""
    finally:
        driver.quit()
