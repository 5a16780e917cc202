"""The text side of translating documents: sentences, placeholders, markup. No model here.

A document (plain text, HTML, Markdown) is read into `units`, one per block (and per readable
attribute value), each the text the model sees and its inline markup as spans; the translation
of each unit, with the spans placed on it by the model's alignment, goes back into the document,
whose every other byte is kept.

    doc = parse(text, "html")                       # formats.py: parse_text / parse_html / parse_markdown
    translated = []
    for unit in doc.units:
        pieces = split_sentences(unit.text, "es", mode="auto")    # [(sentence, whitespace after)]
        parts = [translate(s) if s else None for s, _ in pieces]  # one Aligned per sentence
        whole = join_aligned(pieces, parts)
        spans = place_spans(unit, whole.target, whole.alignment, whole.source_tokens, whole.target_tokens)
        translated.append((whole.target, spans))
    print(doc.render(translated, lang="en"))

where translate(sentence) returns an `Aligned`: the target text, the character ranges of the
source and target tokens in the sentence and in the target, and the alignment between them. The
pipeline (seqtool.pipeline) does this for every front-end, with its one text policy.

The modules, each one job: spans (Span, Unit, render_unit), protect (placeholders, letterless
text, the unit builder), placement (place_spans: cannot fail), sentences (split_sentences,
join_aligned), skeleton (a document's verbatim chunks around its units), html, markdown, formats
(which format, bytes <-> text, plain text, parse).
"""

from .formats import FORMATS, Document, Encoding, TextDocument, choose_format, looks_like_html, parse, parse_text, read_document
from .html import HtmlDocument, parse_html
from .markdown import MarkdownDocument, parse_markdown
from .placement import place_spans
from .protect import letterless, placeholders, protect
from .sentences import (Aligned, join_aligned, looks_like_several_sentences, split_sentences, splitter_available)
from .spans import Span, Unit, render_unit, span_words

__all__ = ["Aligned", "Document", "Encoding", "FORMATS", "HtmlDocument", "MarkdownDocument", "Span", "TextDocument", "Unit",
           "choose_format", "join_aligned", "letterless", "looks_like_html", "looks_like_several_sentences", "parse",
           "parse_html", "parse_markdown", "parse_text", "place_spans", "placeholders", "protect", "read_document",
           "render_unit", "span_words", "split_sentences", "splitter_available"]
