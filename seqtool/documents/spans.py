"""Inline markup as spans over the text a model sees, and the text written back with its markup.

A `Unit` is the text of one block (a paragraph, a heading, a table cell, a line, an attribute value)
as the model sees it, and the markup inside it as `Span`s: text[start:end] wrapped by `open` ...
`close` (`<b>` `</b>`, `**` `**`, `[` `](http://x)`). A void span (start == end, close == "") is
markup or text written verbatim at one place: `<br>`, `<img ...>`, inline code, and placeholders
(URLs, e-mail addresses: never given to the model). Spans nest: `parent` is the index of the
enclosing span in the unit's list (-1: none); a list is in document order (a parent before its
children).

`render_unit(target, spans)` writes a text with its spans' markup back in. It is linear in the
text and the spans. Where placement (placement.py) put a span into a translation, the span says
whether its source had whitespace at its edges (`pad_before`, `pad_after`): rendering then keeps
it apart from the words around it ("the <code>enum</code> land", never "<code>enum</code>the"),
and a placeholder is never glued to a word or to another placeholder (the URL read back is the
URL written). The identity rendering (a unit's own text and spans) adds nothing.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

Escape = Callable[[str], str]

# kinds of span (Span.kind)
MARKUP = ""  # a tag, a link, anything written around or at its place
PLACEHOLDER = "placeholder"  # a URL or an e-mail address (void): what it reads back as must be what it was
SOFT_BREAK = "soft"  # a line end inside a Markdown paragraph: a space to CommonMark, left out of a translation
HARD_BREAK = "hard"  # a Markdown hard line break: only between two words of its parent (else left out)
EMPHASIS = "emphasis"  # a Markdown delimiter run (*, _, **, __, ~~): CommonMark's flanking rules hold at its edges

OPENING = "([{¿¡«“‘„‚\"'"  # punctuation a following word leans on: no space is needed after it
CLOSING = ".,;:!?)]}»”’…%\"'"  # punctuation that leans on the word before: no space is needed before it
TRAILING = ".,;:!?'\"»”’…"  # what may follow a URL without becoming part of it (when whitespace follows)
# scripts written without spaces between words: no space is put beside markup there
UNSPACED_CLASS = "\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
UNSPACED = re.compile(f"[{UNSPACED_CLASS}]")
GLUES = "@.-/_!#$%&'*+=?^`{|}~"  # besides letters and digits: what a URL or an e-mail address is not found after


@dataclass(frozen=True)
class Span:
    """text[start:end] wrapped by `open` ... `close`, character offsets into a unit's text.

    A void span has start == end and close == "": `open` is written verbatim at `start`. `parent` is
    the index of the enclosing span in the same list, -1 at the top. `replaces_space` (a line break
    between words: `<br>`, a Markdown line end): the text holds one whitespace character right after
    the span as a stand-in that the model reads, and render_unit writes the markup instead of it.
    `kind`: MARKUP, PLACEHOLDER, SOFT_BREAK, HARD_BREAK or EMPHASIS (above). `pad_before`, `pad_after`: set by
    placement where the source had whitespace at that edge; render_unit keeps a space there.
    `guard`: set by placement on a placeholder: render_unit keeps the words around it from joining it.
    """

    start: int
    end: int
    open: str
    close: str = ""
    parent: int = -1
    replaces_space: bool = False
    kind: str = MARKUP
    pad_before: bool = False
    pad_after: bool = False
    guard: bool = False

    @property
    def void(self) -> bool:
        return self.close == "" and self.start == self.end


@dataclass
class Unit:
    """The text the model sees for one block, and its markup as spans (document order)."""

    text: str
    spans: list[Span] = field(default_factory=list)


def span_words(unit: Unit, span: Span) -> str:
    """The source text that `span` wraps ("" for a void span)."""
    return unit.text[span.start:span.end]


def children_of(spans: Sequence[Span]) -> list[list[int]]:
    """The indices of each span's children, in list order, and last the top level's (so that
    children[parent] works for parent -1); a parent must come before its children."""
    children: list[list[int]] = [[] for _ in range(len(spans) + 1)]
    for i, span in enumerate(spans):
        if not -1 <= span.parent < i:
            raise ValueError(f"span {i}: parent {span.parent} must be -1 or an earlier span")
        children[span.parent].append(i)
    return children


def check_spans(text: str, spans: Sequence[Span]) -> list[list[int]]:
    """Validate spans over text (ranges inside the text and their parent's, voids empty, parents
    before children, siblings not overlapping); returns children_of's lists in render order."""
    children = children_of(spans)
    for i, span in enumerate(spans):
        if not 0 <= span.start <= span.end <= len(text):
            raise ValueError(f"span {i} ({span.start}, {span.end}) is outside the text of {len(text)} characters")
        if span.close == "" and span.start != span.end:
            raise ValueError(f"span {i}: a void span (close '') must be empty, got ({span.start}, {span.end})")
        outer = spans[span.parent] if span.parent >= 0 else None
        if outer is not None and not outer.start <= span.start <= span.end <= outer.end:
            raise ValueError(f"span {i} ({span.start}, {span.end}) is not inside its parent {span.parent} ({outer.start}, {outer.end})")
    for kids in children:
        kids.sort(key=lambda k: (spans[k].start, spans[k].end, k))
        for a, b in zip(kids, kids[1:]):
            if spans[b].start < spans[a].end:
                raise ValueError(f"spans {a} and {b} overlap: ({spans[a].start}, {spans[a].end}) and ({spans[b].start}, {spans[b].end})")
    return children


def punctuation(char: str) -> bool:
    """CommonMark's Unicode punctuation (categories P and S)."""
    return unicodedata.category(char)[0] in "PS"


_LINE_END = re.compile(r"\n[ \t>]*\Z")  # markup ending a line (and the next line's container prefix)


def _glues(char: str) -> bool:
    return bool(char) and (char.isalnum() or char in GLUES)


class _Writer:
    """The output of render_unit: text (escaped) and markup, with what the spacing rules need to know."""

    def __init__(self, target: str, escape: Escape):
        self.target, self.escape = target, escape
        self.out: list[str] = []
        self.cursor = 0  # how much of target is written
        self.last = ""  # the last character written, text or markup ("" at the start of the unit)
        self.last_text = ""  # the last character of target written
        self.kind = ""  # what was written last: "text", "open", "end" (a close or a void), "" (nothing)
        self.pad = False  # a space is owed before the next word
        self.guard = False  # a placeholder was written: the next text must not continue it
        self.gap = False  # whitespace was written since the last character of target
        self.strict = False  # a delimiter run after punctuation was written: what follows is whitespace or punctuation
        self.line_start = True  # no text written since the unit's start or a line break

    def _wordish(self, char: str) -> bool:
        """Whether an owed space goes before this character (not before whitespace, closing punctuation,
        or between characters of scripts written without spaces)."""
        return bool(char) and not char.isspace() and char not in CLOSING and \
            not (UNSPACED.match(char) or UNSPACED.match(self.last_text or " "))

    def text(self, upto: int) -> None:
        if upto <= self.cursor:
            return
        piece = self.target[self.cursor:upto]
        after = self.target[upto] if upto < len(self.target) else ""
        if (self.pad and self._wordish(piece[0])) or (self.guard and not piece[0].isspace() and not _ends_a_url(piece, after)) \
                or (self.strict and not piece[0].isspace() and not punctuation(piece[0])) \
                or (self.kind == "end" and self.last == "]" and piece[0] in "[("):
            self._write(" ")
        written = self.escape(piece)
        lead = getattr(self.escape, "lead", None) if self.line_start else None  # (at a line's start: the unit's, a break's)
        if lead is not None:
            written = lead(written)
        self.cursor = upto
        if written:
            self.line_start = False
            self._write(written)
            self.last_text, self.kind, self.gap = piece[-1], "text", written[-1].isspace()
            self.pad = self.guard = self.strict = False

    def _write(self, text: str) -> None:
        if text[0].isspace() or punctuation(text[0]):  # (what a delimiter run after punctuation may meet)
            self.strict = False
        self.out.append(text)
        self.last = text[-1]
        self.gap = self.gap or any(c.isspace() for c in text)
        if self.last.isspace():  # (whitespace written, a line break in markup too, pays what a space was owed)
            self.pad = False

    def markup(self, text: str, kind: str, starts: bool = False) -> None:
        """Markup written as it is, of kind "open" or "end" (starts: it opens an element or is a void).
        A start right after another element's end
        with the same delimiter character (two code spans, two emphasis runs) is kept apart by a
        space: `a``b` would be one code span, **a***b* one run; so is a [ or ( after a ]."""
        if not text:
            return
        if self.kind == "end" and starts and (self.last == text[0] and text[0] in "`*_~" or self.last == "]" and text[0] in "[("):
            self._write(" ")  # ([a][b] and [a](b) would be one link)
        self._write(text)
        self.kind = kind
        if kind == "end":  # (a close or a void may end text of its own: "2024" in <b>2024</b>; whitespace since counts from here)
            self.gap = text[-1].isspace()
        self.line_start = _LINE_END.search(text) is not None  # (after a line break's markup, the next text starts a line)

    def space_before(self, span: Span, inner: str = "", leads: bool = False) -> None:
        """Before a span's opening markup: a space owed by what came before (pad, guard: paid before the
        markup, not inside it), or one where the source had one and the target has none. inner: the
        markup written first inside the span, if a child starts where it does; leads: a placeholder
        is written before any text of the span (it, or a child at its start)."""
        nxt = self.target[self.cursor] if self.cursor < len(self.target) else ""
        after = self.target[self.cursor + 1] if self.cursor + 1 < len(self.target) else ""
        if self.pad or self.guard:  # (what follows a placeholder, markup too, may read as part of it: apart)
            owed = span.guard or (self.pad and self._wordish(nxt)) or (self.guard and not span.open[:1].isspace())
            self.pad = self.guard = False
            if owed:
                self._write(" ")
                return
        if leads and self.last and not self.gap and (self.kind == "end" or _glues(self.last_text)):
            self._write(" ")  # (markup renders as nothing, or as text that may end in a letter: apart either way)
        elif span.pad_before and self.kind in ("text", "end") and not self.last.isspace() and self.last not in OPENING and \
                (span.start == span.end or not nxt.isspace() or inner) and not UNSPACED.match(nxt or " ") and \
                not UNSPACED.match(self.last_text or " "):
            self._write(" ")

    def space_after(self, span: Span) -> None:
        """After a span's closing markup: the next word is kept apart (pad_after), and nothing
        continues a placeholder."""
        if span.guard:
            self.guard = True
        if span.pad_after and (span.start == span.end or (self.last_text and not self.last_text.isspace())):
            self.pad = True


def _ends_a_url(piece: str, after: str) -> bool:
    """Whether text starting with `piece` (then `after`) may follow a URL without extending it: what
    comes after a run of sentence punctuation and closing brackets (which a URL read back sheds) is
    whitespace, the end, or a character a URL never holds (< > ")."""
    k = 0
    while k < len(piece) and (piece[k] in TRAILING or piece[k] in ")]}"):
        k += 1
    rest = piece[k:] or after
    return not rest or rest[0].isspace() or rest[0] in '<>"'


def _run_before_punctuation(markup: str, following: str) -> bool:
    """Whether markup starts with a delimiter run (*, _, ~) followed by punctuation (in it, or what follows it)."""
    run = len(markup) - len(markup.lstrip("*_~"))
    nxt = markup[run:run + 1] or following
    return bool(run and nxt and punctuation(nxt))


def _run_after_punctuation(markup: str, preceding: str) -> bool:
    """Whether markup ends with a delimiter run that punctuation comes before (in it, or what was written before it)."""
    run = len(markup) - len(markup.rstrip("*_~"))
    prev = markup[:len(markup) - run][-1:] or preceding
    return bool(run and prev and punctuation(prev))


def render_unit(target: str, spans: Sequence[Span], escape: Optional[Escape] = None) -> str:
    """`target` with each span's markup written around its range (voids at their place), siblings in
    order of position. escape: applied to the text between markup (HTML escaping), not to markup;
    its `lead`, where it has one, to the text the unit starts with (Markdown's block markers).
    Invalid spans (crossing, outside the text or their parent) are a ValueError."""
    children = check_spans(target, spans)
    w = _Writer(target, escape or (lambda s: s))
    stack: list[tuple[int, object]] = [(-1, iter(children[-1]))]
    while stack:
        index, kids = stack[-1]
        child = next(kids, None)  # type: ignore[call-overload]
        if child is not None:
            span = spans[child]
            w.text(span.start)
            kids = children[child]
            inner = spans[kids[0]].open if kids and spans[kids[0]].start == span.start else ""
            leads, first = span.guard, child  # a placeholder right inside it: kept apart before its markup, not in it
            while not leads and children[first] and spans[children[first][0]].start == span.start:
                first = children[first][0]
                leads = spans[first].guard
            if span.open or span.close:  # (markup left out of a translation, a soft line break, asks for nothing)
                w.space_before(span, inner, leads)
            # a delimiter run (*, _, ~) followed by punctuation opens only after whitespace or punctuation (CommonMark)
            if _run_before_punctuation(span.open, inner[:1] or target[span.start:span.start + 1]) and w.last and \
                    not (w.last.isspace() or punctuation(w.last)):
                w.markup(" ", "text")
            w.markup(span.open, "end" if span.void else "open", starts=True)
            if span.void and _run_after_punctuation(span.open, w.last_text):
                w.strict = True
            stack.append((child, iter(children[child])))
            continue
        stack.pop()
        if index >= 0:
            span = spans[index]
            if not span.void:
                w.text(span.end)
                before = w.last  # a run after punctuation closes only before whitespace or punctuation
                w.markup(span.close, "end")
                w.strict = w.strict or _run_after_punctuation(span.close, before)
            if span.replaces_space and w.cursor < len(target) and target[w.cursor].isspace():
                w.cursor += 1
            w.space_after(span)
    w.text(len(target))
    return "".join(w.out)
