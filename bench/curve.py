#!/usr/bin/env python
"""A learning curve: validation perplexity against wall-clock minutes, seqtool beside fairseq.

    python bench/curve.py --seqtool bench/out/default-20m/defaults --seqtool-bleu 19.1 \
        [--fairseq-log RES/train.log] --out bench/learning-curve.png

seqtool's points are the "valid" records of RUN/metrics.jsonl (perplexity of the unsmoothed NLL,
at the training seconds of each validation, validation time included). fairseq's come from its
train log (--log-format simple: each epoch's valid ppl at that epoch's wall time) when one is
given, else from the two runs of the cpu-small protocol recorded in shared/PEERS.md (20 and 60
minutes of training on this machine kind). Test BLEU (beam 5), when given, labels the last point.
Needs matplotlib (pip install 'seqtool[plot]').
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

# shared/PEERS.md, "The same protocol with 60 minutes of training (fairseq, measured)"
PEERS_FAIRSEQ = {"minutes": [20.0, 60.0], "ppl": [75.3, 15.0], "bleu": [5.27, 18.80]}


def seqtool_points(run: Path) -> tuple[list[float], list[float]]:
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in records if r["kind"] == "valid" and r.get("ppl")]
    return [r["seconds"] / 60 for r in valid], [r["ppl"] for r in valid]


def fairseq_points(log: Path) -> tuple[list[float], list[float]]:
    minutes, ppl, wall = [], [], None
    for line in log.read_text(errors="replace").splitlines():
        if "| train | epoch" in line:
            m = re.search(r"\| wall (\d+(?:\.\d+)?)", line)
            wall = float(m.group(1)) if m else wall
        elif "| valid | epoch" in line:
            m = re.search(r"\| ppl (\d+(?:\.\d+)?)", line)
            w = re.search(r"\| wall (\d+(?:\.\d+)?)", line)
            at = float(w.group(1)) if w else wall
            if m and at is not None:
                minutes.append(at / 60)
                ppl.append(float(m.group(1)))
    return minutes, ppl


COLORS = ["#1f6feb", "#8250df", "#1a7f37", "#bf8700"]


def plot(runs: list, fairseq_log, fairseq_bleu, out: Path, title: str) -> None:
    """runs: (run dir, label, test BLEU or None) for each seqtool run; fairseq_log: its train log or None (then
    PEERS.md's two runs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=110)
    for i, ((run, label, bleu), color) in enumerate(zip(runs, COLORS)):
        x, y = seqtool_points(run)
        ax.plot(x, y, "o-", color=color, label=label, markersize=4)
        if bleu is not None and x:  # stacked above the last points, inside the axes
            ax.annotate(f"test BLEU {bleu:.1f}", (x[-1], y[-1]), textcoords="offset points", xytext=(-6, 10 + 14 * i),
                        ha="right", color=color)
    if fairseq_log:
        fx, fy = fairseq_points(fairseq_log)
        ax.plot(fx, fy, "s-", color="#cf222e", label="fairseq 0.12.3, cpu-small protocol (this run)", markersize=4)
        if fairseq_bleu is not None and fx:
            ax.annotate(f"test BLEU {fairseq_bleu:.1f}", (fx[-1], fy[-1]), textcoords="offset points", xytext=(-10, 12),
                        ha="right", color="#cf222e")
    else:
        p = PEERS_FAIRSEQ
        ax.plot(p["minutes"], p["ppl"], "s", color="#cf222e",  # two separate runs: no line between them
                label="fairseq 0.12.3, cpu-small protocol (20- and 60-minute runs, shared/PEERS.md)")
        for m, v, b in zip(p["minutes"], p["ppl"], p["bleu"]):
            ax.annotate(f"test BLEU {b:.1f}", (m, v), textcoords="offset points", xytext=(0, 10), ha="center", color="#cf222e")
    ax.set_yscale("log")
    ax.set_xlabel("wall-clock minutes of training (validation included)")
    ax.set_ylabel("validation perplexity (log scale)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqtool", type=Path, action="append", required=True, help="a seqtool run directory (metrics.jsonl); repeatable")
    parser.add_argument("--seqtool-label", action="append", help="its legend label (one per --seqtool)")
    parser.add_argument("--seqtool-bleu", type=float, action="append", help="its test BLEU, beam 5 (one per --seqtool)")
    parser.add_argument("--fairseq-log", type=Path, help="fairseq-train log of the cpu-small protocol (default: PEERS.md's runs)")
    parser.add_argument("--fairseq-bleu", type=float, help="its test BLEU, beam 5 (with --fairseq-log)")
    parser.add_argument("--title", default="bible-es-en, 2 CPU threads: validation perplexity against training time")
    parser.add_argument("--out", type=Path, default=Path("bench/learning-curve.png"))
    a = parser.parse_args()
    labels = a.seqtool_label or ["seqtool, default recipe (train on raw files, --arch small)"]
    bleus = a.seqtool_bleu or []
    runs = [(run, labels[i] if i < len(labels) else run.name, bleus[i] if i < len(bleus) else None) for i, run in enumerate(a.seqtool)]
    plot(runs, a.fairseq_log, a.fairseq_bleu, a.out, a.title)
    print(a.out)


if __name__ == "__main__":
    main()
