#!/usr/bin/env python
"""Real documents nobody here wrote, through `seqtool translate` and `seqtool serve` (issue 41).

    python bench/documents.py --real --checkpoint runs/demo/best.pt [--limit N]

The collections (each read where it is installed; tests/data/documents keeps a sample with licences):
- Rust by Example in Spanish: every page of $(rustc --print sysroot)/share/doc/rust/html/rust-by-example/es/
  (the print-all page, the table of contents and the 404 page aside);
- the README (METADATA's description, Markdown) of every installed Python distribution that has one of
  200 characters or more;
- npm's documentation, Markdown and the HTML built from it (/usr/lib/node_modules/npm/docs).

Each document goes through the CLI as a user runs it (`-i FILE -o OUT`, --format auto from the name, fp32
so that the server's batches give the same numbers), then is checked (tests/document_checks.py): the exit
status; HTML's tag and attribute stream (translated attributes and lang aside) and verbatim elements;
Markdown's structure as markdown-it reads it; URLs and e-mail addresses verbatim and apart; number-only
text unchanged; the share of text nodes (HTML) or blocks (Markdown) with letters that still have letters.
Then a server on the same checkpoint answers LibreTranslate's /translate (format html, with and without
alternatives) and /v1/translate (html or markdown) for every document: each must give the CLI's output.
Last, the cost: a sample of the documents translated in-process against plain translation of the same
text, a document at a time (each unit's text as a line, the same text policy), the two back to back in each
of --rounds rounds; the median of the rounds' ratios.

Prints the CPU's capability and a table, appended to bench/results.md. Run on an idle machine.
"""

from __future__ import annotations

import datetime
import glob
import importlib.metadata
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

FP32 = ["--device", "cpu", "--precision", "fp32", "--threads", "2"]


def log(msg: str) -> None:
    print(f"[{datetime.datetime.now():%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def collections() -> dict[str, list[tuple[str, bytes]]]:
    """{collection: [(file name, bytes)]}."""
    sysroot = subprocess.run(["rustc", "--print", "sysroot"], capture_output=True, text=True).stdout.strip()
    root = Path(sysroot) / "share/doc/rust/html/rust-by-example/es"
    pages = sorted(p for p in root.rglob("*.html") if p.name not in ("print.html", "toc.html", "404.html"))
    rbe = [(str(p.relative_to(root)).replace("/", "__"), p.read_bytes()) for p in pages]
    readmes = {}
    for dist in importlib.metadata.distributions():
        meta = dist.metadata
        body = meta.get_payload() or ""
        if "markdown" in (meta.get("Description-Content-Type") or "").lower() and len(body) >= 200:
            readmes[f"{meta['Name']}.md"] = body.encode("utf-8")
    npm = sorted(p for p in glob.glob("/usr/lib/node_modules/npm/docs/**/*.*", recursive=True) if p.endswith((".html", ".md")))
    return {"Rust by Example (es)": rbe, "READMEs of installed packages": sorted(readmes.items()),
            "npm's documentation": [(p.replace("/usr/lib/node_modules/npm/docs/", "").replace("/", "__"), Path(p).read_bytes()) for p in npm]}


def run_cli(checkpoint: Path, source: Path, out: Path) -> tuple[int, str, float]:
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "seqtool", "translate", "-c", str(checkpoint), *FP32, "-i", str(source), "-o", str(out)],
                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
    return r.returncode, r.stderr, time.perf_counter() - start


def measure(a) -> int:
    import document_checks as checks
    from seqtool.device import cpu_bf16_instructions, cpu_capability
    from seqtool.documents import choose_format, read_document

    cpu = f"{cpu_capability()}" + (f" + {cpu_bf16_instructions()}" if cpu_bf16_instructions() else "")
    work = REPO / "bench" / "out" / "documents"
    docs = {name: items[: a.limit] for name, items in collections().items()}
    log(f"CPU {cpu}; " + ", ".join(f"{name}: {len(items)}" for name, items in docs.items()))
    if a.cost_only:
        cost = costs(a, {name: (read_document(data, choose_format("auto", name), name)[0], choose_format("auto", name))
                         for items in docs.values() for name, data in items})
        print(f"cost (CPU {cpu}), on every {a.cost_every}th document ({cost['documents_n']}): documents {cost['documents']:.1f} s, "
              f"plain {cost['plain']:.1f} s; the median of the rounds' ratios {cost['ratio'] - 1:+.1%}")
        return 0
    rows, outputs, sources = [], {}, {}
    for collection, items in docs.items():
        folder = work / collection.split()[0].lower()
        (folder / "in").mkdir(parents=True, exist_ok=True)
        (folder / "out").mkdir(parents=True, exist_ok=True)
        failed, broken, letters, seconds, examples = 0, 0, [0, 0], 0.0, []
        for name, data in items:
            source, out = folder / "in" / name, folder / "out" / name
            source.write_bytes(data)
            code, err, took = run_cli(a.checkpoint, source, out)
            seconds += took
            if code != 0:
                failed += 1
                examples.append(f"{name}: exit {code}: {err.strip().splitlines()[-1] if err.strip() else ''}")
                continue
            format = choose_format("auto", name)
            text = read_document(data, format, name)[0]
            got = read_document(out.read_bytes(), format, name)[0]
            sources[name], outputs[name] = (text, format), got
            problems = checks.problems(text, got, format)
            if problems:
                broken += 1
                examples.append(f"{name}: {problems[0]}")
            have, kept = checks.letters_kept(text, got, format)
            letters[0] += have
            letters[1] += kept
        log(f"{collection}: {len(items)} documents, {failed} failed, {broken} with a problem, letters kept {letters[1]}/{letters[0]}, "
            f"{seconds:.0f} s")
        for line in examples[:10]:
            log(f"  {line}")
        rows.append((collection, len(items), failed, broken, letters, seconds))
    same = server_agrees(a, sources, outputs)
    cost = costs(a, sources)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    table = "\n".join([
        f"## documents from the real world, {datetime.datetime.now():%Y-%m-%d %H:%M}, commit {commit}, CPU {cpu}, 2 threads, "
        f"{a.checkpoint}, fp32, beam 5", "",
        "| collection | documents | CLI failures | with a broken invariant | text with letters kept | CLI seconds |",
        "|---|---|---|---|---|---|",
        *[f"| {c} | {n} | {f} | {b} | {k / max(h, 1):.1%} ({k}/{h}) | {s:.0f} |" for c, n, f, b, (h, k), s in rows], "",
        f"Server against the CLI, same outputs: /translate html {same['libre']}, /translate html with alternatives "
        f"{same['libre alternatives']}, /v1/translate {same['native']}.", "",
        f"Cost, on every {a.cost_every}th document ({cost['documents_n']}): documents {cost['documents']:.1f} s against plain "
        f"translation of the same text {cost['plain']:.1f} s (medians of {a.rounds} rounds); the median of the rounds' ratios "
        f"{cost['ratio'] - 1:+.1%}.", ""])
    print(table)
    if not a.no_results:
        with open(REPO / "bench" / "results.md", "a", encoding="utf-8") as handle:
            handle.write("\n" + table)
    return 0


def server_agrees(a, sources: dict, outputs: dict) -> dict[str, str]:
    """How many documents each server endpoint translates exactly as the CLI did."""
    import httpx
    from servers import free_port

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "seqtool", "serve", "-c", str(a.checkpoint), *FP32, "--port", str(port),
                               "--max-chars", "2000000", "--request-timeout", "3600", "--queue-limit", "100000"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        counts = {"libre": [0, 0], "libre alternatives": [0, 0], "native": [0, 0]}
        for name, (text, format) in sources.items():
            want = outputs[name]
            if format == "html":
                for key, extra in (("libre", {}), ("libre alternatives", {"alternatives": 1})):
                    r = httpx.post(f"{url}/translate", json={"q": text, "format": "html", **extra}, timeout=3600)
                    counts[key][1] += 1
                    counts[key][0] += r.status_code == 200 and r.json()["translatedText"] == want
            r = httpx.post(f"{url}/v1/translate", json={"segments": [text], "format": format}, timeout=3600)
            counts["native"][1] += 1
            ok = r.status_code == 200 and r.json()["translations"][0]["text"] == want
            counts["native"][0] += ok
            if not ok:
                log(f"  /v1/translate differs from the CLI on {name} ({r.status_code})")
    finally:
        server.terminate()
        server.wait(timeout=60)
    log("server: " + ", ".join(f"{k} {v[0]}/{v[1]}" for k, v in counts.items()))
    return {k: f"{v[0]}/{v[1]}" for k, v in counts.items()}


def costs(a, sources: dict) -> dict[str, float]:
    """Seconds to translate documents in-process against the same text as plain lines, a document at a time:
    every --cost-every-th document (a sample of each collection), --rounds rounds, the two jobs back to back
    in each in rotated order; the ratio is the median of the rounds' ratios (a slow spell of a shared machine
    falls on both jobs of a round)."""
    from seqtool import textpolicy
    from seqtool.documents import parse
    from seqtool.translate import Translator

    translator = Translator.load(a.checkpoint, device="cpu", precision="fp32", threads=2)
    sample = list(sources.values())[:: a.cost_every]
    # the same text as plain lines, a document at a time (as a user would translate its text): each unit a line
    lines = [[u.text.replace("\n", " ") for u in parse(text, format).units] for text, format in sample]
    jobs = {"documents": lambda: [translator.translate_document(text, format) for text, format in sample],
            "plain": lambda: [translator.translate_lines(0, each, policy=textpolicy.TextPolicy()) for each in lines]}
    jobs["plain"]()  # (warm-up)
    times: dict[str, list[float]] = {k: [] for k in jobs}
    for r in range(a.rounds):
        for k in list(jobs)[r % 2:] + list(jobs)[: r % 2]:
            start = time.perf_counter()
            jobs[k]()
            times[k].append(time.perf_counter() - start)
    ratios = sorted(d / p for d, p in zip(times["documents"], times["plain"]))
    log(f"cost on {len(sample)} documents, seconds per round: " + ", ".join(f"{k} {' '.join(f'{x:.1f}' for x in v)}" for k, v in times.items()))
    return {"documents": sorted(times["documents"])[a.rounds // 2], "plain": sorted(times["plain"])[a.rounds // 2],
            "ratio": ratios[len(ratios) // 2], "documents_n": len(sample)}


if __name__ == "__main__":
    sys.exit(subprocess.call([sys.executable, str(Path(__file__).with_name("documents.py")), "--real", *sys.argv[1:]]))
