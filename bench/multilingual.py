#!/usr/bin/env python
"""Many languages, one model (issue 30): es-en (bible) and en-de (loc) in one model against two
bilingual models trained for the same compute in all, in one run on an idle machine.

    python bench/multilingual.py                       # 20 minutes multilingual, 2 x 10 minutes bilingual
    python bench/multilingual.py --minutes 4           # a quicker look (2 x 2 minutes bilingual)
    python bench/multilingual.py --temperatures 5 1    # the default T=5 checked, T=1 (proportional) beside it

- multilingual: `seqtool train --corpus es-en:BIBLE/train --corpus en-de:LOC/train --valid-corpus ...
  --arch small --max-time 20m` (one joint tokenizer, target tags, --lang-temperature's default);
- --temperatures: one multilingual model per --lang-temperature, the first one checked (default:
  TrainConfig's default, then 1, i.e. plain proportions), so that the default is chosen by measurement;
- bilingual: `seqtool train --src es --tgt en ... --max-time 10m` and the same for en-de;
- test BLEU and chrF of each pair (translate's defaults: beam 5), the bible's 2,251 lines and the
  loc set's 2,000; the goal: the multilingual mean >= the bilingual mean (the check: >= -0.5, else
  exit 1);
- zero-shot es -> de (never trained) on the bible test set: no reference exists, so reported are
  the share of outputs in German (lingua among es/en/de: the off-target rate) and BLEU against
  the model's own pivot es -> en -> de;
- detection accuracy: bench/detect.py, run at the end.

Prints the CPU capability and a markdown table, appended to bench/results.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
from pathlib import Path

from cpu_small import FAILURES, REPO, log, run
from translate import score  # bench/translate.py: BLEU and chrF of a hypothesis file

CHECK = -0.5  # the bench fails when the multilingual mean BLEU is below the bilingual mean by more


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=20.0, help="the multilingual model's --max-time; each bilingual one gets half")
    p.add_argument("--bible", type=Path, default=REPO / "data" / "bible-es-en")
    p.add_argument("--loc", type=Path, default=REPO.parent / "shared" / "data" / "loc-en-de")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--work", type=Path, help="scratch dir (default bench/out/multilingual-<timestamp>); finished runs in it are reused")
    p.add_argument("--temperatures", type=float, nargs="+", help="--lang-temperature of each multilingual model "
                   "(default: the training default, then 1); the first is the one checked")
    p.add_argument("--no-results", action="store_true")
    a = p.parse_args()
    W = (a.work or REPO / "bench" / "out" / f"multilingual-{datetime.datetime.now():%Y%m%d-%H%M%S}").resolve()
    W.mkdir(parents=True, exist_ok=True)
    logs = W / "logs"
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads), PYTHONPATH=str(REPO))
    st = [sys.executable, "-m", "seqtool"]
    sys.path.insert(0, str(REPO))
    from seqtool.config import TrainConfig
    from seqtool.device import cpu_bf16_instructions, cpu_capability
    from seqtool.textio import read_lines, find_split_file

    capability = f"{cpu_capability()}{', bf16 instructions' if cpu_bf16_instructions() else ''}"
    log(f"torch dispatches {capability}; {a.threads} threads; work dir {W}")
    B, L = a.bible.resolve(), a.loc.resolve()
    tests = {}
    for pair, d, s, t in (("es-en", B, "es", "en"), ("en-de", L, "en", "de")):
        src, ref = W / f"test.{pair}.src", W / f"test.{pair}.ref"
        src.write_text("".join(x + "\n" for x in read_lines(find_split_file(str(d / "test"), s))), encoding="utf-8")
        ref.write_text("".join(x + "\n" for x in read_lines(find_split_file(str(d / "test"), t))), encoding="utf-8")
        tests[pair] = (src, ref)
    half = f"{a.minutes / 2:g}m"
    common = ["--arch", "small", "--threads", a.threads]
    trained = {}

    def train(name: str, *args, minutes: str) -> Path:
        if not (W / name / "done").exists():  # (an interrupted run resumes: train does that itself)
            r = run(f"train-{name}", [*st, "train", *args, *common, "--max-time", minutes, "--save-dir", W / name], logs, env)
            if r["ok"]:
                (W / name / "done").touch()
        trained[name] = W / name / "best.pt"
        return trained[name]

    temperatures = a.temperatures or [TrainConfig().lang_temperature, 1.0]
    multis = {T: train(f"multi-T{T:g}", "--corpus", f"es-en:{B}/train", "--valid-corpus", f"es-en:{B}/valid",
                       "--corpus", f"en-de:{L}/train", "--valid-corpus", f"en-de:{L}/valid", "--lang-temperature", T,
                       minutes=f"{a.minutes:g}m") for T in temperatures}
    multi = multis[temperatures[0]]
    bi = {"es-en": train("bi-es-en", "--src", "es", "--tgt", "en", "--train", B / "train", "--valid", B / "valid", minutes=half),
          "en-de": train("bi-en-de", "--src", "en", "--tgt", "de", "--train", L / "train", "--valid", L / "valid", minutes=half)}

    def translate(name: str, ckpt: Path, src: Path, *options) -> Path:
        hyp = W / f"hyp-{name}"
        run(f"translate-{name}", [*st, "translate", "-c", ckpt, "-i", src, "-o", hyp, "--threads", a.threads, *options], logs, env)
        return hyp

    rows, means = [], {T: [] for T in temperatures}
    bi_bleu = []
    for pair, (src, ref) in tests.items():
        s, t = pair.split("-")
        b = score(translate(f"bi-{pair}", bi[pair], src), ref)
        bi_bleu.append(b.get("bleu", float("nan")))
        for T, ckpt in multis.items():
            m = score(translate(f"multi-T{T:g}-{pair}", ckpt, src, "--src-lang", s, "--tgt-lang", t), ref)
            means[T].append(m.get("bleu", float("nan")))
            rows.append(f"| {pair} | {T:g} | {m.get('bleu', float('nan')):.2f} / {m.get('chrf', float('nan')):.2f} | "
                        f"{b.get('bleu', float('nan')):.2f} / {b.get('chrf', float('nan')):.2f} | {m.get('bleu', float('nan')) - b.get('bleu', float('nan')):+.2f} |")
    mean_b = sum(bi_bleu) / len(bi_bleu)
    for T in temperatures:
        mean_t = sum(means[T]) / len(means[T])
        rows.append(f"| mean | {T:g} | {mean_t:.2f} | {mean_b:.2f} | {mean_t - mean_b:+.2f} |")
    mean_m = sum(means[temperatures[0]]) / len(means[temperatures[0]])

    # zero-shot es -> de on the bible test set: the off-target rate and agreement with the pivot
    src = tests["es-en"][0]
    T0 = f"T{temperatures[0]:g}"
    zero = translate(f"multi-{T0}-es-de", multi, src, "--src-lang", "es", "--tgt-lang", "de")
    pivot = translate(f"multi-{T0}-es-en-de", multi, W / f"hyp-multi-{T0}-es-en", "--src-lang", "en", "--tgt-lang", "de")
    german = "—"
    try:
        from lingua import Language, LanguageDetectorBuilder

        detector = LanguageDetectorBuilder.from_languages(Language.SPANISH, Language.ENGLISH, Language.GERMAN).build()
        outputs = [l for l in zero.read_text(encoding="utf-8").splitlines()]
        german = f"{100 * sum(detector.detect_language_of(o) == Language.GERMAN for o in outputs) / max(len(outputs), 1):.1f}%"
    except ImportError:
        log("lingua is not installed: the zero-shot off-target rate is not measured")
    z = score(zero, pivot)
    rows.append(f"| es-de (zero-shot) | {temperatures[0]:g} | in German: {german}; BLEU against its pivot es-en-de {z.get('bleu', float('nan')):.2f} | — | — |")

    shares = []
    for T, ckpt in multis.items():
        info = subprocess.run([*map(str, st), "info", str(ckpt)], capture_output=True, text=True, env=env).stdout
        shares.append(f"T={T:g}: " + next((line.split(None, 1)[1] for line in info.splitlines() if line.startswith("languages")), "?"))
    table = (f"## multilingual, {datetime.datetime.now():%Y-%m-%d %H:%M}, CPU {capability}, {a.threads} threads, "
             f"one model {a.minutes:g} min against two of {a.minutes / 2:g} min (--arch small, beam 5)\n\n"
             "multilingual pairs: " + "; ".join(shares) + "\n\n"
             "| pair | --lang-temperature | multilingual BLEU / chrF | bilingual BLEU / chrF | difference |\n|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
    ok = mean_m - mean_b >= CHECK
    table += (f"\nGoal (T={temperatures[0]:g}): multilingual mean BLEU >= the bilingual mean: {mean_m - mean_b:+.2f} "
              f"({'holds' if mean_m >= mean_b else 'short'}; the check, >= {CHECK}: {'passes' if ok else 'FAILS'})\n")
    print(table)
    if not a.no_results:
        with open(REPO / "bench" / "results.md", "a", encoding="utf-8") as fh:
            fh.write("\n" + table)
    run("detect", [sys.executable, Path(__file__).resolve().parent / "detect.py", *(["--no-results"] if a.no_results else [])], logs, env, timed=False)
    print((logs / "detect.out").read_text())
    if FAILURES:
        log(f"failed steps: {', '.join(FAILURES)}")
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
