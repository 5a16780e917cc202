#!/usr/bin/env python
"""Run the "cpu-small" protocol of /work/shared/PEERS.md for seqtool end to end, and optionally
fairseq beside it, then print (and append to bench/results.md) one comparison table.

Every step is a subprocess wrapped in `/usr/bin/time -v` (peak RSS), with OMP/MKL threads pinned.
Logs go to WORK/logs/, all raw figures to WORK/summary.json. A failing step is reported and the
rest goes on with what it can. Nothing outside WORK is deleted. See bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEERS = (REPO / ".." / "shared" / "peers").resolve()
TIME = "/usr/bin/time" if os.path.exists("/usr/bin/time") else None
FAILURES: list[str] = []


def log(msg: str) -> None:
    print(f"[{datetime.datetime.now():%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def time_report(path: Path) -> dict:
    """Peak RSS (MiB) and wall seconds from the last `/usr/bin/time -v` block in a file."""
    out: dict = {}
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return out
    rss = re.findall(r"Maximum resident set size \(kbytes\): (\d+)", text)
    wall = re.findall(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
    if rss:
        out["peak_rss_mib"] = round(int(rss[-1]) / 1024, 1)
    if wall:
        out["wall_s"] = round(sum(float(p) * 60 ** i for i, p in enumerate(reversed(wall[-1].split(":")))), 2)
    return out


def run(name: str, cmd: list, logs: Path, env: dict, timed: bool = True) -> dict:
    """Run cmd; stdout/stderr in logs/NAME.out/.err, the time -v report in logs/NAME.time."""
    logs.mkdir(parents=True, exist_ok=True)
    out, err, tfile = (logs / f"{name}.{x}" for x in ("out", "err", "time"))
    cmd = [str(c) for c in cmd]
    full = [TIME, "-v", "-o", str(tfile)] + cmd if timed and TIME else cmd
    log(f"{name}: {shlex.join(cmd)}")
    t0 = time.perf_counter()
    try:
        with open(out, "w") as o, open(err, "w") as e:
            rc = subprocess.call(full, stdout=o, stderr=e, env=env, cwd=REPO)
    except OSError as error:
        rc = -1
        err.write_text(f"{error}\n")
    r = {"step": name, "rc": rc, "ok": rc == 0, "wall_s": round(time.perf_counter() - t0, 2), "stderr": str(err)}
    r.update({k: v for k, v in time_report(tfile).items() if k == "peak_rss_mib"})
    if rc != 0:
        FAILURES.append(name)
        tail = "".join(err.read_text(errors="replace").replace("\r", "\n").splitlines(True)[-8:])
        log(f"{name} FAILED (exit {rc}); end of {err}:\n{tail}")
    else:
        log(f"{name}: done in {r['wall_s']:.1f}s, peak RSS {r.get('peak_rss_mib', '?')} MiB")
    return r


def split_file(data: Path, split: str, lang: str) -> Path:
    for p in (data / f"{split}.{lang}", data / f"{split}.{lang}.gz"):
        if p.exists():
            return p
    raise SystemExit(f"error: {data}/{split}.{lang}(.gz): no such file")


def read_json(path: Path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


# ---- seqtool ------------------------------------------------------------------------------
def seqtool_prepare(a, W: Path, env: dict) -> dict:
    st = [sys.executable, "-m", "seqtool"]
    if a.skip_train and (W / "spm.model").exists() and (W / "bin" / "meta.json").exists():
        log("reusing WORK/spm.model and WORK/bin (--skip-train)")
        return {}
    D, s, t = a.data, a.src, a.tgt
    prep = {"tokenizer": run("train-tokenizer", st + ["train-tokenizer", split_file(D, "train", s), split_file(D, "train", t),
                                                      "--model-prefix", W / "spm", "--vocab-size", 8000, "--character-coverage", 1.0,
                                                      "--model-type", "bpe", "--force"], W / "logs", env)}
    prep["binarize"] = run("binarize", st + ["binarize", "--src", s, "--tgt", t, "--train", D / "train", "--valid", D / "valid",
                                             "--test", D / "test", "--tokenizer", W / "spm.model", "--out", W / "bin",
                                             "--workers", 2, "--force"], W / "logs", env)
    return prep


def seqtool_train(a, W: Path, prec: str, env: dict) -> dict:
    ck, logs = W / f"ckpt-{prec}", W / "logs"
    if a.skip_train:
        return train_figures({"step": f"train-{prec}", "reused": True, **time_report(logs / f"train-{prec}.time")}, logs / f"train-{prec}.err", ck)
    if ck.exists():  # seqtool would resume from last.pt: keep the old run aside, inside WORK
        ck.rename(ck.with_name(f"{ck.name}.old-{datetime.datetime.now():%Y%m%d-%H%M%S}"))
    r = run(f"train-{prec}", [sys.executable, "-m", "seqtool", "train", W / "bin", "--save-dir", ck, "--arch", "small",
                              "--max-tokens", 4096, "--lr", "1e-3", "--warmup", 1000, "--lr-schedule", "inverse-sqrt", "--label-smoothing", 0.1,
                              "--dropout", 0.1, "--clip-norm", 1.0, "--max-time", f"{a.minutes:g}m", "--precision", prec,
                              "--device", "cpu", "--seed", 1, "--threads", a.threads], logs, env)
    return train_figures(r, logs / f"train-{prec}.err", ck)


def seqtool_train_defaults(a, W: Path, env: dict) -> dict:
    """seqtool's own recipe: `seqtool train` on the raw files with --arch small and the time budget, nothing else
    set (its tokenizer, schedule, precision auto, batch size); not like-for-like with fairseq, what a user gets."""
    ck, logs, D = W / "ckpt-default", W / "logs", a.data
    if ck.exists():
        ck.rename(ck.with_name(f"{ck.name}.old-{datetime.datetime.now():%Y%m%d-%H%M%S}"))
    r = run("train-default", [sys.executable, "-m", "seqtool", "train", "--src", a.src, "--tgt", a.tgt, "--train", D / "train",
                              "--valid", D / "valid", "--arch", "small", "--max-time", f"{a.minutes:g}m", "--save-dir", ck,
                              "--threads", a.threads], logs, env)
    return train_figures(r, logs / "train-default.err", ck)


def train_figures(r: dict, err: Path, ck: Path) -> dict:
    # "N updates, E epochs in Ss (T target tokens/s); best valid loss L; stopped by ..." (cli.py `train`)
    try:
        text = err.read_text(errors="replace")
    except OSError:
        text = ""
    m = re.findall(r"(\d+) updates, ([\d.]+) epochs in ([\d.]+)s \(([\d,.]+) target tokens/s\); best valid loss (\S+?);", text)
    if m:
        u, e, sec, tps, _ = m[-1]
        r.update(updates=int(u), epochs=float(e), train_seconds=float(sec), train_tokens_per_s=float(tps.replace(",", "")))
    valid = []
    for line in open(ck / "metrics.jsonl") if (ck / "metrics.jsonl").exists() else []:
        rec = json.loads(line)
        if rec.get("kind") == "valid" and rec.get("loss") is not None and not math.isnan(rec["loss"]):
            valid.append(rec)
    if valid:
        best = min(valid, key=lambda v: v["loss"])
        r.update(best_valid_loss=best["loss"], best_valid_ppl=math.exp(min(best["nll"], 50)), best_valid_update=best["update"],
                 valid=[{k: v.get(k) for k in ("update", "loss", "nll", "ppl", "seconds")} for v in valid])
        r.setdefault("updates", valid[-1]["update"])  # no summary line (e.g. --skip-train without logs)
    return r


def decode_only(ckpt, src, beam, threads, precision, hyp_out, json_out) -> None:
    """Helper process (--_decode-only): time translator.translate(lines) alone, like fairseq's own figure."""
    from seqtool.textio import read_lines
    from seqtool.translate import Translator

    t0 = time.perf_counter()
    translator = Translator.load(Path(ckpt), beam=int(beam), lenpen=1.0, batch_size=64, max_len_a=0.0, max_len_b=200,
                                 device="cpu", precision=precision, threads=int(threads))
    load_s = time.perf_counter() - t0
    lines = list(read_lines(Path(src)))
    t0 = time.perf_counter()
    hyps = translator.translate(lines)
    sec = time.perf_counter() - t0
    ntok = sum(len(translator.tokenizer.encode(h)) + 1 for h in hyps)  # pieces + EOS
    Path(hyp_out).write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    Path(json_out).write_text(json.dumps({"sentences": len(hyps), "target_tokens_incl_eos": ntok, "decode_seconds": round(sec, 3),
                                          "precision": translator.config.precision,
                                          "sentences_per_s": round(len(hyps) / sec, 2), "tokens_per_s": round(ntok / sec, 1),
                                          "load_seconds": round(load_s, 3)}))


def seqtool_decode(a, W: Path, prec: str, beam: int, env: dict, decode_precision: str = "") -> dict:
    """Decode the test set with the model trained in `prec` (in --decode-precision, or `decode_precision`)."""
    decode_precision = decode_precision or a.decode_precision
    ck, logs = W / f"ckpt-{prec}" / "best.pt", W / "logs"
    name = f"{prec}-b{beam}" + ("" if decode_precision == a.decode_precision else f"-{decode_precision}")
    if not ck.exists():
        log(f"decode {name}: no {ck}, skipped")
        FAILURES.append(f"decode-{name} (no best.pt)")
        return {}
    test_src, test_ref, hyp = split_file(a.data, "test", a.src), split_file(a.data, "test", a.tgt), W / f"hyp-{name}"
    r: dict = {}
    cli = run(f"translate-{name}", [sys.executable, "-m", "seqtool", "translate", "-c", ck, "--input", test_src, "--output", hyp,
                                    "--beam", beam, "--lenpen", 1.0, "--batch-size", 64, "--max-len-a", 0, "--max-len-b", 200,
                                    "--device", "cpu", "--precision", decode_precision, "--threads", a.threads], logs, env)
    r.update(process_wall_s=cli["wall_s"], peak_rss_mib=cli.get("peak_rss_mib"), ok=cli["ok"])
    inproc = run(f"decode-call-{name}", [sys.executable, Path(__file__).resolve(), "--_decode-only", ck, test_src, beam, a.threads,
                                         decode_precision, W / f"{hyp.name}.inproc", W / f"decode-{name}.json"], logs, env)
    if inproc["ok"]:
        r.update(read_json(W / f"decode-{name}.json") or {}, decode_call_peak_rss_mib=inproc.get("peak_rss_mib"))
        if hyp.exists():
            a_lines = hyp.read_text(encoding="utf-8").splitlines()
            b_lines = (W / f"{hyp.name}.inproc").read_text(encoding="utf-8").splitlines()
            r["lines_differing_cli_vs_decode_call"] = sum(x != y for x, y in zip(a_lines, b_lines)) + abs(len(a_lines) - len(b_lines))
    if hyp.exists():
        sc = run(f"score-{name}", [sys.executable, "-m", "seqtool", "score", "--ref", test_ref, "--hyp", hyp,
                                   "--metrics", "bleu,chrf", "--json"], logs, env, timed=False)
        js = read_json(logs / f"score-{name}.out") if sc["ok"] else None
        if js:
            r.update(bleu=js["bleu"]["score"], chrf=js["chrf"]["score"])
    return r


# ---- fairseq ------------------------------------------------------------------------------
def run_fairseq(a, W: Path, env: dict) -> Path | None:
    venv = Path(a.fairseq_venv)
    if not (venv / "bin" / "activate").exists():
        log(f"fairseq skipped: no virtualenv at {venv}; install it with: bash {os.path.relpath(PEERS / 'install.sh', REPO)}"
            f"  (from {REPO}; VENV={venv})")
        FAILURES.append("fairseq (venv missing)")
        return None
    data = a.data
    if any(not (data / f"{s}.{l}").exists() for s in ("train", "valid", "test") for l in (a.src, a.tgt)):
        data = W / "data-plain"  # run_fairseq.sh and sacrebleu read plain files
        data.mkdir(parents=True, exist_ok=True)
        for s in ("train", "valid", "test"):
            for l in (a.src, a.tgt):
                f = split_file(a.data, s, l)
                with (gzip.open(f, "rb") if f.suffix == ".gz" else open(f, "rb")) as i, open(data / f"{s}.{l}", "wb") as o:
                    shutil.copyfileobj(i, o)
    res = W / "fairseq"
    fenv = dict(env, VENV=str(venv), DATA=str(data), RES=str(res), WORK=str(W / "fairseq-work"),
                STOP_HOURS=f"{a.minutes / 60:.6g}", SRC=a.src, TGT=a.tgt)
    run("fairseq", ["bash", PEERS / "run_fairseq.sh", *a.fairseq_stages.split(",")], W / "logs", fenv, timed=False)
    return res


def fairseq_figures(res: Path) -> dict:
    r: dict = {"results_dir": str(res)}
    ts = read_json(res / "train_summary.json")
    if ts:
        r.update(updates=ts.get("num_updates"), train_tokens_per_s=ts.get("target_tokens_per_s_overall"),
                 train_seconds=ts.get("done_training_seconds"), epochs=ts.get("epochs_logged"))
        losses = [(x, i) for i, x in enumerate(ts.get("valid_loss") or []) if x is not None]
        if losses:
            best, i = min(losses)
            ppl = (ts.get("valid_ppl") or [None] * (i + 1))[i]
            r.update(best_valid_loss=best * math.log(2), best_valid_ppl=ppl)  # fairseq logs bits
    try:  # fractional epochs: "epoch 001:     50 / 246 ..." gives the updates per epoch
        per_epoch = re.findall(r"epoch \d+:\s+\d+ / (\d+)", (res / "train.log").read_text(errors="replace"))
        if per_epoch and r.get("updates"):
            r["epochs"] = round(r["updates"] / int(per_epoch[-1]), 2)
    except OSError:
        pass
    r["train_peak_rss_mib"] = time_report(res / "train.log").get("peak_rss_mib")
    r["prep"] = {"tokenizer": time_report(res / "spm.log"), "binarize": time_report(res / "preprocess.log")}
    for b in (5, 1):
        d: dict = {}
        g = read_json(res / f"fairseq_b{b}.json") or {}
        d.update(sentences=g.get("sentences"), sentences_per_s=g.get("sentences_per_s"), tokens_per_s=g.get("tokens_per_s_incl_eos"),
                 decode_seconds=g.get("generate_seconds"))
        tr = time_report(res / f"fairseq_gen_b{b}.err")
        d.update(process_wall_s=tr.get("wall_s"), peak_rss_mib=tr.get("peak_rss_mib"))
        sc = read_json(res / f"fairseq_b{b}.score.json")
        for item in (sc if isinstance(sc, list) else [sc] if isinstance(sc, dict) else []):
            name = str(item.get("name", "")).lower()
            if name.startswith("bleu") or name.startswith("chrf"):
                d["bleu" if name.startswith("bleu") else "chrf"] = item.get("score")
        r[f"b{b}"] = d
    return r


# ---- report -------------------------------------------------------------------------------
def f(x, nd=0, sep=True) -> str:
    if x is None:
        return "—"
    return f"{x:,.{nd}f}" if sep else f"{x:.{nd}f}"


def ratio(x, y) -> str:
    return f"{x / y:.2f}x" if x and y else "—"


def table(cols: dict) -> str:
    """cols: column title -> figures dict (seqtool's and fairseq's share keys)."""
    def row(label, fn):
        return f"| {label} | " + " | ".join(fn(c) for c in cols.values()) + " |"
    b = lambda c, k: c.get(k) or {}
    prep = lambda c, k: (c.get("prep") or {}).get(k) or {}
    fs = next((c for t, c in cols.items() if t.startswith("fairseq")), None)
    rows = ["| figure | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols),
            row("train updates (epochs)", lambda c: f"{f(c.get('updates'))} ({f(c.get('epochs'), 2)})"),
            row("train target tokens/s (incl. EOS, wall incl. validation)", lambda c: f(c.get("train_tokens_per_s"))),
            row("best valid loss (label-smoothed, nats) / ppl", lambda c: f"{f(c.get('best_valid_loss'), 3)} / {f(c.get('best_valid_ppl'), 1)}"),
            row("peak RSS training (MiB)", lambda c: f(c.get("train_peak_rss_mib"))),
            row("test BLEU / chrF, beam 5", lambda c: f"{f(b(c, 'b5').get('bleu'), 2)} / {f(b(c, 'b5').get('chrf'), 2)}"),
            row("test BLEU / chrF, beam 1", lambda c: f"{f(b(c, 'b1').get('bleu'), 2)} / {f(b(c, 'b1').get('chrf'), 2)}"),
            row("beam 5: sentences/s, target tokens/s (decode call)", lambda c: f"{f(b(c, 'b5').get('sentences_per_s'), 1)}, {f(b(c, 'b5').get('tokens_per_s'))}"),
            row("beam 1: sentences/s, target tokens/s (decode call)", lambda c: f"{f(b(c, 'b1').get('sentences_per_s'), 1)}, {f(b(c, 'b1').get('tokens_per_s'))}"),
            row("beam 5 in seqtool's `--precision auto`: its choice; sentences/s, target tokens/s; BLEU", lambda c: "—" if not b(c, "b5auto") else
                f"{b(c, 'b5auto').get('precision', '?')}; {f(b(c, 'b5auto').get('sentences_per_s'), 1)}, {f(b(c, 'b5auto').get('tokens_per_s'))}; "
                f"{f(b(c, 'b5auto').get('bleu'), 2)}"),
            row("whole process wall, beam 5 / beam 1 (s)", lambda c: f"{f(b(c, 'b5').get('process_wall_s'), 1)} / {f(b(c, 'b1').get('process_wall_s'), 1)}"),
            row("peak RSS decoding, beam 5 / beam 1 (MiB)", lambda c: f"{f(b(c, 'b5').get('peak_rss_mib'))} / {f(b(c, 'b1').get('peak_rss_mib'))}"),
            row("tokenizer / binarize wall (s)", lambda c: f"{f(prep(c, 'tokenizer').get('wall_s'), 1)} / {f(prep(c, 'binarize').get('wall_s'), 1)}")]
    if fs:
        same = lambda c: c is fs
        rows += [row("ratio seqtool/fairseq: train tokens/s", lambda c: "—" if same(c) else ratio(c.get("train_tokens_per_s"), fs.get("train_tokens_per_s"))),
                 row("ratio seqtool/fairseq: decode tokens/s, beam 5 / beam 1", lambda c: "—" if same(c) else
                     f"{ratio(b(c, 'b5').get('tokens_per_s'), b(fs, 'b5').get('tokens_per_s'))} / {ratio(b(c, 'b1').get('tokens_per_s'), b(fs, 'b1').get('tokens_per_s'))}"),
                 row("ratio seqtool/fairseq: decode tokens/s, beam 5 in seqtool's `--precision auto`", lambda c: "—" if same(c) else
                     ratio(b(c, 'b5auto').get('tokens_per_s'), b(fs, 'b5').get('tokens_per_s')))]
    return "\n".join(rows)


def header(a) -> str:
    def sh(*cmd):
        try:
            return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True).stdout.strip()
        except OSError:
            return "?"
    commit = sh("git", "rev-parse", "--short", "HEAD") + ("+dirty" if sh("git", "status", "--porcelain", "--untracked-files=no") else "")
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?") if os.path.exists("/proc/cpuinfo") else "?"
    cap = sh(sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())")
    cpu += f" (torch capability {cap or '?'})"
    return (f"## cpu-small, {datetime.datetime.now():%Y-%m-%d %H:%M}, commit {commit}, {cpu}, {a.minutes:g} min training, "
            f"{a.threads} threads, decode {a.decode_precision}")


def write_curve(a, W: Path, summary: dict, precs: list, res) -> None:
    """bench/curve.py's picture of this run: every seqtool run beside fairseq's (its train log)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        log("learning curve skipped: no matplotlib (pip install 'seqtool[plot]')")
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import curve

    runs = []
    for name, label in [(p, f"seqtool {p}, protocol settings") for p in precs] + [("default", "seqtool defaults (raw files, --arch small)")]:
        fig = summary["seqtool"].get(name)
        if fig and (W / f"ckpt-{name}" / "metrics.jsonl").exists():
            runs.append((W / f"ckpt-{name}", label, (fig.get("b5") or {}).get("bleu")))
    fs = summary.get("fairseq") or {}
    flog = Path(res) / "train.log" if res is not None and (Path(res) / "train.log").exists() else None
    out = a.curve or W / "learning-curve.png"
    curve.plot(runs, flog, (fs.get("b5") or {}).get("bleu"), out,
               f"bible-es-en, {a.threads} CPU threads, {a.minutes:g} min each: validation perplexity against training time")
    log(f"learning curve: {out}")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--_decode-only":
        decode_only(*sys.argv[2:9])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=REPO / "data" / "bible-es-en", help="dir with {train,valid,test}.{SRC,TGT}[.gz] (default: the repo's data/bible-es-en)")
    p.add_argument("--src", default="es", help="source language (default es)")
    p.add_argument("--tgt", default="en", help="target language (default en)")
    p.add_argument("--work", type=Path, help="scratch dir (default bench/out/cpu-small-<timestamp>)")
    p.add_argument("--minutes", type=float, default=20, help="training wall clock per run (default 20)")
    p.add_argument("--precision", action="append", help="training precision: fp32, bf16 (repeat or comma list; default fp32)")
    p.add_argument("--decode-precision", default="fp32", help="precision of seqtool decoding (default fp32)")
    p.add_argument("--threads", type=int, default=2, help="torch threads and OMP/MKL_NUM_THREADS (default 2)")
    p.add_argument("--skip-train", action="store_true", help="reuse spm.model, bin/ and ckpt-<prec>/ in --work")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--with-fairseq", action="store_true", help="also run peers/run_fairseq.sh spm bin train gen")
    g.add_argument("--fairseq-res", type=Path, help="read fairseq figures from this run_fairseq.sh RES dir instead")
    p.add_argument("--fairseq-stages", default="spm,bin,train,gen",
                   help="run_fairseq.sh stages for --with-fairseq (default spm,bin,train,gen; with --skip-train, 'gen' "
                        "decodes again with the fairseq model already in --work, so both decoders are timed in one run)")
    p.add_argument("--default-recipe", action="store_true",
                   help="also train seqtool with its own defaults on the raw files (--arch small, same minutes) and decode it, beam 5")
    p.add_argument("--curve", type=Path, help="learning-curve PNG (validation ppl against minutes) of the runs (default WORK/learning-curve.png)")
    p.add_argument("--fairseq-venv", default="/tmp/peers/venv", help="virtualenv for --with-fairseq (default /tmp/peers/venv)")
    a = p.parse_args()
    precs = [x.strip() for v in (a.precision or ["fp32"]) for x in v.split(",") if x.strip()]
    if bad := [x for x in precs if x not in ("fp32", "bf16", "fp16")]:
        p.error(f"--precision: unknown {bad}")
    if a.skip_train and not a.work:
        p.error("--skip-train needs --work pointing at an earlier run")
    a.data = a.data.resolve()
    W = (a.work or REPO / "bench" / "out" / f"cpu-small-{datetime.datetime.now():%Y%m%d-%H%M%S}").resolve()
    W.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    log(f"work dir {W}, data {a.data}, precisions {precs}, {a.minutes:g} min")

    summary: dict = {"args": {k: str(v) for k, v in vars(a).items()}, "seqtool": {}}
    prep = seqtool_prepare(a, W, env)
    for prec in precs:
        fig = seqtool_train(a, W, prec, env)
        fig["train_peak_rss_mib"] = fig.pop("peak_rss_mib", None)
        fig["prep"] = prep
        for beam in (5, 1):
            fig[f"b{beam}"] = seqtool_decode(a, W, prec, beam, env)
        if a.decode_precision != "auto":  # also what a user's `translate` decodes in on this CPU
            fig["b5auto"] = seqtool_decode(a, W, prec, 5, env, "auto")
        summary["seqtool"][prec] = fig
    if a.default_recipe:
        fig = seqtool_train_defaults(a, W, env)
        fig["train_peak_rss_mib"] = fig.pop("peak_rss_mib", None)
        fig["b5"] = seqtool_decode(a, W, "default", 5, env)
        summary["seqtool"]["default"] = fig
    res = run_fairseq(a, W, env) if a.with_fairseq else a.fairseq_res
    if res is not None and not Path(res).is_dir():
        log(f"fairseq figures: {res} is not a directory")
        FAILURES.append(f"fairseq figures ({res} missing)")
    elif res is not None:
        summary["fairseq"] = fairseq_figures(Path(res).resolve())
    summary["failures"] = FAILURES
    cols = {f"seqtool {p}": summary["seqtool"][p] for p in precs}
    if "default" in summary["seqtool"]:
        cols["seqtool defaults"] = summary["seqtool"]["default"]
    if "fairseq" in summary:
        cols["fairseq 0.12.3"] = summary["fairseq"]
    text = header(a) + ("" if "fairseq" not in summary else f" (fairseq from {summary['fairseq']['results_dir']})") + "\n\n" + table(cols) + "\n"
    if FAILURES:
        text += f"\nFailed or skipped steps: {', '.join(FAILURES)} (logs in {W / 'logs'})\n"
    (W / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    write_curve(a, W, summary, precs, res)
    with open(REPO / "bench" / "results.md", "a") as out:
        out.write("\n" + text)
    print(text)
    log(f"raw figures: {W / 'summary.json'}; table appended to bench/results.md")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
