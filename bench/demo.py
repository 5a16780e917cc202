#!/usr/bin/env python
"""The README demo's recipe, chosen by measurement: train on the bundled Bible corpus for a few
minutes with one setting per variant, translate the test set as scripts/demo.sh does, score.

    python bench/demo.py --variant small-v8k-t4096-lr1e-3 --variant small-v8k-t2048-lr2e-3 ...
    python bench/demo.py --minutes 20 --variant defaults      # seqtool's own defaults, 20 minutes

A variant's name says its settings: ARCH-vSIZE-tTOKENS-lrLR[-wWARMUP][-dDROPOUT][-pre][-emaDECAY]
[-SCHEDULE][-fp32][-avx2] (vocabulary in thousands; "defaults" = nothing but --arch small). -avx2 runs with torch, oneDNN and MKL held
to AVX2 (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS): the closest this
machine gets to an AVX2-only CPU. Each variant runs the demo's commands (train on raw files,
translate test.es.gz with beam 5 and --max-len-a 1.5 --max-len-b 10, sacrebleu) in processes of
their own, 2 threads, one after another; run nothing else meanwhile. Rows are appended to
bench/results.md with the CPU's capability; work files go to bench/out/demo-<time>/.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data" / "bible-es-en"
VALUED = ((r"lr(\d+(?:\.\d+)?e-\d+)", "--lr"), (r"w(0\.\d+|\d+)", "--warmup"), (r"ema(0\.\d+|0)", "--ema-decay"),
          (r"d(0(?:\.\d+)?)", "--dropout"))
SWITCHES = (("pre", ("--pre-norm",)), ("fp32", ("--precision", "fp32")),
            *((name, ("--lr-schedule", name)) for name in ("inverse-sqrt", "linear", "cosine", "wsd")))
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def cpu_line(env: dict) -> str:
    probe = ("import torch; from seqtool.device import cpu_bf16_instructions as b; "
             "print(torch.backends.cpu.get_cpu_capability(), b() or 'no bf16 instructions')")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=REPO)
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown CPU")
    return f"{model}, torch capability {out.stdout.strip()}"


def parse_variant(name: str) -> tuple[list[str], dict]:
    """Settings from a name like small-v8k-t2048-lr2e-3-cosine-fp32-avx2."""
    if name == "defaults":
        return ["--arch", "small"], {}
    args, env = [], {}
    parts = name.split("-")
    args += ["--arch", parts[0]]
    rest = "-".join(parts[1:])
    for key, flag, scale in (("v", "--vocab-size", 1000), ("t", "--max-tokens", 1)):
        m = re.search(rf"(?:^|-){key}(\d+)(k?)(?=-|$)", rest)
        if m:
            args += [flag, str(int(m.group(1)) * (scale if m.group(2) else 1))]
    for pattern, flag in VALUED:  # name fragment -> option with the fragment's value
        m = re.search(rf"(?:^|-){pattern}(?=-|$)", rest)
        if m:
            args += [flag, m.group(1)]
    for word, options in SWITCHES:  # name fragment -> fixed options
        if re.search(rf"(?:^|-){word}(?=-|$)", rest):
            args += list(options)
    if re.search(r"(?:^|-)avx2(?=-|$)", rest):
        env.update(AVX2_ENV)
    return args, env


def run_variant(name: str, minutes: float, work: Path, caps: list[str]) -> dict:
    extra, extra_env = parse_variant(name)
    env = {**os.environ, **extra_env, "PYTHONUNBUFFERED": "1"}
    save = work / name
    seqtool = [sys.executable, "-m", "seqtool"]
    started = time.monotonic()
    train = subprocess.run([*seqtool, "train", "--src", "es", "--tgt", "en", "--train", str(DATA / "train"),
                            "--valid", str(DATA / "valid"), "--max-time", f"{minutes:g}m", "--save-dir", str(save),
                            "--threads", "2", *extra], capture_output=True, text=True, env=env, cwd=REPO)
    (work / f"{name}.train.log").write_text(train.stderr)
    if train.returncode:
        raise SystemExit(f"{name}: train failed:\n{train.stderr[-3000:]}")
    trained = time.monotonic()
    hyp = save / "test.hyp"
    translate = subprocess.run([*seqtool, "translate", "-c", str(save / "best.pt"), "-i", str(DATA / "test.es.gz"),
                                "-o", str(hyp), "--beam", "5", *caps, "--threads", "2"],
                               capture_output=True, text=True, env=env, cwd=REPO)
    if translate.returncode:
        raise SystemExit(f"{name}: translate failed:\n{translate.stderr[-3000:]}")
    translated = time.monotonic()
    score = subprocess.run([*seqtool, "score", "--ref", str(DATA / "test.en.gz"), "--hyp", str(hyp), "--json"],
                           capture_output=True, text=True, env=env, cwd=REPO)
    scores = {k.lower(): v["score"] for k, v in json.loads(score.stdout).items()}
    summary = re.search(r"(\d+) updates, ([\d.]+) epochs in (\d+)s \(([\d,]+) target tokens/s\); best valid loss ([\d.]+)",
                        train.stderr)
    records = [json.loads(x) for x in (save / "metrics.jsonl").read_text().splitlines()]
    valids = [r for r in records if r["kind"] == "valid"]
    ema = next((r for r in records if r["kind"] == "valid_ema"), None)
    precision = re.search(r"precision (\w+), threads", train.stderr)
    return {
        "variant": name, "args": " ".join(extra), "precision": precision.group(1) if precision else "?",
        "updates": int(summary.group(1)), "epochs": float(summary.group(2)), "train_s": int(summary.group(3)),
        "tokens_per_s": int(summary.group(4).replace(",", "")), "best_valid_loss": float(summary.group(5)),
        "last_valid_loss": valids[-1]["loss"] if valids else None, "validations": len(valids),
        "valid_seconds": sum(r.get("valid_seconds") or 0 for r in valids),
        "ema_loss": ema["loss"] if ema else None, "ema_kept": ema["kept"] if ema else None,
        "bleu": scores["bleu"], "chrf": scores["chrf"],
        "train_wall_s": trained - started, "translate_s": translated - trained, "total_s": time.monotonic() - started,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", action="append", required=True)
    parser.add_argument("--minutes", type=float, default=4.0)
    parser.add_argument("--work", type=Path)
    parser.add_argument("--no-results", action="store_true", help="do not append to bench/results.md")
    parser.add_argument("--translate-caps", default="--max-len-a 1.5 --max-len-b 10",
                        help="translate's length caps (the demo's); '' for translate's defaults")
    a = parser.parse_args()
    work = a.work or REPO / "bench" / "out" / f"demo-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    work.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    rows = []
    for name in a.variant:
        cpu = cpu_line({**os.environ, **parse_variant(name)[1]})
        print(f"[{datetime.datetime.now():%H:%M:%S}] {name} ({cpu})", file=sys.stderr, flush=True)
        r = run_variant(name, a.minutes, work, a.translate_caps.split())
        r["cpu"] = cpu
        rows.append(r)
        print(json.dumps(r), flush=True)
        (work / "rows.jsonl").open("a").write(json.dumps(r) + "\n")
    header = (f"\n## demo recipe, {datetime.datetime.now():%Y-%m-%d %H:%M}, commit {commit}, {a.minutes:g} min training, "
              f"2 threads, test set beam 5 ({a.translate_caps or 'no length caps'})\n\n"
              "| variant | settings | CPU (torch capability, bf16 instructions) | precision | updates (epochs) | tok/s | "
              "validations (s) | best valid loss | EMA valid loss (kept) | test BLEU | chrF | train + translate (s) |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = [f"| {r['variant']} | `{r['args']}` | {r['cpu']} | {r['precision']} | {r['updates']} ({r['epochs']:.2f}) | "
             f"{r['tokens_per_s']:,} | {r['validations']} ({r['valid_seconds']:.0f}) | {r['best_valid_loss']:.3f} | "
             + (f"{r['ema_loss']:.3f} ({'yes' if r['ema_kept'] else 'no'})" if r['ema_loss'] is not None else "-")
             + f" | {r['bleu']:.2f} | {r['chrf']:.2f} | {r['train_wall_s']:.0f} + {r['translate_s']:.0f} |" for r in rows]
    table = header + "\n".join(lines) + "\n"
    print(table)
    if not a.no_results:
        with open(REPO / "bench" / "results.md", "a") as handle:
            handle.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
