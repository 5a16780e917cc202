"""Terminology benchmark: lexically constrained decoding against free decoding, beside fairseq's.

For each test line, 1-3 words of the reference that the free (unconstrained) beam-5 output misses
become that line's constraints (lines whose free output misses none get none). Then, with the
same model and lines: term usage (constraints found in the output as whole words, of those
given: all fit the length limit), BLEU and chrF free and constrained, and decoding speed
(constrained / free, the translate call only, after a warm-up). fairseq runs the same lines and
constraints with its own model of the cpu-small protocol (fairseq-interactive --constraints).

    python bench/constraints.py --checkpoint WORK/ckpt-bf16/best.pt [--fairseq-work WORK/fairseq-work]
                                [--loc-checkpoint CKPT | --loc-minutes 5] [--lines 600]

Run it on an idle machine; it prints the CPU's capability with the table (stdout), progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import sacrebleu
import torch

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data"
WORD = re.compile(r"\w{4,}")


def log(msg: str) -> None:
    print(f"[constraints {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pick_constraints(ref: str, hyp: str, rng: random.Random) -> list[str]:
    """Up to 3 words (4+ letters) of the reference that the free output lacks, in reference order."""
    missing = []
    for w in WORD.findall(ref):
        if w not in missing and not re.search(rf"(?<!\w){re.escape(w)}(?!\w)", hyp):
            missing.append(w)
    if not missing:
        return []
    chosen = set(rng.sample(missing, min(len(missing), rng.randint(1, 3))))
    return [w for w in missing if w in chosen]


def used(hyp: str, phrase: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(phrase)}(?!\w)", hyp) is not None


def repeated(hyps: list[str], cons: list[list[str]]) -> int:
    """Constraints that appear more than once (as whole words) in their line's output."""
    return sum(len(re.findall(rf"(?<!\w){re.escape(p)}(?!\w)", h)) > 1 for h, c in zip(hyps, cons) for p in c)


def score(hyps: list[str], refs: list[str]) -> tuple[float, float]:
    return sacrebleu.corpus_bleu(hyps, [refs]).score, sacrebleu.corpus_chrf(hyps, [refs]).score


def seqtool_run(ckpt: Path, srcs: list[str], refs: list[str], threads: int, seed: int) -> tuple[dict, list[list[str]]]:
    from seqtool.config import DecodeConfig
    from seqtool.translate import Translator

    t = Translator.load(ckpt, beam=5, device="cpu", threads=threads)
    t.translate(srcs[:16])  # warm-up
    t0 = time.perf_counter()
    free = t.translate(srcs)
    free_s = time.perf_counter() - t0
    rng = random.Random(seed)
    cons = [pick_constraints(r, h, rng) for r, h in zip(refs, free)]
    t.translate(srcs[:16], constraints=cons[:16])
    t0 = time.perf_counter()
    held = t.translate(srcs, constraints=cons)
    held_s = time.perf_counter() - t0
    n = sum(len(c) for c in cons)
    kept = sum(used(h, p) for h, c in zip(held, cons) for p in c)
    fb, fc = score(free, refs)
    cb, cc = score(held, refs)
    fig = {"precision": t.config.precision, "lines": len(srcs), "lines_with_constraints": sum(1 for c in cons if c),
           "constraints": n, "used": kept, "usage": kept / max(n, 1), "repeated": repeated(held, cons), "free_bleu": fb, "free_chrf": fc,
           "bleu": cb, "chrf": cc, "free_sent_s": len(srcs) / free_s, "sent_s": len(srcs) / held_s,
           "speed_ratio": free_s / held_s}
    return fig, cons


def fairseq_run(work: Path, srcs: list[str], refs: list[str], cons: list[list[str]], out: Path, threads: int) -> dict:
    """fairseq-interactive on the same lines, free and with the same constraints (its own model)."""
    exe = Path(os.environ.get("FAIRSEQ_VENV", "/tmp/peers/venv")) / "bin" / "fairseq-interactive"
    if not exe.exists():
        log(f"fairseq: {exe} not found (bash ../shared/peers/install.sh); skipped")
        return {}
    # torch >= 2.6 loads weights only by default; fairseq 0.12 checkpoints hold argparse objects (its own files)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    fig: dict = {"lines": len(srcs), "lines_with_constraints": sum(1 for c in cons if c)}
    for name, with_constraints in (("free", False), ("held", True)):
        lines = ["\t".join([s, *c]) if with_constraints else s for s, c in zip(srcs, cons)]
        cmd = [str(exe), str(work / "bin"), "--task", "translation", "--source-lang", "es", "--target-lang", "en",
               "--path", str(work / "ckpt" / "checkpoint_best.pt"), "--cpu", "--beam", "5", "--lenpen", "1.0",
               "--batch-size", "64", "--buffer-size", "1024", "--bpe", "sentencepiece",
               "--sentencepiece-model", str(work / "spm" / "spm.model")]
        if with_constraints:
            cmd += ["--constraints", "unordered"]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, input="\n".join(lines) + "\n", capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t0
        (out / f"fairseq-{name}.out").write_text(r.stdout)
        (out / f"fairseq-{name}.err").write_text(r.stderr)
        if r.returncode != 0:
            log(f"fairseq {name}: exit {r.returncode}: {r.stderr.strip().splitlines()[-1:]}")
            return fig
        hyps = {}
        for row in r.stdout.splitlines():
            if row.startswith("D-"):
                k, _, text = row.split("\t", 2)
                hyps[int(k[2:])] = text
        got = [hyps.get(i, "") for i in range(len(srcs))]
        m = re.search(r"translation time: ([\d.]+)", r.stderr + r.stdout)
        fig[f"{name}_s"] = float(m.group(1)) if m else wall
        fig[f"{name}_bleu"], fig[f"{name}_chrf"] = score(got, refs)
        if with_constraints:
            n = sum(len(c) for c in cons)
            fig["used"] = sum(used(h, p) for h, c in zip(got, cons) for p in c)
            fig["repeated"] = repeated(got, cons)
            fig["usage"] = fig["used"] / max(n, 1)
    if "held_s" in fig:
        fig["speed_ratio"] = fig["free_s"] / fig["held_s"]
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, required=True, help="a bible-es-en seqtool checkpoint")
    ap.add_argument("--fairseq-work", type=Path, help="the fairseq WORK of the cpu-small protocol (bin, ckpt, spm)")
    ap.add_argument("--loc-checkpoint", type=Path, help="an en-de checkpoint of the localisation data")
    ap.add_argument("--loc-minutes", type=float, default=0, help="else train one for this long (0: skip the data set)")
    ap.add_argument("--lines", type=int, default=600)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=HERE / "out" / "constraints")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(a.threads)
    cpu = torch.backends.cpu.get_cpu_capability()
    rows = []

    def lines(d: Path, s: str, t: str) -> tuple[list[str], list[str]]:
        src = (d / f"test.{s}").read_text(encoding="utf-8").splitlines()[: a.lines]
        ref = (d / f"test.{t}").read_text(encoding="utf-8").splitlines()[: a.lines]
        return src, ref

    src, ref = lines(DATA / "bible-es-en", "es", "en")
    log(f"bible-es-en: {len(src)} lines, seqtool")
    fig, cons = seqtool_run(a.checkpoint, src, ref, a.threads, a.seed)
    rows.append(("bible-es-en", "seqtool", fig))
    (a.out / "bible-constraints.jsonl").write_text("".join(json.dumps(c, ensure_ascii=False) + "\n" for c in cons), encoding="utf-8")
    if a.fairseq_work:
        log("bible-es-en: fairseq-interactive, free and --constraints unordered")
        rows.append(("bible-es-en", "fairseq 0.12 (its own model)", fairseq_run(a.fairseq_work, src, ref, cons, a.out, a.threads)))
    loc = a.loc_checkpoint
    if loc is None and a.loc_minutes > 0:
        D = DATA / "loc-en-de"
        loc = a.out / "loc-ckpt" / "best.pt"
        if not loc.exists():
            log(f"loc-en-de: training seqtool --arch small for {a.loc_minutes:g} minutes")
            subprocess.run([sys.executable, "-m", "seqtool", "train", "--src", "en", "--tgt", "de", "--train", D / "train",
                            "--valid", D / "valid", "--arch", "small", "--max-time", f"{a.loc_minutes:g}m", "--threads",
                            str(a.threads), "--save-dir", a.out / "loc-ckpt"], check=True)
    if loc is not None:
        src, ref = lines(DATA / "loc-en-de", "en", "de")
        log(f"loc-en-de: {len(src)} lines, seqtool")
        fig, cons = seqtool_run(loc, src, ref, a.threads, a.seed)
        rows.append(("loc-en-de", "seqtool", fig))

    def f(x, d=1):
        return "-" if x is None else f"{x:,.{d}f}"

    print(f"\n## constraints, {time.strftime('%Y-%m-%d %H:%M')}, CPU capability {cpu}, {a.threads} threads, beam 5, "
          f"first {a.lines} test lines, 1-3 reference words the free output misses per line\n")
    print("| data | system | lines with constraints | constraints used | used more than once | BLEU free / constrained "
          "| chrF free / constrained | sentences/s free / constrained | speed constrained / free |")
    print("|---|---|---|---|---|---|---|---|---|")
    for data, system, g in rows:
        if not g:
            print(f"| {data} | {system} | did not run | | | | | | |")
            continue
        if system == "seqtool":
            print(f"| {data} | seqtool ({g['precision']}) | {g['lines_with_constraints']} | {g['used']} / {g['constraints']} "
                  f"({100 * g['usage']:.2f}%) | {g['repeated']} | {f(g['free_bleu'], 2)} / {f(g['bleu'], 2)} | {f(g['free_chrf'], 2)} / {f(g['chrf'], 2)} "
                  f"| {f(g['free_sent_s'])} / {f(g['sent_s'])} | {g['speed_ratio']:.2f}x |")
        else:
            speed = [f(g["lines"] / g[k]) if k in g else "-" for k in ("free_s", "held_s")]
            print(f"| {data} | {system} | {g['lines_with_constraints']} | {g.get('used', '-')} ({100 * g.get('usage', 0):.2f}%) "
                  f"| {g.get('repeated', '-')} "
                  f"| {f(g.get('free_bleu'), 2)} / {f(g.get('held_bleu'), 2)} | {f(g.get('free_chrf'), 2)} / {f(g.get('held_chrf'), 2)} "
                  f"| {speed[0]} / {speed[1]} | {f(g.get('speed_ratio'), 2)}x |")
    (a.out / "figures.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
