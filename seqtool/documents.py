"""The text side of translating documents: sentences, placeholders, markup. No model here.

A document (plain text, HTML, Markdown) is read into `units`, one per block, each the text the
model sees and its inline markup as spans (seqtool.markup: Unit, Span); the translation of each
unit, with the spans placed on it by the model's alignment, goes back into the document, whose
every other byte is kept.

    doc = parse(text, "html")                       # or parse_text / parse_html / parse_markdown
    translated = []
    for unit in doc.units:
        pieces = split_sentences(unit.text, "es", mode="auto")    # [(sentence, whitespace after)]
        parts = [translate(s) if s else None for s, _ in pieces]  # one Aligned per sentence (below)
        whole = join_aligned(pieces, parts)
        spans = place_spans(unit, whole.target, whole.alignment, whole.source_tokens, whole.target_tokens)
        translated.append((whole.target, spans))
    print(doc.render(translated))

where translate(sentence) returns an `Aligned`: the target text, the character ranges of the
source and target tokens in the sentence and in the target (Tokenizer.encode_with_offsets(sentence)
and Tokenizer.decode_with_offsets(hypothesis ids), the ids without BOS/EOS) and the alignment
between them (source token index, target token index, as seqtool.alignment.hard_alignment gives
it from attention over those same ids). The sentences of all units can go to the model as one
batch: nothing here depends on the order of translation. Without an alignment, pass [] and every
span goes to the end of its unit (a void before the unit's first word: to its start).

A unit's text may begin or end with whitespace and hold line breaks (HTML source formatting);
split_sentences keeps that whitespace out of the sentences, and the model reads a line break
inside a sentence as a space. Placeholders (URLs, e-mail addresses) are never in a unit's text.

The API:

- `Document`: what parse* return: `.units: list[Unit]`, `.render(list[(target, spans)]) -> str`,
  `.identity()` (each unit's own text and spans: render(identity()) is the document again).
- `parse(doc, format)`: format "text", "html" or "markdown".
- `parse_text(doc) -> TextDocument`: a unit per line with text (lines end at \\n; \\r before it,
  blank lines and empty documents are kept as they are), URLs and e-mail addresses cut out
  (placeholders, void spans). `parse_html`, `parse_markdown`: in seqtool.markup, see there.
- `split_sentences(text, lang, mode="always") -> list[(sentence, whitespace)]`: the sentences
  of text, each without surrounding whitespace, with the whitespace after it;
  "".join(s + ws for s, ws in pieces) == text. Whitespace before the first sentence is a first
  piece ("", whitespace); "" gives []. mode "always": the rule-based splitter (sentence-splitter,
  the Moses rules; chosen by measurement, bench/results.md), a ConfigError naming the extra to
  install when it is missing; "never": the whole text as one sentence; "auto": split when the
  splitter is installed and looks_like_several_sentences(text), else one sentence.
- `splitter_available() -> bool`; `looks_like_several_sentences(text, lang) -> bool` (a regular
  expression: sentence-final punctuation followed by more text).
- `Aligned(target, alignment, source_tokens, target_tokens)` and `join_aligned(pieces, parts)`:
  the sentences' translations joined with the source's whitespace into one for the whole unit.
- From seqtool.markup: `Unit`, `Span`, `protect(text) -> Unit`, `place_spans(...)`,
  `render_unit(target, spans)`, `span_words(unit, span)`, `parse_html`, `parse_markdown`.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Optional, Protocol, Sequence

from .errors import ConfigError
from .markup import (HtmlDocument, MarkdownDocument, Skeleton, SkeletonBuilder, Span, Unit, one_line, parse_html,
                     parse_markdown, place_spans, protect, render_unit, span_words)

__all__ = ["Aligned", "Document", "HtmlDocument", "MarkdownDocument", "Span", "TextDocument", "Unit", "join_aligned",
           "looks_like_several_sentences", "parse", "parse_html", "parse_markdown", "parse_text", "place_spans", "protect",
           "render_unit", "span_words", "split_sentences", "splitter_available"]

MODES = ("auto", "always", "never")
FORMATS = ("text", "html", "markdown")
INSTALL = "pip install 'seqtool[documents]'"


class Document(Protocol):
    units: list[Unit]

    def render(self, translated: Sequence[tuple[str, Sequence[Span]]]) -> str: ...

    def identity(self) -> list[tuple[str, list[Span]]]: ...


# ---------------------------------------------------------------------------------------------
# sentences

# sentence-final punctuation (closing quotes and brackets may follow), whitespace, then more text
_SEVERAL = re.compile(r"[.!?…。！？][\"'”’»)\]]*\s+\S")


def looks_like_several_sentences(text: str, lang: str) -> bool:
    """Whether `text` may hold more than one sentence: a . ! ? … (or 。！？) followed by whitespace and
    more text. Cheap (one regular expression, whatever `lang`); a False is certain, a True is a maybe."""
    return _SEVERAL.search(text.strip()) is not None


def splitter_available() -> bool:
    """Whether split_sentences can split (the sentence-splitter package is installed)."""
    try:
        import sentence_splitter  # noqa: F401
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=None)
def _splitter(lang: str):
    """The Moses splitter for `lang` ("es", "pt-BR", "de_AT": its first two letters), with English's
    non-breaking prefixes for a language that has none of its own (as Moses' split-sentences.perl does)."""
    try:
        from sentence_splitter import SentenceSplitter, SentenceSplitterException
    except ImportError:
        raise ConfigError(f"splitting sentences needs the sentence-splitter package: {INSTALL}") from None
    base = re.split(r"[-_]", lang.strip().lower(), maxsplit=1)[0][:2]
    try:
        return SentenceSplitter(language=base)
    except SentenceSplitterException:
        return SentenceSplitter(language="en")


def split_sentences(text: str, lang: str, mode: str = "always") -> list[tuple[str, str]]:
    """The sentences of `text` and the whitespace after each: [(sentence, whitespace), ...] with
    "".join(s + ws for s, ws in result) == text, every sentence without whitespace at either end,
    leading whitespace as a first piece ("", whitespace), [] for "". mode: "always" (split; a
    ConfigError when the splitter is not installed), "never" (one sentence), "auto" (split when the
    splitter is installed and the text looks like several sentences)."""
    if mode not in MODES:
        raise ConfigError(f"sentence splitting mode {mode!r}: choose one of {', '.join(MODES)}")
    if mode == "auto" and not (looks_like_several_sentences(text, lang) and splitter_available()):
        mode = "never"
    core = text.strip()
    lead = text[:len(text) - len(text.lstrip())]
    pieces = [("", lead)] if lead else []
    if not core:
        return pieces if text else []
    if mode == "never":
        return pieces + [(core, text[len(lead) + len(core):])]
    # The splitter reads spaces only and writes sentences with their whitespace collapsed: give it
    # every whitespace character as a space, and find its sentences in the text by counting the
    # characters that are not whitespace (it changes no other).
    sentences = _splitter(lang).split(re.sub(r"\s", " ", core))
    sizes = [sum(1 for c in s if not c.isspace()) for s in sentences]
    solid = [k for k, c in enumerate(text) if not c.isspace()]  # offsets of the characters that are not whitespace
    if sum(sizes) != len(solid) or not all(sizes):
        return pieces + [(core, text[len(lead) + len(core):])]
    done = 0
    for n, size in enumerate(sizes):
        start, end = solid[done], solid[done + size - 1] + 1
        done += size
        following = solid[done] if done < len(solid) else len(text)
        pieces.append((text[start:end], text[end:following]))
    return pieces


# ---------------------------------------------------------------------------------------------
# sentences' translations joined into one per unit


@dataclass
class Aligned:
    """A translation with its alignment: target text; (source token index, target token index) pairs;
    each source token's [start, end) character range in the source text; each target token's in target."""

    target: str
    alignment: list[tuple[int, int]] = field(default_factory=list)
    source_tokens: list[tuple[int, int]] = field(default_factory=list)
    target_tokens: list[tuple[int, int]] = field(default_factory=list)


def join_aligned(pieces: Sequence[tuple[str, str]], parts: Sequence[Optional[Aligned]]) -> Aligned:
    """The translations of split_sentences' pieces (parts[k] for pieces[k]; None, or anything, where the
    sentence is "") joined with the source's whitespace: one Aligned over the whole text, whose source
    ranges are offsets in "".join(s + ws for s, ws in pieces) and whose token indices count on from
    one sentence to the next."""
    if len(parts) != len(pieces):
        raise ValueError(f"join_aligned needs one part per piece: {len(pieces)} pieces, {len(parts)} parts")
    whole = Aligned("")
    target: list[str] = []
    source_at = target_at = 0
    for (sentence, space), part in zip(pieces, parts):
        if sentence and part is not None:
            n_src, n_tgt = len(whole.source_tokens), len(whole.target_tokens)
            whole.alignment += [(i + n_src, j + n_tgt) for i, j in part.alignment]
            whole.source_tokens += [(a + source_at, b + source_at) for a, b in part.source_tokens]
            whole.target_tokens += [(a + target_at, b + target_at) for a, b in part.target_tokens]
            target.append(part.target)
            target_at += len(part.target)
        target.append(space)
        source_at += len(sentence) + len(space)
        target_at += len(space)
    whole.target = "".join(target)
    return whole


# ---------------------------------------------------------------------------------------------
# plain text documents


class TextDocument(Skeleton):
    """A plain text document as units; see parse_text."""


def parse_text(doc: str) -> TextDocument:
    """A plain text document -> a unit per line that has text (the line without its \\n, nor a \\r
    before it), its URLs and e-mail addresses protected as void spans; everything else (line ends,
    blank lines) stays as it is, so the identity translation gives the document back exactly. A
    target's line breaks are written as spaces (a unit stays one line)."""
    out = SkeletonBuilder()
    for line in re.findall(r"[^\n]*\n|[^\n]+\Z", doc):
        body = line[:-1] if line.endswith("\n") else line
        body = body[:-1] if body.endswith("\r") else body
        out.unit(protect(body), body, one_line)
        out.verbatim(line[len(body):])
    return out.finish(TextDocument)  # type: ignore[return-value]


def parse(doc: str, format: str) -> Document:
    """parse_text, parse_html or parse_markdown, by `format` ("text", "html", "markdown")."""
    if format == "text":
        return parse_text(doc)
    if format == "html":
        return parse_html(doc)
    if format == "markdown":
        return parse_markdown(doc)
    raise ConfigError(f"document format {format!r}: choose one of {', '.join(FORMATS)}")
