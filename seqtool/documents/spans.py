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
EMPHASIS = "emphasis"  # a Markdown delimiter run (*, _, **, __, ~~): CommonMark's flanking rules hold at its edges

OPENING = "([{¿¡«“‘„‚\"'"  # punctuation a following word leans on: no space is needed after it
CLOSING = ".,;:!?)]}»”’…%\"'"  # punctuation that leans on the word before: no space is needed before it
TRAILING = ".,;:!?'\"»”’…"  # what may follow a URL without becoming part of it (when whitespace follows)
# scripts written without spaces between words: no space is put beside markup there
UNSPACED_CLASS = "\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
UNSPACED = re.compile(f"[{UNSPACED_CLASS}]")
GLUES = "@.-/_"  # characters a URL or an e-mail address is not detected after (placeholders' lookbehind)


@dataclass(frozen=True)
class Span:
    """text[start:end] wrapped by `open` ... `close`, character offsets into a unit's text.

    A void span has start == end and close == "": `open` is written verbatim at `start`. `parent` is
    the index of the enclosing span in the same list, -1 at the top. `replaces_space` (a line break
    between words: `<br>`, a Markdown line end): the text holds one whitespace character right after
    the span as a stand-in that the model reads, and render_unit writes the markup instead of it.
    `kind`: MARKUP, PLACEHOLDER, SOFT_BREAK or EMPHASIS (above). `pad_before`, `pad_after`: set by
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


def _glues(char: str) -> bool:
    return char.isalnum() or char in GLUES


class _Writer:
    """The output of render_unit: text (escaped) and markup, with what the spacing rules need to know."""

    def __init__(self, target: str, escape: Escape):
        self.target, self.escape = target, escape
        self.out: list[str] = []
        self.cursor = 0  # how much of target is written
        self.last = ""  # the last character written, text or markup ("" at the start of the unit)
        self.last_text = ""  # the last character of target written
        self.pad = False  # a space is owed before the next text that is a word
        self.guard = False  # a placeholder was written: the next text must not continue it
        self.ended = False  # the last thing written ended an element (a close or a void): no text since
        self.opened = False  # the last thing written opened an element: a space here would be inside it

    def text(self, upto: int) -> None:
        if upto <= self.cursor:
            return
        piece = self.target[self.cursor:upto]
        first = piece[0]
        lead = getattr(self.escape, "lead", None) if not self.out else None  # (the first thing written: a line's start)
        after = self.target[upto] if upto < len(self.target) else ""
        if (self.pad and not first.isspace() and first not in CLOSING and not UNSPACED.match(first)
                and not UNSPACED.match(self.last_text or " ")) or \
                (self.guard and not first.isspace() and not _ends_a_url(piece, after)):
            self.markup(" ")
        written = self.escape(piece)
        self.out.append(lead(written) if lead is not None else written)
        self.cursor, self.last, self.last_text = upto, piece[-1], piece[-1]
        self.pad = self.guard = self.ended = self.opened = False

    def markup(self, text: str, sibling: bool = False) -> None:
        """Markup written as it is. sibling: it follows, with no text between, the end of another
        element: where both are made of the same delimiter character (two code spans, two emphasis
        runs), a space keeps them apart (`a``b` would be one code span, **a***b* one run)."""
        if text:
            if sibling and self.last == text[0] and text[0] in "`*_~":
                self.out.append(" ")
            self.out.append(text)
            self.last = text[-1]
            self.ended = False

    def space_before(self, span: Span) -> None:
        """Before a span's opening markup: a space owed by what came before (pad, guard: paid before the
        markup, not inside it), or one where the source had one and the target has none."""
        nxt = self.target[self.cursor] if self.cursor < len(self.target) else ""
        after = self.target[self.cursor + 1] if self.cursor + 1 < len(self.target) else ""
        if nxt and ((self.pad and not nxt.isspace() and nxt not in CLOSING and not UNSPACED.match(nxt)) or
                    (self.guard and not nxt.isspace() and not _ends_a_url(nxt, after))):
            self.markup(" ")
            self.pad = self.guard = False
            return
        if span.guard and self.last_text and _glues(self.last):
            self.markup(" ")
        elif span.pad_before and not self.opened and self.last and not self.last.isspace() and self.last not in OPENING and \
                (span.start == span.end or not nxt.isspace()) and not UNSPACED.match(nxt or " ") and not UNSPACED.match(self.last_text or " "):
            self.markup(" ")

    def space_after(self, span: Span) -> None:
        """After a span's closing markup: the next word is kept apart (pad_after), and nothing
        continues a placeholder."""
        if span.guard:
            self.guard = True
        if span.pad_after and (span.start == span.end or (self.last_text and not self.last_text.isspace())):
            self.pad = True


def _ends_a_url(piece: str, after: str) -> bool:
    """Whether text starting with `piece` (then `after`) may follow a URL without extending it:
    a closing bracket, or sentence punctuation followed by whitespace or the end."""
    first = piece[0]
    if first in ")]}<>\"":
        return True
    if first in TRAILING:
        rest = piece[1:] or after
        return not rest or rest[0].isspace() or rest[0] in TRAILING or rest[0] in ")]}"
    return False


def render_unit(target: str, spans: Sequence[Span], escape: Optional[Escape] = None) -> str:
    """`target` with each span's markup written around its range (voids at their place), siblings in
    order of position. escape: applied to the text between markup (HTML escaping), not to markup;
    its `lead`, where it has one, to the text the unit starts with (Markdown's block markers). Invalid spans (crossing, outside the text or their parent) are a ValueError."""
    children = check_spans(target, spans)
    w = _Writer(target, escape or (lambda s: s))
    stack: list[tuple[int, object]] = [(-1, iter(children[-1]))]
    while stack:
        index, kids = stack[-1]
        child = next(kids, None)  # type: ignore[call-overload]
        if child is not None:
            span = spans[child]
            w.text(span.start)
            w.space_before(span)
            if span.kind == EMPHASIS:  # a run followed by punctuation opens only after a space or punctuation
                kids = children[child]
                inside = spans[kids[0]].open[:1] if kids and spans[kids[0]].start == span.start and spans[kids[0]].open else \
                    target[span.start:span.start + 1]
                if inside and punctuation(inside) and w.last and not (w.last.isspace() or punctuation(w.last)):
                    w.markup(" ")
            w.markup(span.open, sibling=w.ended)
            w.ended, w.opened = span.void, not span.void
            stack.append((child, iter(children[child])))
            continue
        stack.pop()
        if index >= 0:
            span = spans[index]
            w.text(span.end)
            if span.kind == EMPHASIS and w.last and punctuation(w.last):
                w.pad = True  # a run after punctuation closes only before a space or punctuation
            w.markup(span.close)
            w.ended, w.opened = True, False
            if span.replaces_space and w.cursor < len(target) and target[w.cursor].isspace():
                w.cursor += 1
            w.space_after(span)
    w.text(len(target))
    return "".join(w.out)
