#!/usr/bin/env python
"""Documents, not just lines (issue 28): paragraphs, HTML, Markdown, placeholders, loops and speed, on
the bible test set, for each checkpoint given, in one run.

    python bench/documents.py --checkpoint runs/demo/best.pt [--checkpoint runs/small20/best.pt] [--lines 2251]
    python bench/documents.py --real --checkpoint runs/demo/best.pt      # real documents: documents_real.py

- paragraphs: the test verses joined 5 to a paragraph (one paragraph a line), translated with the
  default options (--split-sentences auto) and with never, scored against the references joined the
  same way, beside the verses translated one by one and joined (the goal: within 1.0 BLEU of it);
- loops: test outputs that repeat a phrase of 1-8 words 4 or more times in a row, with the default
  loop guard and without it (goal: at most 2 of 2,251), with their BLEU;
- HTML: every test sentence a <p>, one word in <b> and another in <a href=...>: tags and attributes
  kept and the output parsing (must hold for all), tag-stripped BLEU against plain text (goal: within
  2), and a placement score: the share of tags whose content is the translation the model's own
  alignment gives the wrapped word (goal >= 80%);
- Markdown: a document of the test sentences with a heading, lists, emphasis, a link, inline code and
  a code block: everything that is not text byte for byte;
- placeholders: a URL or an e-mail address put into each sentence comes out verbatim (goal 100%);
- speed: the HTML document and the paragraphs against plain translation of the same verses, the
  median of --rounds timings of each in rotated order (goal: at most 10% more time).

Prints the CPU's capability and a markdown table per checkpoint, appended to bench/results.md. Run on
an idle machine.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import random
import re
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LOOP = re.compile(r"(?:^|\s)((?:\S+\s+){0,7}?\S+)(?:\s+\1){3,}(?=\s|$)")  # a phrase of 1-8 words, 4+ times in a row


def log(msg: str) -> None:
    print(f"[{datetime.datetime.now():%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def bleu(hyps, refs) -> float:
    import sacrebleu

    return sacrebleu.corpus_bleu(list(hyps), [list(refs)]).score


class Tags(HTMLParser):
    def __init__(self, doc):
        super().__init__(convert_charrefs=True)
        self.seen, self.text, self.inside = [], [], {}
        self.feed(doc)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.seen.append(("start", tag, tuple(attrs)))

    def handle_endtag(self, tag):
        self.seen.append(("end", tag))

    def handle_data(self, data):
        self.text.append(data)


def wrapped(doc: str) -> list[tuple[str, str]]:
    """(tag, content) of every <b> and <a> in doc, in order."""
    return [(m.group(1), re.sub(r"<[^>]+>", "", m.group(3))) for m in re.finditer(r"<(b|a)(\s[^>]*)?>(.*?)</\1>", doc, re.S)]


def paragraphs(items: list[str], size: int = 5) -> list[str]:
    return [" ".join(items[k:k + size]) for k in range(0, len(items), size)]


def measure(a, path: Path, src: list[str], ref: list[str]) -> dict:
    from seqtool.config import SearchOptions
    from seqtool.documents import span_words
    from seqtool.documents import protect
    from seqtool.textpolicy import TextPolicy
    from seqtool.translate import Translator

    t = Translator.load(path, device="cpu", threads=a.threads, beam=5)
    out: dict = {"precision": t.config.precision}
    t.translate_lines(0, src[:16], policy=TextPolicy("never"))  # warm-up

    def timed(fn):
        t0 = time.perf_counter()
        value = fn()
        return value, time.perf_counter() - t0

    # verses one by one (lines whole, as today), paragraphs auto and never
    verses, out["verses_s"] = timed(lambda: [x.texts[0] if x.texts else "" for x in t.translate_lines(0, src, policy=TextPolicy("never"))])
    paras, refs5 = paragraphs(src), paragraphs(ref)
    auto, out["paragraphs_s"] = timed(lambda: [x.texts[0] if x.texts else "" for x in t.translate_lines(0, paras, policy=TextPolicy("auto"))])
    never = [x.texts[0] if x.texts else "" for x in t.translate_lines(0, paras, policy=TextPolicy("never"))]
    out["bleu_joined_verses"] = bleu(paragraphs(verses), refs5)
    out["bleu_paragraphs_auto"] = bleu(auto, refs5)
    out["bleu_paragraphs_never"] = bleu(never, refs5)
    log(f"{path}: paragraphs BLEU auto {out['bleu_paragraphs_auto']:.2f}, never {out['bleu_paragraphs_never']:.2f}, "
        f"verses joined {out['bleu_joined_verses']:.2f}")

    # loops, with and without the guard
    unguarded = t.translate_chunk(0, src, SearchOptions(beam=5, loop_guard=0))
    unguarded = [x.texts[0] if x.texts else "" for x in unguarded]
    out["loops_guard"] = [h for h in verses if LOOP.search(h)]
    out["loops_off"] = [h for h in unguarded if LOOP.search(h)]
    out["bleu_guard"], out["bleu_off"] = bleu(verses, ref), bleu(unguarded, ref)
    log(f"loops: {len(out['loops_guard'])} with the guard (BLEU {out['bleu_guard']:.2f}), {len(out['loops_off'])} without "
        f"({out['bleu_off']:.2f})")

    # HTML: <b> and <a> around words of every sentence
    rng = random.Random(1)
    blocks, marked = [], []
    for k, s in enumerate(src):
        words = [m for m in re.finditer(r"\w+", s)]
        if len(words) < 4:
            blocks.append(f"<p>{s}</p>")
            marked.append(None)
            continue
        i, j = sorted(rng.sample(range(len(words)), 2))
        wi, wj = words[i], words[j]
        html = (s[:wi.start()] + "<b>" + wi.group() + "</b>" + s[wi.end():wj.start()] + f'<a href="https://example.org/{k}">' +
                wj.group() + "</a>" + s[wj.end():])
        blocks.append(f"<p>{html}</p>")
        marked.append(((wi.start(), wi.end()), (wj.start(), wj.end())))
    doc = "<html><body>\n" + "\n".join(blocks) + "\n</body></html>\n"
    translated, out["html_s"] = timed(lambda: t.translate_document(doc, "html", split="never"))
    # speed: each of the three once more in each of a.rounds - 1 rounds, in rotated order (a slow spell of the
    # machine falls on different ones), the median of each; the ratios compare the medians
    jobs = {"verses_s": lambda: t.translate_lines(0, src, policy=TextPolicy("never")), "paragraphs_s": lambda: t.translate_lines(0, paras, policy=TextPolicy("auto")),
            "html_s": lambda: t.translate_document(doc, "html", split="never")}
    times = {k: [out[k]] for k in jobs}
    for r in range(1, a.rounds):
        names = list(jobs)[r % 3:] + list(jobs)[: r % 3]
        for k in names:
            times[k].append(timed(jobs[k])[1])
    for k, v in times.items():
        out[k] = sorted(v)[len(v) // 2]
    log("seconds (rounds): " + ", ".join(f"{k} {' '.join(f'{x:.1f}' for x in v)}" for k, v in times.items()))
    got, want = Tags(translated), Tags(doc)
    out["tags_kept"] = sorted(map(str, got.seen)) == sorted(map(str, want.seen))
    paras_out = re.findall(r"<p>(.*?)</p>", translated, re.S)
    out["html_parses"] = len(paras_out) == len(src)
    stripped = [re.sub(r"<[^>]+>", "", p).replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">") for p in paras_out]
    out["bleu_html_stripped"] = bleu(stripped, ref)
    # placement: the words the alignment of the plain translation gives the wrapped source word
    aligner = Translator(t.model, t.tokenizer, t.config.replace(alignments=True), t.device, options=t.options, configs=t.configs)
    plain = aligner.translate_chunk(0, src)
    hits = total = unaligned = 0
    for k, (s, x, para) in enumerate(zip(src, plain, paras_out)):
        if marked[k] is None or not x.hypotheses:
            continue
        ids, src_ranges = t.tokenizer.encode_with_offsets(s)
        target, tgt_ranges = t.tokenizer.decode_with_offsets(x.hypotheses[0].tokens)
        pairs = x.alignments[0]
        where = dict(zip(("b", "a"), marked[k]))
        for tag, content in wrapped(para):
            a0, a1 = where[tag]
            toks = {i for i, (b0, b1) in enumerate(src_ranges) if b1 > a0 and b0 < a1}
            aligned = sorted({j for i, j in pairs if i in toks})
            if not aligned:  # the model's alignment gives this word no translation: nothing to be right about
                unaligned += 1
                continue
            total += 1
            # right: the tag wraps words of the aligned translation and nothing else (one contiguous run of it)
            words = {m.group() for j in aligned for m in re.finditer(r"\w+", target)
                     if m.start() < tgt_ranges[j][1] and m.end() > tgt_ranges[j][0]}  # the words its tokens belong to
            inside = re.findall(r"\w+", content)
            hits += bool(inside) and all(w in words for w in inside)
    out["placement"] = hits / max(total, 1)
    out["unaligned"] = unaligned
    log(f"HTML: tags kept {out['tags_kept']}, parses {out['html_parses']}, stripped BLEU {out['bleu_html_stripped']:.2f} "
        f"against {out['bleu_guard']:.2f}, placement {out['placement']:.1%} of {total} tags ({unaligned} wrap a word the "
        "alignment leaves untranslated)")

    # Markdown: everything that is not text byte for byte
    md = (f"# {src[0]}\n\n{src[1]} *{src[2]}*\n\n- {src[3]}\n- **{src[4]}**\n\n1. {src[5]} [{src[6]}](https://example.org/a_(b))\n\n"
          f"> {src[7]} `seqtool translate --format markdown`\n\n```sh\necho '{src[8]}'\n```\n\n| a | b |\n|---|---|\n| {src[9]} | x |\n")
    md_out = t.translate_document(md, "markdown", split="never")
    keep = ["# ", "\n\n- ", "\n- **", "**\n\n1. ", "](https://example.org/a_(b))", "\n\n> ", " `seqtool translate --format markdown`",
            f"```sh\necho '{src[8]}'\n```", "\n|---|---|\n| ", " |\n"]
    out["markdown_kept"] = [k for k in keep if k not in md_out]

    # placeholders
    things = [f"https://www.example.org/{k}/page?q={k}" if k % 2 else f"persona{k}@example.com" for k in range(len(src))]
    with_things = []
    for s, thing in zip(src, things):
        words = s.split(" ")
        at = rng.randrange(len(words) + 1)
        with_things.append(" ".join(words[:at] + [thing] + words[at:]))
    got_lines = [x.texts[0] if x.texts else "" for x in t.translate_lines(0, with_things, policy=TextPolicy("auto"))]
    out["placeholders"] = sum(thing in g for thing, g in zip(things, got_lines)) / len(things)
    log(f"Markdown: missing {out['markdown_kept'] or 'nothing'}; placeholders verbatim {out['placeholders']:.1%}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, action="append", required=True)
    parser.add_argument("--data", type=Path, default=REPO / "data" / "bible-es-en")
    parser.add_argument("--lines", type=int, default=2251)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-results", action="store_true")
    parser.add_argument("--rounds", type=int, default=5, help="timings of plain, paragraphs and HTML, median taken (default 5)")
    parser.add_argument("--real", action="store_true", help="real documents through the CLI and the server instead (documents_real.py)")
    parser.add_argument("--limit", type=int, default=None, help="with --real: at most this many documents of each collection")
    parser.add_argument("--cost-every", type=int, default=8, help="with --real: the cost is measured on every Nth document")
    parser.add_argument("--cost-only", action="store_true", help="with --real: only the cost (no CLI or server runs)")
    a = parser.parse_args()
    if a.real:
        import documents_real

        a.checkpoint = a.checkpoint[0]
        return documents_real.measure(a)
    from seqtool.device import cpu_bf16_instructions, cpu_capability

    src = gzip.open(a.data / "test.es.gz", "rt", encoding="utf-8").read().splitlines()[: a.lines]
    ref = gzip.open(a.data / "test.en.gz", "rt", encoding="utf-8").read().splitlines()[: a.lines]
    cpu = f"{cpu_capability()}" + (f" + {cpu_bf16_instructions()}" if cpu_bf16_instructions() else "")
    log(f"{len(src)} test lines, {a.threads} threads, CPU {cpu}")
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    rows = []
    for path in a.checkpoint:
        r = measure(a, path, src, ref)
        rows.append(
            f"| {path} | {r['precision']} | {r['bleu_paragraphs_auto']:.2f} / {r['bleu_paragraphs_never']:.2f} / "
            f"{r['bleu_joined_verses']:.2f} | {len(r['loops_guard'])} ({r['bleu_guard']:.2f}) / {len(r['loops_off'])} "
            f"({r['bleu_off']:.2f}) | {'yes' if r['tags_kept'] and r['html_parses'] else 'NO'} | {r['bleu_html_stripped']:.2f} | "
            f"{r['placement']:.1%} ({r['unaligned']} unaligned) | {'yes' if not r['markdown_kept'] else 'NO: ' + ', '.join(map(repr, r['markdown_kept']))} | "
            f"{r['placeholders']:.1%} | {r['html_s'] / r['verses_s']:.2f} / {r['paragraphs_s'] / r['verses_s']:.2f} |")
        for h in r["loops_guard"][:3]:
            log(f"a loop left with the guard: {h}")
    when = datetime.datetime.now()
    table = "\n".join([
        f"## documents, {when:%Y-%m-%d %H:%M}, commit {commit}, CPU {cpu}, {a.threads} threads, {len(src)} bible test lines, beam 5", "",
        "| checkpoint | precision | paragraphs BLEU: auto / never / verses joined | loops with the guard (BLEU) / without (BLEU) | "
        "HTML tags kept, parses | HTML stripped BLEU | tag placement | Markdown non-text kept | placeholders verbatim | "
        "time HTML / paragraphs against plain verses |",
        "|---|---|---|---|---|---|---|---|---|---|", *rows, ""])
    print(table)
    if not a.no_results:
        with open(REPO / "bench" / "results.md", "a", encoding="utf-8") as handle:
            handle.write("\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
