#!/usr/bin/env python
"""Language detection for the server's `source: "auto"` (issue 30): which offline detector from PyPI
gets the bundled languages right, on short lines and long ones.

    pip install lingua-language-detector py3langid
    python bench/detect.py

- lines: for each bundled language (es and en from data/bible-es-en's test set, en and de from
  ../shared/data/loc-en-de's), 200 short lines (at most 5 words: the test lines that short, then
  the first 1-5 words of longer ones) and 200 long ones (more than 5 words), drawn with a fixed seed;
- candidates: lingua (lingua-language-detector) and py3langid, each restricted to the candidate
  languages, as the server restricts them to the model's sources: all three (es, en, de), and the
  pair es/en (the multilingual bench model's sources);
- reported: accuracy per language, length and candidate set, and detections per second.

Nothing is downloaded: both ship their models in the wheel. Prints the CPU capability and a
markdown table (appended to bench/results.md unless --no-results).
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from seqtool.device import cpu_capability  # noqa: E402

SOURCES = {"es": [REPO / "data" / "bible-es-en" / "test.es.gz"],
           "en": [REPO / "data" / "bible-es-en" / "test.en.gz", REPO.parent / "shared" / "data" / "loc-en-de" / "test.en"],
           "de": [REPO.parent / "shared" / "data" / "loc-en-de" / "test.de"]}


def read(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [line.strip() for line in fh if line.strip()]


def samples(n: int, seed: int) -> dict[tuple[str, str], list[str]]:
    rng = random.Random(seed)
    out = {}
    for lang, paths in SOURCES.items():
        lines = [line for p in paths for line in read(p)]
        short = [l for l in lines if len(l.split()) <= 5]
        long = [l for l in lines if len(l.split()) > 5]
        rng.shuffle(short)
        rng.shuffle(long)
        cut = [" ".join(l.split()[: rng.randint(1, 5)]) for l in long[n:]]  # beyond the long sample: no overlap
        out[(lang, "short")] = (short + cut)[:n]
        out[(lang, "long")] = long[:n]
    return out


class Lingua:
    name = "lingua"

    def __init__(self, codes):
        from lingua import IsoCode639_1, Language, LanguageDetectorBuilder

        self.by = {Language.from_iso_code_639_1(getattr(IsoCode639_1, c.upper())): c for c in codes}
        self.d = LanguageDetectorBuilder.from_languages(*self.by).with_preloaded_language_models().build()

    def __call__(self, text: str) -> str:
        found = self.d.detect_language_of(text)
        return self.by.get(found, "?")


class Py3langid:
    name = "py3langid"

    def __init__(self, codes):
        from pathlib import Path as _Path

        from py3langid.langid import MODEL_DIR, MODEL_FILE, LanguageIdentifier

        self.d = LanguageIdentifier.from_model_file(_Path(MODEL_DIR) / MODEL_FILE, norm_probs=True)  # the model in its wheel
        self.d.set_languages(list(codes))

    def __call__(self, text: str) -> str:
        return self.d.classify(text)[0]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lines", type=int, default=200)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-results", action="store_true")
    a = p.parse_args()
    data = samples(a.lines, a.seed)
    rows = []
    for codes in (("es", "en", "de"), ("es", "en")):
        for kind in (Lingua, Py3langid):
            try:
                detector = kind(codes)
            except ImportError as error:
                print(f"{kind.name}: not installed ({error})", file=sys.stderr)
                continue
            cells, n_all, right_all, seconds = [], 0, 0, 0.0
            for length in ("short", "long"):
                for lang in ("es", "en", "de"):
                    if lang not in codes:
                        cells.append("—")
                        continue
                    lines = data[(lang, length)]
                    t0 = time.perf_counter()
                    right = sum(detector(line) == lang for line in lines)
                    seconds += time.perf_counter() - t0
                    n_all, right_all = n_all + len(lines), right_all + right
                    cells.append(f"{100 * right / len(lines):.1f}%")
            rows.append(f"| {'/'.join(codes)} | {kind.name} | " + " | ".join(cells) + f" | {100 * right_all / n_all:.1f}% | {n_all / seconds:,.0f} |")
            print(rows[-1], flush=True)
    heads = " | ".join(f"{length} {lang}" for length in ("short", "long") for lang in ("es", "en", "de"))
    table = (f"## detect, {datetime.datetime.now():%Y-%m-%d %H:%M}, CPU {cpu_capability()}, {a.lines} short (<= 5 words) and "
             f"{a.lines} long lines per language, seed {a.seed}\n\n"
             f"| candidates | detector | {heads} | all | lines/s |\n|---|---|---|---|---|---|---|---|---|---|\n"
             + "\n".join(rows) + "\n")
    print(table)
    if not a.no_results:
        with open(REPO / "bench" / "results.md", "a", encoding="utf-8") as fh:
            fh.write("\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
