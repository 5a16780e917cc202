#!/usr/bin/env python
"""Served throughput and latency: `seqtool serve` under single-sentence requests at several
concurrencies, beside offline `translate` on the same lines and the same server with batching
off (--max-batch-tokens 1: one segment per model call), in one run on the same threads.

    python bench/serve.py --checkpoint runs/demo/best.pt [--lines 600] [--concurrency 1 8 32 128]

The load generator (async httpx, one client per concurrency slot, each sending the next test
sentence as soon as its previous one is answered) runs in this process and shares the machine's
cores with the server: on a 2-core machine that costs the server part of one core, which the
offline figure does not pay. Offline is timed in-process around Translator.translate (model
loading excluded, as the server's figures exclude its start). Target tokens are the best
hypotheses' tokens with EOS: the server's own counter (/metrics) and the offline hypotheses.
Every served translation is compared with the offline one (batch invariance). Prints one
markdown table and appends it to bench/results.md. Run on an idle machine.

    python bench/serve.py --checkpoint runs/demo/best.pt --hostile [--rounds 2]

--hostile instead runs 32 well-behaved clients against one batched server, alternately alone and
beside one hostile client that sends, one after another (--hostile-interval-ms apart, default 100: twice the
rate of each well-behaved client; 0 makes it a flood, which only --req-limit can stop): a 100,000-entry
glossary (2.2 MB), beam 64, a NaN length penalty, a bad batch-mate (sampling with constraints), a
body past the size limit sent without Content-Length, 100,000-deep JSON and a glossary of 1,001
entries, 150,000 one-word items with source "auto" (refused before any detection). Beside it, raw
sockets misbehave the whole time: 20 slow-header clients (a byte a second), 20 slow-body clients,
100 idle connections, a 10 MB header and a head of 100,000 fields, each reconnecting as soon as it
is closed. The hostile clients run in a process of their own, so that building and sending their
heads never stalls the event loop that times the well-behaved ones. It reports the well-behaved clients' p99 latency alone and beside them (goal: at most 20%
higher), whether every well-behaved answer equals offline `translate`, and the hostile clients'
answers (goal: only 4xx, or the connection closed).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gzip
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def log(msg: str) -> None:
    print(f"[{datetime.datetime.now():%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def offline(a, lines: list[str]) -> dict:
    import torch

    from seqtool import Translator

    t = Translator.load(a.checkpoint, beam=a.beam, device="cpu", precision=a.precision, quantize=a.quantize, threads=a.threads)
    t.translate(lines[:16])  # warm-up
    t0 = time.perf_counter()
    out = list(t.translate_stream(lines))
    seconds = time.perf_counter() - t0
    tokens = sum(len(x.hypotheses[0].tokens) + 1 for x in out if x.hypotheses)
    log(f"offline: {len(lines) / seconds:.1f} sentences/s, {tokens / seconds:,.0f} target tokens/s "
        f"(precision {t.config.precision}, {torch.get_num_threads()} threads)")
    return {"texts": [x.texts[0] if x.texts else "" for x in out], "seconds": seconds, "tokens": tokens,
            "precision": t.config.precision if a.quantize == "none" else f"{a.quantize} (--quantize)"}


class Server:
    def __init__(self, a, *extra: str):
        import tempfile

        import httpx

        self.log = tempfile.TemporaryFile("w+")  # (a pipe nobody reads would stop the server once full)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "seqtool", "serve", "-c", str(a.checkpoint), "--port", str(self.port),
                                      "--device", "cpu", "--precision", a.precision, "--quantize", a.quantize, "--threads", str(a.threads),
                                      "--beam", str(a.beam), "--queue-limit", "100000", *extra, *a.serve_args.split()],
                                     stdout=subprocess.DEVNULL, stderr=self.log, text=True,
                                     env=dict(os.environ, OMP_NUM_THREADS=str(a.threads)))
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise SystemExit(f"the server exited: {self.log.read()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise SystemExit("the server did not become ready")

    def counters(self) -> dict[str, float]:
        """The server's running totals: target tokens, batches, segments decoded, decoding seconds."""
        import httpx

        names = {"seqtool_target_tokens_total": "tokens", "seqtool_batch_segments_count": "batches",
                 "seqtool_batch_segments_sum": "segments", "seqtool_decode_seconds_total": "seconds"}
        out = dict.fromkeys(names.values(), 0.0)
        for line in httpx.get(f"{self.url}/metrics").text.splitlines():
            name = line.split(" ")[0]
            if name in names:
                out[names[name]] = float(line.split()[-1])
            elif name.startswith('seqtool_batch_seconds_bucket{le="'):  # cumulative counts by upper bound
                out["le " + name.split('"')[1]] = float(line.split()[-1])
        return out

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.communicate(timeout=120)


async def load(url: str, lines: list[str], concurrency: int) -> tuple[list[str], list[float], float]:
    import httpx

    texts: list[str] = [""] * len(lines)
    latencies: list[float] = []
    todo = iter(range(len(lines)))

    async def client(http):
        for i in todo:
            t0 = time.perf_counter()
            r = await http.post("/translate", json={"q": lines[i], "source": "auto"})
            latencies.append(time.perf_counter() - t0)
            r.raise_for_status()
            texts[i] = r.json()["translatedText"]

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
        return texts, latencies, time.perf_counter() - t0


async def warm_up(url: str) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        for _ in range(4):
            (await http.post("/translate", json={"q": "Hola.", "source": "auto"})).raise_for_status()


def hostile_requests(lines: list[str]) -> list[tuple[str, dict]]:
    """What the hostile client sends, in turn: (what, httpx.post keyword arguments)."""
    import json

    huge = json.dumps({"segments": lines[:4], "glossary": {f"term{i}": f"t{i}" for i in range(100_000)}}).encode()

    async def unsized():  # chunked: no Content-Length to refuse it by
        for _ in range(40):
            yield b" " * 25_000
    return [
        ("100,000-entry glossary (2.2 MB)", {"content": huge, "headers": {"Content-Type": "application/json"}}),
        ("beam 64", {"json": {"segments": lines[:4], "beam": 64, "max_len_b": 500}}),
        ("NaN lenpen", {"content": json.dumps({"segments": lines[:4], "lenpen": float("nan")}).encode(),
                        "headers": {"Content-Type": "application/json"}}),
        ("bad batch-mate", {"json": {"segments": lines[:4], "sampling": {"topk": 5}, "constraints": [["Dios"]] * 4}}),
        ("1 MB without Content-Length", {"content": unsized, "headers": {"Content-Type": "application/json"}}),
        ("100,000-deep JSON", {"content": b"[" * 100_000 + b"]" * 100_000, "headers": {"Content-Type": "application/json"}}),
        ("1,001 glossary entries", {"json": {"segments": lines[:4], "glossary": {f"w{i}": "x" for i in range(1001)}}}),
        ("150,000 items, source auto", {"path": "/translate", "content": json.dumps({"q": ["ja"] * 150_000, "source": "auto"},
                                                                                  separators=(",", ":")).encode(),
                                        "headers": {"Content-Type": "application/json"}}),
    ]


async def raw_hostile(port: int, what: str, opening: bytes, trickle: bytes, stop: asyncio.Event, statuses: dict,
                      interval: float) -> None:
    """One misbehaving connection after another (at least `interval` seconds apart) until `stop`: each
    sends `opening` (in 1 MB pieces), then `trickle` once a second (nothing: idle), and records how it
    ended: the server's status, or "closed" (closed without a word), or the error."""
    while not stop.is_set():
        await asyncio.sleep(interval)
        writer = None
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            for k in range(0, len(opening), 1 << 20):
                writer.write(opening[k:k + (1 << 20)])
                await writer.drain()
            while not stop.is_set():
                try:
                    line = await asyncio.wait_for(reader.readline(), 1.0)
                except asyncio.TimeoutError:
                    if trickle:
                        writer.write(trickle)
                        await writer.drain()
                    continue
                outcome = int(line.split()[1]) if line.startswith(b"HTTP/1.1 ") else "closed"
                break
            else:
                return
        except (ConnectionError, OSError) as error:
            outcome = "closed" if isinstance(error, (ConnectionResetError, BrokenPipeError)) else type(error).__name__
        finally:
            if writer is not None:
                writer.close()
        statuses.setdefault(what, {}).setdefault(outcome, 0)
        statuses[what][outcome] += 1


def raw_hostiles(port: int, stop: asyncio.Event, statuses: dict, interval: float) -> list:
    """The raw-socket hostile clients (see the module's docstring), as tasks."""
    head = b"POST /v1/translate HTTP/1.1\r\nHost: x\r\n"
    body = head + b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    fields = head + b"".join(b"X-%d: v\r\n" % k for k in range(100_000)) + b"\r\n"
    kinds = [("slow header", head, b"X", 20), ("slow body", body, b" ", 20), ("idle connection", b"", b"", 100),
             ("10 MB header", head + b"X-Big: " + b"a" * 10_000_000 + b"\r\n\r\n", b"", 1),
             ("100,000 header fields", fields, b"", 1)]
    return [asyncio.create_task(raw_hostile(port, what, opening, trickle, stop, statuses, interval))
            for what, opening, trickle, n in kinds for _ in range(n)]


async def hostile_client(url: str, requests: list[tuple[str, dict]], stop: asyncio.Event, statuses: dict,
                         interval: float = 0.0) -> None:
    """Sends the hostile requests in turn, each as soon as the last is answered (and `interval`
    seconds after the last was sent), until `stop`."""
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        k = 0
        while not stop.is_set():
            sent = time.perf_counter()
            what, kwargs = requests[k % len(requests)]
            if callable(kwargs.get("content")):
                kwargs = {**kwargs, "content": kwargs["content"]()}
            path = kwargs.get("path", "/v1/translate")
            kwargs = {key: value for key, value in kwargs.items() if key != "path"}
            try:
                status = (await http.post(path, **kwargs)).status_code
            except httpx.TransportError as error:
                status = type(error).__name__
            statuses.setdefault(what, {}).setdefault(status, 0)
            statuses[what][status] += 1
            k += 1
            await asyncio.sleep(max(0.0, interval - (time.perf_counter() - sent)))


def _hostile_process(url: str, lines: list[str], interval: float, stop, results) -> None:
    """The hostile clients' own process (a real attacker does not share the measuring client's event
    loop: building and sending 10 MB heads there would stall the timings it takes): they run until
    `stop` is set, then their statuses go to `results`."""
    async def run() -> dict:
        done, statuses = asyncio.Event(), {}
        enemies = [asyncio.create_task(hostile_client(url, hostile_requests(lines), done, statuses, interval)),
                   *raw_hostiles(int(url.rsplit(":", 1)[1]), done, statuses, interval)]
        while not stop.is_set():
            await asyncio.sleep(0.1)
        done.set()
        await asyncio.gather(*enemies)
        return statuses
    results.put(asyncio.run(run()))


def load_beside_hostile(url: str, lines: list[str], concurrency: int, interval: float) -> tuple:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    stop, results = ctx.Event(), ctx.Queue()
    enemies = ctx.Process(target=_hostile_process, args=(url, lines, interval, stop, results), daemon=True)
    enemies.start()
    try:
        texts, latencies, seconds = asyncio.run(load(url, lines, concurrency))
    finally:
        stop.set()
        statuses = results.get(timeout=600)
        enemies.join(60)
    return texts, latencies, seconds, statuses


def hostile_main(a, lines: list[str], cpu: str, ref: dict) -> int:
    """32 well-behaved clients alone and beside the hostile clients (another process), alternately, on one server."""
    server = Server(a, "--max-wait-ms", str(a.max_wait_ms))
    runs: list[tuple[str, float, int, dict]] = []
    try:
        asyncio.run(warm_up(server.url))
        for round_ in range(a.rounds):
            for label in ("alone", "beside the hostile client"):
                if label == "alone":
                    texts, lat, seconds = asyncio.run(load(server.url, lines, 32))
                    statuses = {}
                else:
                    texts, lat, seconds, statuses = load_beside_hostile(server.url, lines, 32, a.hostile_interval_ms / 1000)
                same = sum(x == y for x, y in zip(texts, ref["texts"]))
                runs.append((label, percentile(lat, 99), same, statuses, len(lines) / seconds))
                log(f"round {round_ + 1}, {label}: p99 {percentile(lat, 99) * 1000:.0f} ms, {len(lines) / seconds:.1f} sentences/s, "
                    f"{same}/{len(lines)} as offline" + (f", hostile statuses {statuses}" if statuses else ""))
    finally:
        server.stop()
    alone = [r for r in runs if r[0] == "alone"]
    beside = [r for r in runs if r[0] != "alone"]
    mean = lambda rows, k: sum(r[k] for r in rows) / len(rows)  # noqa: E731
    rise = mean(beside, 1) / mean(alone, 1) - 1
    hostile: dict = {}
    for r in beside:
        for what, counts in r[3].items():
            for status, n in counts.items():
                hostile.setdefault(what, {}).setdefault(status, 0)
                hostile[what][status] += n
    only_4xx = all((isinstance(status, int) and 400 <= status < 500) or status == "closed"
                   for counts in hostile.values() for status in counts)
    equal = all(r[2] == len(lines) for r in runs)
    when = datetime.datetime.now()
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = [f"## serve beside a hostile client, {when:%Y-%m-%d %H:%M}, commit {commit}, CPU {cpu}, {a.threads} threads, "
           f"{len(lines)} test lines x 32 clients, beam {a.beam}, precision {ref['precision']}, max-wait {a.max_wait_ms:g} ms, "
           f"{a.rounds} rounds, the hostile client's requests at least {a.hostile_interval_ms:g} ms apart", "",
           "| run | p99 ms | sentences/s | same as offline |", "|---|---|---|---|"]
    out += [f"| {r[0]} | {r[1] * 1000:.0f} | {r[4]:.1f} | {r[2]}/{len(lines)} |" for r in runs]
    out += ["", "| hostile request | answers |", "|---|---|"]
    out += [f"| {what} | {', '.join(f'{n} x {status}' for status, n in sorted(counts.items(), key=str))} |" for what, counts in hostile.items()]
    out += ["", f"well-behaved p99 beside the hostile client: {rise * 100:+.1f}% (goal <= +20%); every well-behaved answer as offline: "
            f"{'yes' if equal else 'NO'}; the hostile clients got only 4xx or a closed connection: {'yes' if only_4xx else 'NO'}", ""]
    table = "\n".join(out)
    print(table)
    if not a.no_results:
        with open(REPO / "bench" / "results.md", "a", encoding="utf-8") as handle:
            handle.write("\n" + table)
    return 0 if rise <= 0.20 and equal and only_4xx else 1


def histogram_median(counts: dict[str, float]) -> Optional[float]:
    """The median of a Prometheus histogram's cumulative bucket counts {"le 0.1": n, ..., "le +Inf": n}, interpolated
    linearly inside its bucket (as Prometheus' histogram_quantile); None without observations."""
    bounds = sorted((float(k[3:]), v) for k, v in counts.items() if k.startswith("le "))
    if not bounds or bounds[-1][1] <= 0:
        return None
    half, lower, below = bounds[-1][1] / 2, 0.0, 0.0
    for upper, cumulative in bounds:  # the +Inf bucket holds every observation: the loop returns
        if cumulative >= half:  # (so cumulative > below: the bucket before stopped short of half)
            return lower if math.isinf(upper) else lower + (upper - lower) * (half - below) / (cumulative - below)
        lower, below = upper, cumulative


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=REPO / "data" / "bible-es-en" / "test.es.gz")
    parser.add_argument("--lines", type=int, default=600)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--quantize", default="none", help="none or int8 (with --precision auto or fp32)")
    parser.add_argument("--max-wait-ms", type=float, default=10.0)
    parser.add_argument("--serve-args", default="", help="more `seqtool serve` options for both servers, e.g. '--workers 2 --threads 1'"
                        " (with --workers, batch figures come from whichever worker answers /metrics)")
    parser.add_argument("--no-results", action="store_true", help="do not append to bench/results.md")
    parser.add_argument("--hostile", action="store_true", help="32 clients alone and beside a hostile one (see above)")
    parser.add_argument("--rounds", type=int, default=2, help="--hostile: alternations of alone / beside")
    parser.add_argument("--hostile-interval-ms", type=float, default=100.0,
                        help="--hostile: the least time between the hostile client's requests, default 100 (twice the rate of each of the 32 others; 0: each as soon as the last is answered, a flood: what --req-limit is for)")
    a = parser.parse_args()
    import torch

    from seqtool.device import cpu_bf16_instructions, cpu_capability

    lines = gzip.open(a.data, "rt", encoding="utf-8").read().splitlines()[: a.lines]
    cpu = f"{cpu_capability()}" + (f" + {cpu_bf16_instructions()}" if cpu_bf16_instructions() else "")
    log(f"{len(lines)} lines, {a.threads} threads, beam {a.beam}, torch {torch.__version__}, CPU {cpu}")
    ref = offline(a, lines)
    if a.hostile:
        return hostile_main(a, lines, cpu, ref)
    rows = [("offline translate", "-", len(lines) / ref["seconds"], ref["tokens"] / ref["seconds"], None, None, None, "-", None, None,
             None)]
    runs = {}
    for label, extra in (("served, batched", ["--max-wait-ms", str(a.max_wait_ms)]),
                         ("served, unbatched", ["--max-batch-tokens", "1", "--max-wait-ms", "0"])):
        server = Server(a, *extra)
        try:
            for c in a.concurrency:
                asyncio.run(warm_up(server.url))
                before = server.counters()
                texts, lat, seconds = asyncio.run(load(server.url, lines, c))
                delta = {k: v - before[k] for k, v in server.counters().items()}
                same = sum(x == y for x, y in zip(texts, ref["texts"]))
                batches = max(delta["batches"], 1)
                median_batch = histogram_median({k: v for k, v in delta.items() if k.startswith("le ")})
                row = (label, str(c), len(lines) / seconds, delta["tokens"] / seconds, percentile(lat, 50), percentile(lat, 95),
                       percentile(lat, 99), f"{same}/{len(lines)}", delta["segments"] / batches, delta["seconds"] / batches,
                       median_batch)
                rows.append(row)
                runs[(label, c)] = row
                log(f"{label}, concurrency {c}: {row[2]:.1f} sentences/s, {row[3]:,.0f} tokens/s, p50 {row[4] * 1000:.0f} ms, "
                    f"p99 {row[6] * 1000:.0f} ms, {row[7]} as offline")
        finally:
            server.stop()

    when = datetime.datetime.now()
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.strip()
    ms = lambda v: "-" if v is None else f"{v * 1000:.0f}"  # noqa: E731
    out = [f"## serve, {when:%Y-%m-%d %H:%M}, commit {commit}{'+dirty' if dirty else ''}, CPU {cpu}, {a.threads} threads, "
           f"{len(lines)} test lines, beam {a.beam}, precision {ref['precision']}, max-wait {a.max_wait_ms:g} ms, "
           f"checkpoint {a.checkpoint}" + (f", serve {a.serve_args}" if a.serve_args else ""), "",
           "| run | concurrency | sentences/s | target tokens/s | p50 ms | p95 ms | p99 ms | segments per batch | "
           "ms per batch, mean / median | same as offline |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    out += [f"| {r[0]} | {r[1]} | {r[2]:.1f} | {r[3]:,.0f} | {ms(r[4])} | {ms(r[5])} | {ms(r[6])} | "
            f"{'-' if r[8] is None else f'{r[8]:.1f}'} | {ms(r[9])} / {ms(r[10])} | {r[7]} |" for r in rows]
    goals = []
    if ("served, batched", 32) in runs and ("served, unbatched", 32) in runs:
        b, u = runs[("served, batched", 32)], runs[("served, unbatched", 32)]
        goals.append(f"concurrency 32: served / offline = {b[2] / rows[0][2]:.2f} (goal >= 0.80); batched / unbatched = "
                     f"{b[2] / u[2]:.2f} (goal >= 4); p99 {b[6] * 1000:.0f} ms against max-wait + 2 x the median batch time = "
                     f"{a.max_wait_ms + 2 * (b[10] if b[10] is not None else b[9]) * 1000:.0f} ms (median from /metrics' "
                     "seqtool_batch_seconds histogram, interpolated in its bucket)")
    out += [""] + goals + [""]
    table = "\n".join(out)
    print(table)
    if not a.no_results:
        with open(REPO / "bench" / "results.md", "a", encoding="utf-8") as handle:
            handle.write("\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
