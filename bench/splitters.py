"""Rule-based sentence splitters on the bundled corpora: boundaries recovered, and speed.

Protocol: from each test file, take the lines that end with sentence-final punctuation (. ! ? …,
optionally followed by closing quotes or brackets) and start a sentence (an upper-case letter,
optionally after opening punctuation such as ¿ ¡ « “: a Bible verse often continues the previous
verse's sentence in lower case, and a join before it is no sentence boundary), keep runs of
consecutive such lines, and join them 5 at a time with one space into paragraphs. The 4 joins of
each paragraph are the true boundaries (a boundary is the character offset where a sentence starts). Each splitter splits
every paragraph; its predicted boundaries are the start offsets of its 2nd, 3rd, ... sentences
(leading whitespace skipped). Precision = exact hits / predicted, recall = exact hits / true.

A line can hold several sentences (a Bible verse often does: "... said. Then ..."), and a split
there counts as a false positive: precision is a lower bound for every splitter alike, and recall
is the figure that matters most (a missed join glues two lines into one segment for the model).
Speed: original lines / s over all paragraphs, the splitter built once beforehand (one process,
one thread). "lossless": whether the pieces (or the spans) it returns cover the paragraph exactly,
so the text between sentences can be kept without searching for them.

The rows "seqtool split_sentences": seqtool.documents.split_sentences, the chosen splitter behind
seqtool's own offset bookkeeping (the figures must match the package's; its pieces always join to the text).

Corpora: bible-es-en's test split (data/, else ../shared/data/) for es and en; loc-en-de's test and
valid splits (../shared/data/) for de and en (software strings: their order is shuffled, so the
qualifying lines are taken in file order whatever lies between them). Splitters whose package is
not installed are skipped.

    pip install pysbd sentencex sentence-splitter syntok choppa-srx cleave-sbd blingfire   # the candidates
    python bench/splitters.py [--limit-paragraphs N] [--record]     # --record appends to bench/results.md
"""

from __future__ import annotations

import argparse
import datetime
import platform
import re
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
FINAL = re.compile(r"[.!?…][\"'»”’)\]]*$")
START = re.compile(r"^[\"'«“‘¿¡(\[]*[^\W\d_]")  # opening punctuation, then a letter (checked upper-case)
PER_PARAGRAPH = 5


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def corpus_lines(name: str, split: str, lang: str) -> list[str]:
    import gzip

    for base in (ROOT / "data", ROOT.parent / "shared" / "data"):
        for path in (base / name / f"{split}.{lang}", base / name / f"{split}.{lang}.gz"):
            if path.exists():
                raw = gzip.open(path, "rb").read() if path.suffix == ".gz" else path.read_bytes()
                return raw.decode("utf-8").splitlines()
    raise SystemExit(f"{name}/{split}.{lang}: not found under data/ or ../shared/data/")


def is_sentence(line: str) -> bool:
    start = START.match(line)
    return bool(start and start.group()[-1].isupper() and FINAL.search(line))


def paragraphs(lines: list[str], consecutive: bool = True) -> list[tuple[str, list[int]]]:
    """(paragraph, true boundary offsets) for runs of 5 lines that are sentences; consecutive: a
    line that is not breaks the run."""
    out, run = [], []
    for line in lines:
        line = line.strip()
        if not is_sentence(line):
            if consecutive:
                run = []
            continue
        run.append(line)
        if len(run) == PER_PARAGRAPH:
            starts, offset = [], 0
            for piece in run[:-1]:
                offset += len(piece) + 1
                starts.append(offset)
            out.append((" ".join(run), starts))
            run = []
    return out


def starts_of_pieces(text: str, pieces: list[str]) -> tuple[list[int], bool]:
    """Start offsets of pieces found in order in text (pieces may be stripped); lossless: they tile it."""
    starts, cursor = [], 0
    for piece in pieces:
        core = piece.strip()
        if not core:
            continue
        at = text.find(core, cursor)
        if at < 0:  # a splitter that rewrote the text: skip the piece
            continue
        starts.append(at)
        cursor = at + len(core)
    return starts, "".join(pieces) == text


def starts_of_spans(text: str, spans) -> tuple[list[int], bool]:
    """The same from objects with .start and .sent (pysbd's and cleave-sbd's TextSpan)."""
    return [s.start for s in spans], "".join(s.sent for s in spans) == text


def splitters(lang: str) -> Iterator[tuple[str, Callable[[str], tuple[list[int], bool]]]]:
    """(name with version, split) for each installed candidate; split(text) -> (sentence starts, lossless)."""
    from importlib.metadata import version, PackageNotFoundError

    def have(dist: str) -> str | None:
        try:
            return version(dist)
        except PackageNotFoundError:
            return None

    if v := have("pysbd"):
        import pysbd

        seg = pysbd.Segmenter(language=lang, clean=False, char_span=True)
        yield f"pysbd {v}", lambda text: starts_of_spans(text, seg.segment(text))
    if v := have("sentencex"):
        import sentencex

        yield f"sentencex {v}", lambda text: starts_of_pieces(text, list(sentencex.segment(lang, text)))
    if v := have("sentence-splitter"):
        from sentence_splitter import SentenceSplitter

        moses = SentenceSplitter(language=lang)
        yield f"sentence-splitter {v} (Moses)", lambda text: starts_of_pieces(text, moses.split(text))
    if v := have("syntok"):
        from syntok import segmenter

        def run_syntok(text):
            starts = [sentence[0].offset for para in segmenter.analyze(text) for sentence in para]
            return starts, False

        yield f"syntok {v}", run_syntok
    if v := have("choppa-srx"):
        from choppa import DEFAULT_SRX_RULESET, SrxDocument, SrxTextIterator

        rules = SrxDocument(ruleset=DEFAULT_SRX_RULESET)
        yield f"choppa-srx {v} (LanguageTool SRX)", lambda text: starts_of_pieces(text, list(SrxTextIterator(rules, f"{lang}_two", text)))
    if v := have("cleave-sbd"):
        import csbd

        cleave = csbd.Segmenter(language=lang, char_span=True)
        yield f"cleave-sbd {v}", lambda text: starts_of_spans(text, cleave.segment(text))
    if v := have("sentence-splitter"):
        sys.path.insert(0, str(ROOT))
        from seqtool.documents import split_sentences

        def run_seqtool(text):
            pieces = split_sentences(text, lang)
            starts, at = [], 0
            for sentence, space in pieces:
                if sentence:
                    starts.append(at)
                at += len(sentence) + len(space)
            return starts, "".join(s + ws for s, ws in pieces) == text

        yield "seqtool split_sentences (sentence-splitter, offsets kept)", run_seqtool
    if v := have("blingfire"):
        import blingfire

        def run_blingfire(text):
            _, offsets = blingfire.text_to_sentences_and_offsets(text)
            return [start for start, _ in offsets], False

        yield f"blingfire {v} (FSM, bundled; no language)", run_blingfire


def measure(split, paras: list[tuple[str, list[int]]]) -> dict:
    hits = predicted = true = 0
    lossless = True
    elapsed = 0.0
    for text, truth in paras:
        t0 = time.perf_counter()
        starts, whole = split(text)
        elapsed += time.perf_counter() - t0
        got = {s for s in starts if s > 0}
        hits += len(got & set(truth))
        predicted += len(got)
        true += len(truth)
        lossless &= whole
    p = hits / predicted if predicted else 0.0
    r = hits / true if true else 0.0
    return {"p": p, "r": r, "f": 2 * p * r / (p + r) if p + r else 0.0,
            "speed": len(paras) * PER_PARAGRAPH / elapsed if elapsed else 0.0, "lossless": lossless}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit-paragraphs", type=int, default=0, help="at most N paragraphs per corpus (0: all)")
    parser.add_argument("--record", action="store_true", help="append the table to bench/results.md")
    args = parser.parse_args()
    sets = [("es", "bible-es-en", ("test",)), ("en", "bible-es-en", ("test",)),
            ("de", "loc-en-de", ("test", "valid")), ("en", "loc-en-de", ("test", "valid"))]
    rows = []
    for lang, corpus, splits in sets:
        lines = [line for split in splits for line in corpus_lines(corpus, split, lang)]
        paras = paragraphs(lines, consecutive=corpus.startswith("bible"))
        if args.limit_paragraphs:
            paras = paras[: args.limit_paragraphs]
        for name, split in splitters(lang):
            try:
                split("Warm up. Twice.")
                m = measure(split, paras)
            except Exception as error:  # a splitter that fails on a language: a row saying so
                rows.append(f"| {lang} | {corpus} | {len(paras)} | {name} | failed: {type(error).__name__}: {error} | | | | |")
                continue
            rows.append(f"| {lang} | {corpus} | {len(paras)} | {name} | {m['p']:.3f} | {m['r']:.3f} | {m['f']:.3f} "
                        f"| {m['speed']:,.0f} | {'yes' if m['lossless'] else 'no'} |")
            print(rows[-1], flush=True)
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    head = [f"## sentence splitters, {when}, CPU: {cpu_model()}, Python {platform.python_version()} (bench/splitters.py)", "",
            f"Paragraphs of {PER_PARAGRAPH} lines that are sentences (upper-case start, final punctuation; consecutive in "
            "bible-es-en test, in file order in loc-en-de test+valid), joined by a space; precision and recall of the joins "
            "recovered exactly (a split inside a line counts against precision); speed in original lines/s, one thread.", "",
            "| lang | corpus | paragraphs | splitter | precision | recall | F1 | lines/s | lossless |",
            "|---|---|---:|---|---:|---:|---:|---:|---|"]
    table = "\n".join(head + rows) + "\n"
    print()
    print(table)
    if args.record:
        with open(ROOT / "bench" / "results.md", "a", encoding="utf-8") as out:
            out.write("\n" + table)


if __name__ == "__main__":
    main()
