#!/usr/bin/env python
"""Decoding speed, memory and quality of one checkpoint: seqtool fp32 / int8 / bf16 and
CTranslate2 fp32 / int8 on the same model (exported with `seqtool export`), beam 5 and beam 1,
in one run on the same threads; prints one markdown table and appends it to bench/results.md.

Each decode is a subprocess of this script under `/usr/bin/time -v` (peak RSS of the whole
process); the figure timed is the translation call alone (model loading and tokenizer set-up
excluded, as fairseq and the peers' CTranslate2 script report it). See bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

from cpu_small import FAILURES, REPO, log, read_json, run, split_file

# seqtool: (precision, quantize, workers). workers 2 = `--workers 2`: two decoding processes of one
# thread each (seqtool's throughput mode, as CTranslate2's inter_threads).
SEQTOOL = {"seqtool fp32": ("fp32", "none", 1), "seqtool int8": ("fp32", "int8", 1), "seqtool bf16": ("bf16", "none", 1),
           "seqtool int8 workers2": ("fp32", "int8", 2), "seqtool bf16 workers2": ("bf16", "none", 2),
           "seqtool fp32 workers2": ("fp32", "none", 2)}
# CTranslate2: (compute type, inter_threads). inter 1 runs one batch at a time on all the threads
# (as seqtool does); inter 2 runs two batches at once, one thread each: CTranslate2's throughput
# mode, faster on this 2-core machine, so it is measured too and the table compares with both.
CT2 = {"ct2 fp32": ("float32", 1), "ct2 int8": ("int8", 1), "ct2 fp32 inter2": ("float32", 2), "ct2 int8 inter2": ("int8", 2)}
VARIANTS = list(SEQTOOL) + list(CT2)
DEFAULT_VARIANTS = [v for v in VARIANTS if v not in ("ct2 int8 inter2", "seqtool fp32 workers2")]


def _tree_rss_mib(pid: int) -> float:
    """Resident memory of a process and all its descendants (Linux /proc), MiB."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                total += next((int(l.split()[1]) for l in f if l.startswith("VmRSS:")), 0)
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return total / 1024


class _PeakTreeRss:
    """Samples _tree_rss_mib of this process every 0.1 s: /usr/bin/time's peak RSS counts one process,
    and --workers decodes in several."""

    def __init__(self):
        import threading

        self.peak, self.stop = 0.0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.wait(0.1):
            self.peak = max(self.peak, _tree_rss_mib(os.getpid()))

    def done(self) -> float:
        self.stop.set()
        self.thread.join()
        return round(max(self.peak, _tree_rss_mib(os.getpid())), 1)


def _read(path: str) -> list[str]:
    return Path(path).read_text(encoding="utf-8").splitlines()


def _write(path: str, hyps: list[str]) -> None:
    Path(path).write_text("".join(h + "\n" for h in hyps), encoding="utf-8")


def decode_seqtool(ckpt, src, beam, threads, prec, quantize, workers, batch, hyp_out, json_out) -> None:
    """Helper process: Translator.translate_chunk over all lines, timed alone (with --workers,
    the worker processes are started and loaded before the clock starts, as the model is)."""
    from seqtool.translate import Translator

    rss = _PeakTreeRss() if int(workers) > 1 else None
    lines = _read(src)
    with Translator.load(Path(ckpt), beam=int(beam), lenpen=1.0, batch_size=int(batch), max_len_a=0.0, max_len_b=200,
                         device="cpu", precision=prec, quantize=quantize, threads=int(threads), workers=int(workers),
                         chunk_lines=max(1, len(lines))) as translator:
        t0 = time.perf_counter()
        out = translator.translate_chunk(0, lines)
        sec = time.perf_counter() - t0
        figures = {"peak_rss_all_processes_mib": rss.done()} if rss else {}
    ntok = sum(len(t.hypotheses[0].tokens) + 1 if t.hypotheses else 1 for t in out)  # pieces + EOS
    _write(hyp_out, [t.texts[0] if t.texts else "" for t in out])
    Path(json_out).write_text(json.dumps({"sentences": len(out), "target_tokens_incl_eos": ntok, "decode_seconds": round(sec, 3),
                                          **figures}))


def decode_ct2(model_dir, src, beam, threads, compute_type, inter, batch, hyp_out, json_out) -> None:
    """Helper process: ctranslate2.Translator.translate_batch over all lines, timed alone."""
    import ctranslate2
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(Path(model_dir) / "sentencepiece.model"))
    pieces = [sp.encode(x, out_type=str) for x in _read(src)]
    inter = int(inter)  # batches decoded at once, each on threads / inter threads
    tr = ctranslate2.Translator(str(model_dir), device="cpu", compute_type=compute_type, inter_threads=inter,
                                intra_threads=max(1, int(threads) // inter))
    t0 = time.perf_counter()
    res = tr.translate_batch(pieces, beam_size=int(beam), length_penalty=1.0, max_batch_size=int(batch), batch_type="examples",
                             max_decoding_length=200)
    sec = time.perf_counter() - t0
    hyps = [r.hypotheses[0] for r in res]
    _write(hyp_out, [sp.decode(h) for h in hyps])
    Path(json_out).write_text(json.dumps({"sentences": len(hyps), "target_tokens_incl_eos": sum(len(h) + 1 for h in hyps),
                                          "decode_seconds": round(sec, 3)}))


def score(hyp: Path, ref: Path) -> dict:
    import sacrebleu

    h, r = _read(str(hyp)), _read(str(ref))
    if len(h) != len(r):
        return {"lines_mismatch": f"{len(h)} hypotheses for {len(r)} references"}
    return {"bleu": sacrebleu.corpus_bleu(h, [r]).score, "chrf": sacrebleu.corpus_chrf(h, [r]).score}


def f(x, nd=0) -> str:
    return "—" if x is None else f"{x:,.{nd}f}"


def tokens(row: dict) -> str:
    """Target tokens/s; over several rounds the median, with the slowest and fastest round."""
    rounds = row.get("rounds_tokens_per_s") or []
    return f(row.get("tokens_per_s")) + (f" ({min(rounds):,}-{max(rounds):,})" if len(rounds) > 1 else "")


def table(rows: list[dict]) -> str:
    out = ["| system | beam | sentences/s | target tokens/s | x seqtool fp32 | x ct2 fp32 | x ct2 fp32 inter2 | peak RSS (MiB) | BLEU | chrF "
           "| ΔBLEU vs seqtool fp32 | lines ≠ seqtool fp32 |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        def same_beam(system: str) -> dict:
            return next((x for x in rows if x["beam"] == r["beam"] and x["system"] == system), {})

        base, ct2, ct2_inter = same_beam("seqtool fp32"), same_beam("ct2 fp32"), same_beam("ct2 fp32 inter2")
        rel = lambda other: f"{r['tokens_per_s'] / other['tokens_per_s']:.2f}x" if r.get("tokens_per_s") and other.get("tokens_per_s") else "—"
        d = r["bleu"] - base["bleu"] if r.get("bleu") is not None and base.get("bleu") is not None else None
        out.append(f"| {r['system']} | {r['beam']} | {f(r.get('sentences_per_s'), 1)} | {tokens(r)} | {rel(base)} | {rel(ct2)} | {rel(ct2_inter)} | "
                   f"{f(r.get('peak_rss_mib'))} | {f(r.get('bleu'), 2)} | {f(r.get('chrf'), 2)} | {'—' if d is None else f'{d:+.2f}'} | "
                   f"{f(r.get('lines_differing_from_fp32'))} |")
    return "\n".join(out)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] in ("--_seqtool", "--_ct2"):
        (decode_seqtool if sys.argv[1] == "--_seqtool" else decode_ct2)(*sys.argv[2:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, required=True, help="a cpu-small best.pt (e.g. WORK/ckpt-fp32/best.pt of cpu_small.py)")
    p.add_argument("--data", type=Path, default=REPO / "data" / "bible-es-en", help="dir with test.{SRC,TGT}[.gz] (default: data/bible-es-en)")
    p.add_argument("--src", default="es")
    p.add_argument("--tgt", default="en")
    p.add_argument("--limit", type=int, default=0, help="decode only the first N test lines (0 = all 2,251); for smoke tests")
    p.add_argument("--threads", type=int, default=2, help="threads for every system, and OMP/MKL_NUM_THREADS (default 2)")
    p.add_argument("--batch-size", type=int, default=64, help="sentences per batch, every system (default 64)")
    p.add_argument("--beams", default="5,1", help="comma list (default 5,1)")
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                   help=f"comma list of: {', '.join(VARIANTS)} (default all but ct2 int8 inter2 and seqtool fp32 workers2)")
    p.add_argument("--repeats", type=int, default=1,
                   help="rounds of every variant, in rotated order; the table gives the median round (default 1)")
    p.add_argument("--ct2-isa", default="AVX512", help="CT2_FORCE_CPU_ISA for CTranslate2 ('' = its own choice; default AVX512, its best here)")
    p.add_argument("--work", type=Path, help="scratch dir (default bench/out/translate-<timestamp>)")
    a = p.parse_args()
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    if bad := [v for v in variants if v not in VARIANTS]:
        p.error(f"--variants: unknown {bad}; choose from {VARIANTS}")
    beams = [int(b) for b in a.beams.split(",")]
    W = (a.work or REPO / "bench" / "out" / f"translate-{datetime.datetime.now():%Y%m%d-%H%M%S}").resolve()
    W.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads), PYTHONPATH=str(REPO))
    ckpt = a.checkpoint.resolve()

    from seqtool.textio import read_lines

    src_lines = list(read_lines(split_file(a.data.resolve(), "test", a.src)))
    ref_lines = list(read_lines(split_file(a.data.resolve(), "test", a.tgt)))
    if a.limit:
        src_lines, ref_lines = src_lines[: a.limit], ref_lines[: a.limit]
    src, ref = W / "test.src", W / "test.ref"
    src.write_text("".join(x + "\n" for x in src_lines), encoding="utf-8")
    ref.write_text("".join(x + "\n" for x in ref_lines), encoding="utf-8")
    log(f"work dir {W}: {len(src_lines)} test lines, variants {variants}, beams {beams}, {a.threads} threads")

    ct2_dir = W / "ct2"
    if any(v in CT2 for v in variants):
        try:
            import ctranslate2  # noqa: F401
        except ImportError:
            log("ctranslate2 is not installed: CTranslate2 columns skipped (pip install 'seqtool[ctranslate2]')")
            variants = [v for v in variants if v not in CT2]
        else:
            r = run("export", [sys.executable, "-m", "seqtool", "export", ckpt, ct2_dir, "--format", "ctranslate2", "--force"], W / "logs", env)
            if not r["ok"]:
                variants = [v for v in variants if v not in CT2]

    rows = []
    for beam in beams:
        beam_rows = {v: {"system": v, "beam": beam, "rounds_tokens_per_s": []} for v in variants}
        for rnd in range(a.repeats):
            # each round runs every variant once, in a rotated order: a slow spell of the machine
            # then falls on different variants in different rounds, and the medians compare
            order = variants[rnd % len(variants):] + variants[: rnd % len(variants)]
            for v in order:
                name = f"{v.replace(' ', '-')}-b{beam}"
                hyp, js = W / f"hyp-{name}", W / f"{name}.json"
                if v in SEQTOOL:
                    cmd = [sys.executable, Path(__file__).resolve(), "--_seqtool", ckpt, src, beam, a.threads, *SEQTOOL[v], a.batch_size, hyp, js]
                    venv = env
                else:
                    cmd = [sys.executable, Path(__file__).resolve(), "--_ct2", ct2_dir, src, beam, a.threads, *CT2[v], a.batch_size, hyp, js]
                    venv = dict(env, CT2_FORCE_CPU_ISA=a.ct2_isa) if a.ct2_isa else env
                r = run(name if a.repeats == 1 else f"{name} (round {rnd + 1})", cmd, W / "logs", venv)
                row = beam_rows[v]
                figures = read_json(js) if r["ok"] else None
                if not figures:
                    continue
                rss = figures.pop("peak_rss_all_processes_mib", None) or r.get("peak_rss_mib")  # several processes: all together
                row["peak_rss_mib"] = max(row.get("peak_rss_mib") or 0, rss or 0) or None
                row["rounds_tokens_per_s"].append(round(figures["target_tokens_incl_eos"] / figures["decode_seconds"]))
                if "bleu" not in row:
                    row.update(**score(hyp, ref))
                row.update(figures, sentences_per_s=figures["sentences"] / figures["decode_seconds"],
                           tokens_per_s=figures["target_tokens_incl_eos"] / figures["decode_seconds"])
        for row in beam_rows.values():
            if len(row["rounds_tokens_per_s"]) > 1:  # the median round's figures
                times = sorted(row["rounds_tokens_per_s"])
                median = times[len(times) // 2] if len(times) % 2 else (times[len(times) // 2 - 1] + times[len(times) // 2]) / 2
                row["sentences_per_s"] *= median / row["tokens_per_s"]
                row["tokens_per_s"] = median
            rows.append(row)
        base = W / f"hyp-seqtool-fp32-b{beam}"
        if base.exists():
            for row in rows:
                h = W / f"hyp-{row['system'].replace(' ', '-')}-b{beam}"
                if row["beam"] == beam and h.exists():
                    x, y = _read(str(h)), _read(str(base))
                    row["lines_differing_from_fp32"] = sum(i != j for i, j in zip(x, y)) + abs(len(x) - len(y))

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?") if os.path.exists("/proc/cpuinfo") else "?"
    commit = os.popen(f"git -C {REPO} rev-parse --short HEAD").read().strip()
    text = (f"## translate, {datetime.datetime.now():%Y-%m-%d %H:%M}, commit {commit}, {cpu}, {a.threads} threads, "
            f"{len(src_lines)} test lines{' (--limit)' if a.limit else ''}, batch {a.batch_size}, checkpoint {ckpt}"
            f"{f', median of {a.repeats} rounds' if a.repeats > 1 else ''}"
            f"{', CT2_FORCE_CPU_ISA=' + a.ct2_isa if a.ct2_isa else ''}\n\n" + table(rows) + "\n")
    if FAILURES:
        text += f"\nFailed steps: {', '.join(FAILURES)} (logs in {W / 'logs'})\n"
    (W / "summary.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "rows": rows, "failures": FAILURES}, indent=1))
    with open(REPO / "bench" / "results.md", "a") as out:
        out.write("\n" + text)
    print(text)
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
