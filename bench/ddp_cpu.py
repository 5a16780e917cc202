#!/usr/bin/env python
"""CPU data parallelism: training target tokens/s of 1 process x 1 thread against 2 processes x 1
thread (torchrun, gloo), the `small` preset on bible-es-en, a fixed number of updates each.

The bar (issue 3): 2 ranks within 15% of twice 1 rank, i.e.
    efficiency = tokens/s(2 ranks) / (2 x tokens/s(1 rank)) >= 0.85.
Each rank trains on its own --max-tokens batch, so an update of 2 ranks holds twice the tokens;
tokens/s counts the target tokens of every rank (what `seqtool train` logs on rank 0).

Throughput comes from WORK/<run>/metrics.jsonl with one record per update (log_interval = 0):
the tokens and seconds of updates --skip+1 .. --updates, so start-up, the first updates and the
final validation/checkpoint are left out. See bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def log(msg: str) -> None:
    print(f"[{datetime.datetime.now():%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def find_data(given: str | None) -> Path:
    for candidate in ([Path(given)] if given else [REPO / "data" / "bible-es-en", REPO.parent / "shared" / "data" / "bible-es-en"]):
        if any((candidate / f"train.es{gz}").exists() for gz in ("", ".gz")):
            return candidate
    sys.exit(f"no bible-es-en data (train.es[.gz]) in {given or 'data/bible-es-en or ../shared/data/bible-es-en'}")


def step(name: str, command: list, work: Path, env: dict) -> None:
    """Run a seqtool command; its output goes to WORK/logs/NAME.err; stop the bench if it fails."""
    (work / "logs").mkdir(parents=True, exist_ok=True)
    err = work / "logs" / f"{name}.err"
    log(f"{name}: {' '.join(map(str, command))}")
    with open(err, "w") as handle:
        rc = subprocess.call([str(c) for c in command], stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    if rc != 0:
        sys.exit(f"{name} failed (exit {rc}); see {err}:\n" + "".join(err.read_text(errors="replace").splitlines(True)[-15:]))


def prepare(data: Path, work: Path, env: dict) -> Path:
    bin_dir = work / "bin"
    if (bin_dir / "meta.json").exists():
        log(f"reusing {bin_dir}")
        return bin_dir
    seqtool = [sys.executable, "-m", "seqtool"]
    files = [next(p for p in (data / f"train.{lang}", data / f"train.{lang}.gz") if p.exists()) for lang in ("es", "en")]
    step("train-tokenizer", seqtool + ["train-tokenizer", *files, "--model-prefix", work / "spm", "--vocab-size", 8000, "--force"], work, env)
    step("binarize", seqtool + ["binarize", "--src", "es", "--tgt", "en", "--train", data / "train", "--valid", data / "valid",
                                "--tokenizer", work / "spm.model", "--out", bin_dir, "--workers", 2, "--force"], work, env)
    return bin_dir


def throughput(metrics: Path, skip: int) -> tuple[float, int, float]:
    """(tokens/s, tokens, seconds) over the updates after the first `skip`, from per-update records."""
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    tokens, seconds = 0.0, 0.0
    for previous, record in zip(train, train[1:]):
        if record["update"] <= skip:
            continue
        duration = record["seconds"] - previous["seconds"]
        tokens += record["tokens_per_s"] * duration  # the record's window is this one update
        seconds += duration
    if seconds <= 0:
        sys.exit(f"{metrics}: too few updates after --skip {skip} to measure anything")
    return tokens / seconds, round(tokens), seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="bible-es-en directory (default: data/bible-es-en, else ../shared/data/bible-es-en)")
    parser.add_argument("--work", type=Path, help="work directory (default bench/out/ddp-cpu-<time>)")
    parser.add_argument("--arch", default="small")
    parser.add_argument("--max-tokens", type=int, default=4096, help="per process")
    parser.add_argument("--updates", type=int, default=60)
    parser.add_argument("--skip", type=int, default=5, help="first updates left out of the figure")
    parser.add_argument("--record", action="store_true", help="append the table to bench/results.md")
    a = parser.parse_args()
    work = a.work or REPO / "bench" / "out" / f"ddp-cpu-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    work.mkdir(parents=True, exist_ok=True)
    # one thread per process, everywhere (torch, OpenMP, MKL)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("SEQTOOL_FAULT", None)
    bin_dir = prepare(find_data(a.data), work, env)
    (work / "log.toml").write_text("[train]\nlog_interval = 0.0\n")  # one metrics record per update
    common = ["train", bin_dir, "--arch", a.arch, "--max-tokens", a.max_tokens, "--max-updates", a.updates, "--threads", 1,
              "--device", "cpu", "--precision", "fp32", "--config", work / "log.toml"]
    results = {}
    for ranks in (1, 2):
        save = work / f"ranks-{ranks}"
        if save.exists():  # seqtool would resume it
            shutil.rmtree(save)
        launcher = [sys.executable, "-m", "seqtool"] if ranks == 1 else \
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", ranks, "-m", "seqtool"]
        started = time.monotonic()
        step(f"train-{ranks}-ranks", launcher + common + ["--save-dir", save], work, env)
        rate, tokens, seconds = throughput(save / "metrics.jsonl", a.skip)
        results[ranks] = {"tokens_per_s": rate, "tokens": tokens, "seconds": seconds, "wall_s": time.monotonic() - started}
        log(f"{ranks} rank(s) x 1 thread: {rate:,.0f} target tokens/s ({tokens:,} tokens in {seconds:.1f}s after update {a.skip})")
    efficiency = results[2]["tokens_per_s"] / (2 * results[1]["tokens_per_s"])
    table = "\n".join([
        f"## ddp-cpu, {datetime.datetime.now():%Y-%m-%d %H:%M}, {a.arch}, --max-tokens {a.max_tokens} per rank, "
        f"updates {a.skip + 1}-{a.updates}, fp32",
        "",
        "| processes x threads | target tokens/s | tokens measured | seconds |",
        "|---|---|---|---|",
        *(f"| {r} x 1 | {v['tokens_per_s']:,.0f} | {v['tokens']:,} | {v['seconds']:.1f} |" for r, v in results.items()),
        "",
        f"efficiency = tokens/s(2 ranks) / (2 x tokens/s(1 rank)) = {efficiency:.3f}; bar: >= 0.85 "
        f"(within 15% of twice 1 rank): {'MET' if efficiency >= 0.85 else 'NOT MET'}",
        "",
    ])
    print(table)
    (work / "summary.json").write_text(json.dumps({"results": results, "efficiency": efficiency}, indent=2) + "\n")
    if a.record:
        with open(REPO / "bench" / "results.md", "a") as handle:
            handle.write("\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
