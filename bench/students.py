#!/usr/bin/env python
"""Fast students (issue 29): a teacher distilled into a deep-encoder, shallow-decoder student with
`seqtool train --teacher`, in one run on an idle machine.

    python bench/students.py --teacher runs/small20/best.pt            # the teacher given
    python bench/students.py --train-teacher                           # or trained here (20 minutes)
    python bench/students.py --data ../shared/data/loc-en-de --src en --tgt de --train-teacher

- shapes: decoding speed of candidate student shapes (random weights of the teacher's width and
  vocabulary, greedy, every output forced to 40 tokens, the first 500 test lines): why the student
  preset has the shape it has (quality needs a training run per shape; speed does not);
- teacher: the model of `seqtool train --src S --tgt T --train .. --valid .. --arch small --max-time 20m`;
- student: `seqtool train ... --teacher TEACHER --arch student --max-time 20m` on the same raw files:
  the teachers' pass (its time reported apart) and the training;
- decoding the test set, whole process (`seqtool translate`, load included, /usr/bin/time), the
  teacher at beam 5 and the student with its own recorded defaults; also the translate call alone
  (load excluded), the student in int8 and bf16, and CTranslate2 (exported with `seqtool export`)
  on both models in its best modes;
- goals: student BLEU >= teacher - 1.0; whole-process decoding >= 5x the teacher's at beam 5 (the
  check holds it at 3x: exit 1 below); distillation + training <= 30 minutes; the student's decode
  >= 3x CTranslate2's best mode on the teacher.

Prints the CPU's capability and one markdown table, appended to bench/results.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import time
from pathlib import Path

from cpu_small import FAILURES, REPO, log, read_json, run, split_file
from translate import score  # bench/translate.py: BLEU and chrF of a hypothesis file

SHAPES = [(3, 3), (6, 1), (6, 2), (8, 2), (4, 1)]  # (encoder, decoder) layers at the teacher's width
FORCED = 40  # output tokens per sentence in the shape measurement
CHECK_SPEEDUP = 3.0  # the bench fails below this whole-process speed-up (the goal is 5x)


def shape_speed(teacher: str, src: str, enc: int, dec: int, threads: int, json_out: str) -> None:
    """Helper process: greedy decoding of random weights of one shape, every output FORCED tokens."""
    import torch

    from seqtool import checkpoint
    from seqtool.config import DecodeConfig, ModelConfig, SearchOptions
    from seqtool.model import Transformer
    from seqtool.translate import Translator
    from seqtool.tokenizer import Tokenizer

    torch.set_num_threads(int(threads))
    ckpt = checkpoint.load(Path(teacher))
    config = ModelConfig.from_dict(ckpt["model_config"]).replace(encoder_layers=int(enc), decoder_layers=int(dec), dropout=0.0)
    torch.manual_seed(0)
    model = Transformer(config).eval()
    translator = Translator(model, Tokenizer(checkpoint.tokenizer_bytes(ckpt)), DecodeConfig(),
                            torch.device("cpu"), options=SearchOptions(beam=1, min_len=FORCED, max_len=FORCED, loop_guard=0))
    lines = Path(src).read_text(encoding="utf-8").splitlines()[:500]
    translator.translate_chunk(0, lines[:64])  # warm-up
    t0 = time.perf_counter()
    out = translator.translate_chunk(0, lines)
    sec = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())
    Path(json_out).write_text(json.dumps({"sentences_per_s": len(out) / sec, "parameters": params}))


def summary(err: Path) -> dict:
    """The figures of `seqtool train`'s last line (cli.py) and of its distillation line (distill.py)."""
    text = err.read_text(errors="replace") if err.exists() else ""
    out: dict = {}
    m = re.search(r"(\d+) updates, ([\d.]+) epochs in (\d+)s \(([\d,]+) target tokens/s\)", text)
    if m:
        out.update(updates=int(m.group(1)), epochs=float(m.group(2)), train_s=int(m.group(3)),
                   train_tok_s=int(m.group(4).replace(",", "")))
    m = re.search(r"distillation: ([\d,]+) sentences translated by \d+ teacher\(s\) in (\d+)s", text)
    if m:
        out.update(distill_sentences=int(m.group(1).replace(",", "")), distill_s=int(m.group(2)))
    return out


def f(x, nd=1) -> str:
    return "—" if x is None else f"{x:,.{nd}f}"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--_shape":
        shape_speed(*sys.argv[2:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--teacher", type=Path, help="the teacher's best.pt (seqtool train --arch small --max-time 20m on the raw files)")
    p.add_argument("--train-teacher", action="store_true", help="train the teacher here (--arch small --max-time --teacher-time)")
    p.add_argument("--teacher-time", default="20m")
    p.add_argument("--student-time", default="20m")
    p.add_argument("--data", type=Path, default=REPO / "data" / "bible-es-en")
    p.add_argument("--src", default="es")
    p.add_argument("--tgt", default="en")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--shape", default="", help="ENC-DEC layers of the student instead of the preset's (a --config file sets them)")
    p.add_argument("--distill-from", type=Path, help="an earlier student's SAVE_DIR: its distill/ cache is copied in (same teacher, data and search)")
    p.add_argument("--teacher-only", action="store_true", help="train the student with --teacher-only (not on the references too)")
    p.add_argument("--skip-teacher-rows", action="store_true", help="decode the student only (the teacher's rows are in an earlier table)")
    p.add_argument("--work", type=Path, help="scratch dir (default bench/out/students-<timestamp>); an earlier WORK's student is resumed")
    p.add_argument("--no-results", action="store_true", help="print the table only (smoke runs)")
    a = p.parse_args()
    if not a.teacher and not a.train_teacher:
        p.error("give --teacher CKPT or --train-teacher")
    W = (a.work or REPO / "bench" / "out" / f"students-{datetime.datetime.now():%Y%m%d-%H%M%S}").resolve()
    W.mkdir(parents=True, exist_ok=True)
    logs = W / "logs"
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads), PYTHONPATH=str(REPO))
    st = [sys.executable, "-m", "seqtool"]
    D = a.data.resolve()
    raw = ["--src", a.src, "--tgt", a.tgt, "--train", D / "train", "--valid", D / "valid", "--threads", a.threads]

    sys.path.insert(0, str(REPO))
    from seqtool.device import cpu_bf16_instructions, cpu_capability
    from seqtool.textio import read_lines

    capability = f"{cpu_capability()}{', bf16 instructions' if cpu_bf16_instructions() else ''}"
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    log(f"CPU: {cpu}; torch dispatches {capability}; {a.threads} threads; work dir {W}")
    src, ref = W / "test.src", W / "test.ref"
    src.write_text("".join(x + "\n" for x in read_lines(split_file(D, "test", a.src))), encoding="utf-8")
    ref.write_text("".join(x + "\n" for x in read_lines(split_file(D, "test", a.tgt))), encoding="utf-8")
    n_test = sum(1 for _ in open(src, encoding="utf-8"))

    teacher_fig: dict = {}
    if a.train_teacher:
        r = run("teacher", [*st, "train", *raw, "--arch", "small", "--max-time", a.teacher_time, "--save-dir", W / "teacher"], logs, env)
        teacher_fig = {**summary(Path(r["stderr"])), "wall_s": r["wall_s"]}
        teacher = W / "teacher" / "best.pt"
    else:
        teacher = a.teacher.resolve()

    # -- shapes: speed only ---------------------------------------------------------------------
    shapes = []
    for enc, dec in SHAPES:
        js = W / f"shape-{enc}-{dec}.json"
        r = run(f"shape-{enc}-{dec}", [sys.executable, Path(__file__).resolve(), "--_shape", teacher, src, enc, dec, a.threads, js], logs, env)
        figures = read_json(js) if r["ok"] else None
        if figures:
            shapes.append({"shape": f"{enc}-{dec}", **figures})

    # -- the student ------------------------------------------------------------------------------
    shape = []
    if a.shape:
        enc, dec = (int(x) for x in a.shape.split("-"))
        (W / "student.toml").write_text(f'arch = "student"\n\n[model]\nencoder_layers = {enc}\ndecoder_layers = {dec}\n')
        shape = ["--config", W / "student.toml"]
    if a.distill_from and not (W / "student" / "distill").exists():
        import shutil

        shutil.copytree(a.distill_from.resolve() / "distill", W / "student" / "distill")
        log(f"copied {a.distill_from / 'distill'}: the teacher's translations are not made again")
    t0 = time.perf_counter()
    r = run("student", [*st, "train", *raw, "--teacher", teacher, "--arch", "student", *shape,
                        *(["--teacher-only"] if a.teacher_only else []), "--max-time", a.student_time,
                        "--save-dir", W / "student"], logs, env)
    student_fig = {**summary(Path(r["stderr"])), "wall_s": round(time.perf_counter() - t0, 1), "peak_rss_mib": r.get("peak_rss_mib")}
    student = W / "student" / "best.pt"

    # -- decoding, whole process ------------------------------------------------------------------
    rows = []

    def decode(name: str, ckpt: Path, *options) -> dict:
        hyp = W / f"hyp-{name}"
        r = run(f"translate-{name}", [*st, "translate", "-c", ckpt, "-i", src, "-o", hyp, "--threads", a.threads, *options], logs, env)
        row = {"system": name, "options": " ".join(map(str, options)) or "(its defaults)", "whole_s": r["wall_s"],
               "peak_rss_mib": r.get("peak_rss_mib"), **(score(hyp, ref) if hyp.exists() else {})}
        rows.append(row)
        return row

    t5 = decode("teacher beam 5", teacher, "--beam", "5")
    if not a.skip_teacher_rows:
        decode("teacher beam 1", teacher, "--beam", "1")
    s = decode("student", student)
    decode("student int8", student, "--quantize", "int8")
    decode("student bf16", student, "--precision", "bf16")
    decode("student fp32", student, "--precision", "fp32")
    decode("student beam 5", student, "--beam", "5")

    # -- the translate call alone, and CTranslate2 --------------------------------------------------
    calls = []
    try:
        import ctranslate2  # noqa: F401
        have_ct2 = True
    except ImportError:
        log("ctranslate2 is not installed: its rows are skipped (pip install 'seqtool[ctranslate2]')")
        have_ct2 = False
    helper = Path(__file__).resolve().parent / "translate.py"
    for who, ckpt in ((("teacher", teacher),) if not a.skip_teacher_rows else ()) + (("student", student),):
        beams = (5, 1) if who == "teacher" else (1,)
        for beam in beams:
            for prec, quant in (("fp32", "none"), ("fp32", "int8"), ("bf16", "none")):
                name = f"call-{who}-b{beam}-{prec}-{quant}"
                js = W / f"{name}.json"
                r = run(name, [sys.executable, helper, "--_seqtool", ckpt, src, beam, a.threads, prec, quant, 1, 64, W / f"hyp-{name}", js], logs, env)
                if r["ok"] and (fig := read_json(js)):
                    calls.append({"system": f"seqtool {who} {prec if quant == 'none' else 'int8'}", "beam": beam,
                                  "sentences_per_s": fig["sentences"] / fig["decode_seconds"], **score(W / f"hyp-{name}", ref)})
            if have_ct2:
                ct2_dir = W / f"ct2-{who}"
                if not ct2_dir.exists():
                    run(f"export-{who}", [*st, "export", ckpt, ct2_dir, "--format", "ctranslate2"], logs, env)
                for compute, inter in (("float32", 1), ("int8", 1), ("float32", 2), ("int8", 2)):
                    name = f"call-ct2-{who}-b{beam}-{compute}-inter{inter}"
                    js = W / f"{name}.json"
                    r = run(name, [sys.executable, helper, "--_ct2", ct2_dir, src, beam, a.threads, compute, inter, 64, W / f"hyp-{name}", js],
                            logs, dict(env, CT2_FORCE_CPU_ISA="AVX512"))
                    if r["ok"] and (fig := read_json(js)):
                        calls.append({"system": f"ct2 {who} {compute} inter{inter}", "beam": beam,
                                      "sentences_per_s": fig["sentences"] / fig["decode_seconds"], **score(W / f"hyp-{name}", ref)})

    # -- the table -----------------------------------------------------------------------------------
    speedup = t5["whole_s"] / s["whole_s"] if t5.get("whole_s") and s.get("whole_s") else None
    dbleu = s["bleu"] - t5["bleu"] if s.get("bleu") is not None and t5.get("bleu") is not None else None
    prep = (student_fig.get("distill_s") or 0) + (student_fig.get("train_s") or 0)
    student_call = max((c["sentences_per_s"] for c in calls if c["system"].startswith("seqtool student")), default=None)
    ct2_teacher = max((c["sentences_per_s"] for c in calls if c["system"].startswith("ct2 teacher")), default=None)
    ct2_teacher_b5 = max((c["sentences_per_s"] for c in calls if c["system"].startswith("ct2 teacher") and c["beam"] == 5), default=None)
    commit = os.popen(f"git -C {REPO} rev-parse --short HEAD").read().strip()
    lines = [f"## students, {datetime.datetime.now():%Y-%m-%d %H:%M}, commit {commit}, {cpu}, torch dispatch {capability}, "
             f"{a.threads} threads, {D.name} {a.src}-{a.tgt}, {n_test} test lines, teacher {teacher}", ""]
    lines += ["Student shapes (random weights, greedy, 40 output tokens forced, 500 lines; speed only):", "",
              "| encoder-decoder layers | parameters | sentences/s | x 3-3 |", "|---|---|---|---|"]
    base = next((x["sentences_per_s"] for x in shapes if x["shape"] == "3-3"), None)
    for x in shapes:
        lines.append(f"| {x['shape']} | {x['parameters']:,} | {x['sentences_per_s']:.1f} | "
                     f"{x['sentences_per_s'] / base:.2f}x |" if base else f"| {x['shape']} | {x['parameters']:,} | {x['sentences_per_s']:.1f} | — |")
    lines += ["", f"Training: teacher {json.dumps(teacher_fig) if teacher_fig else '(given)'}; student {json.dumps(student_fig)}; "
              f"distillation + training {prep / 60:.1f} min (goal <= 30)", ""]
    lines += ["Whole process (`seqtool translate -i test -o hyp`, load included):", "",
              "| system | options | seconds | x teacher beam 5 | peak RSS (MiB) | BLEU | chrF |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        x = t5["whole_s"] / r["whole_s"] if r.get("whole_s") and t5.get("whole_s") else None
        lines.append(f"| {r['system']} | {r['options']} | {f(r.get('whole_s'))} | {f(x, 2)}x | {f(r.get('peak_rss_mib'), 0)} | "
                     f"{f(r.get('bleu'), 2)} | {f(r.get('chrf'), 2)} |")
    lines += ["", "The translate call alone (load excluded; bench/translate.py's helpers), sentences/s:", "",
              "| system | beam | sentences/s | BLEU |", "|---|---|---|---|"]
    for c in calls:
        lines.append(f"| {c['system']} | {c['beam']} | {c['sentences_per_s']:.1f} | {f(c.get('bleu'), 2)} |")
    lines += ["", f"Goals: student BLEU - teacher beam-5 BLEU = {f(dbleu, 2)} (>= -1.0); whole-process speed-up "
              f"{f(speedup, 2)}x (goal >= 5, check >= {CHECK_SPEEDUP}); distillation + training {prep / 60:.1f} min (<= 30); "
              f"student's best call {f(student_call)} sentences/s against CTranslate2's best on the teacher "
              f"{f(ct2_teacher)} (any beam) / {f(ct2_teacher_b5)} (beam 5): "
              f"{f(student_call / ct2_teacher if student_call and ct2_teacher else None, 2)}x / "
              f"{f(student_call / ct2_teacher_b5 if student_call and ct2_teacher_b5 else None, 2)}x (goal >= 3)"]
    if FAILURES:
        lines.append(f"\nFailed steps: {', '.join(FAILURES)} (logs in {logs})")
    text = "\n".join(lines) + "\n"
    (W / "summary.json").write_text(json.dumps({"shapes": shapes, "student": student_fig, "teacher": teacher_fig, "rows": rows,
                                                "calls": calls}, indent=1))
    if not a.no_results:
        with open(REPO / "bench" / "results.md", "a") as out:
            out.write("\n" + text)
    print(text)
    return 1 if FAILURES or speedup is None or speedup < CHECK_SPEEDUP else 0


if __name__ == "__main__":
    sys.exit(main())
