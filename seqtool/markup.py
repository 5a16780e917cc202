"""Inline markup as spans over the text a model sees, carried to a translation by its alignment.

A `Unit` is the text of one block (a paragraph, a heading, a table cell, a line) as the model
sees it, and the markup inside it as `Span`s: text[start:end] wrapped by `open` ... `close`
(`<b>` `</b>`, `**` `**`, `[` `](http://x)`). A void span (start == end, close == "") is markup
or text written verbatim at one place: `<br>`, `<img ...>`, inline code, and placeholders (URLs,
e-mail addresses: never given to the model). Spans nest: `parent` is the index of the enclosing
span in the unit's list (-1: none); a list is in document order (a parent before its children).

- `protect(text)`: plain text -> a Unit with its URLs and e-mail addresses cut out as void spans.
- `place_spans(unit, target, alignment, src_tokens, tgt_tokens)`: where each span goes in a
  translation, from a word alignment; always properly nested, snapped to whole words.
- `render_unit(target, spans)`: the text with the markup written back in.
- `parse_html(doc)`, `parse_markdown(doc)`: a document -> its units, and `.render(...)` back.

Documents are a skeleton of verbatim chunks around the units (`Skeleton`): whatever is not
translated text comes back byte for byte. seqtool.documents builds on this (sentences, plain
text documents) and its docstring says how the pieces fit together.
"""

from __future__ import annotations

import bisect
import functools
import html
import re
from dataclasses import dataclass, field, replace
from html.parser import HTMLParser
from typing import Callable, Optional, Sequence

from .errors import ConfigError

Escape = Callable[[str], str]


@dataclass(frozen=True)
class Span:
    """text[start:end] wrapped by `open` ... `close`, character offsets into a unit's text.

    A void span has start == end and close == "": `open` is written verbatim at `start`. `parent` is
    the index of the enclosing span in the same list, -1 at the top. `replaces_space` (line breaks
    between words: `<br>`, a Markdown line end): the text holds one whitespace character right after
    the span as a stand-in that the model reads, and render_unit writes the markup instead of it.
    """

    start: int
    end: int
    open: str
    close: str = ""
    parent: int = -1
    replaces_space: bool = False

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


# ---------------------------------------------------------------------------------------------
# placeholders

# A URL: a scheme (or www.) and everything up to whitespace, quotes or angle brackets; trailing
# punctuation that ends the sentence, and closing brackets without an opening one, are not part of it.
_PLACEHOLDER = re.compile(
    r"(?<![\w@.\-/])(?:"
    r"(?:https?|ftp|sftp|file)://[^\s<>\"]+|www\.[^\s<>\"]+\.[^\s<>\"]+|mailto:[^\s<>\"]+"
    r"|[\w.!#$%&'*+/=?^`{|}~-]+@[\w-]+(?:\.[\w-]+)+)",
    re.IGNORECASE,
)
_TRAILING = ".,;:!?'\"»”’…"
_EMAIL_DOMAIN = re.compile(r"@[\w-]+(?:\.[\w-]+)*\.[^\W\d_]{2,}$")  # an e-mail address ends in a domain name
_PAIRS = {")": "(", "]": "[", "}": "{"}


def placeholders(text: str) -> list[tuple[int, int]]:
    """The [start, end) ranges of the URLs (with a scheme: http, https, ftp, sftp, file, mailto; or
    starting www.) and e-mail addresses in `text`, in order. A bare domain (example.com) is a word."""
    found = []
    for match in _PLACEHOLDER.finditer(text):
        start, end = match.span()
        while end > start:
            last = text[end - 1]
            if last in _TRAILING or (last in _PAIRS and text.count(_PAIRS[last], start, end) < text.count(last, start, end)):
                end -= 1
            else:
                break
        if not _PLACEHOLDER.fullmatch(text, start, end):  # what is left after trimming must still be one
            continue
        candidate = text[start:end].lower()
        if "@" in candidate and "://" not in candidate and not candidate.startswith("mailto:"):
            if not _EMAIL_DOMAIN.search(candidate):
                continue
        elif not re.search(r"\w", re.sub(r"^(?:[a-z]+://|www\.|mailto:)", "", candidate)):
            continue
        found.append((start, end))
    return found


def protect(text: str) -> Unit:
    """Plain text -> a Unit without its URLs and e-mail addresses: each is a void span (its text the
    span's `open`), so the model never sees it and render_unit puts it back."""
    builder = _UnitBuilder()
    builder.text(text)
    return builder.finish()


# ---------------------------------------------------------------------------------------------
# building units: text (decoded for the model, raw for the document), spans, placeholders


class _UnitBuilder:
    """Accumulates one unit from a stream of text and markup events (the HTML, Markdown and plain text
    readers share it). Text comes as (decoded, raw) pairs: the model reads the decoded form; a
    placeholder found in it is written back in its raw form. Spans still open at the end, and the
    ones an end tag skips over, become void spans (their markup written where they opened)."""

    def __init__(self) -> None:
        self.chars: list[str] = []
        self.length = 0
        self.spans: list[list] = []  # [start, end, open, close, parent, replaces_space]
        self.stack: list[tuple[int, object]] = []  # (span index, key) of the open spans
        self.run: list[tuple[str, str]] = []  # text not yet searched for placeholders
        self.pending_break: Optional[int] = None  # a line-break void that may need a stand-in space
        self.voided: set[int] = set()  # spans opened but never closed: voids, their children re-parented at the end

    def text(self, decoded: str, raw: Optional[str] = None) -> None:
        if decoded:
            self.run.append((decoded, decoded if raw is None else raw))

    def open(self, markup: str, key: object) -> None:
        self._flush_run()
        self.stack.append((self._add(markup), key))

    def close(self, markup: str, key: object) -> bool:
        """Close the innermost open span with this key (those inside it become voids); False if none is open."""
        depth = next((d for d in range(len(self.stack) - 1, -1, -1) if self.stack[d][1] == key), None)
        if depth is None:
            return False
        self._flush_run()
        while len(self.stack) > depth + 1:
            self._to_void(self.stack.pop()[0])
        index, _ = self.stack.pop()
        self.spans[index][1], self.spans[index][3] = self.length, markup
        return True

    def void(self, markup: str, line_break: bool = False, stand_in: bool = False) -> None:
        """A void span. line_break: it separates words; when no whitespace is next to it, a stand-in
        space goes into the text (stand_in: always; the markup then holds the whitespace itself)."""
        self._flush_run()
        index = self._add(markup)
        if stand_in:
            self._stand_in(index)
        elif line_break and self.length and not self.chars[-1][-1:].isspace():
            self.pending_break = index

    def finish(self) -> Unit:
        self._flush_run()
        while self.stack:
            self._to_void(self.stack.pop()[0])
        parents: list[int] = []  # a span inside one that became void is inside that one's parent
        for start, end, markup, close, parent, stand_in in self.spans:
            parents.append(parents[parent] if parent in self.voided else parent)
        spans = [Span(s, e, o, c, parents[k], r) for k, (s, e, o, c, _, r) in enumerate(self.spans)]
        return Unit("".join(self.chars), spans)

    def _add(self, markup: str) -> int:
        """A span opening here, inside the innermost open one (a void until it is closed)."""
        self.spans.append([self.length, self.length, markup, "", self.stack[-1][0] if self.stack else -1, False])
        return len(self.spans) - 1

    def _to_void(self, index: int) -> None:
        span = self.spans[index]
        span[1], span[3] = span[0], ""
        self.voided.add(index)

    def _stand_in(self, index: int) -> None:
        self.spans[index][5] = True
        self._append(" ")

    def _append(self, decoded: str) -> None:
        if self.pending_break is not None:
            if not decoded[0].isspace():
                self._stand_in(self.pending_break)
            self.pending_break = None
        self.chars.append(decoded)
        self.length += len(decoded)

    def _flush_run(self) -> None:
        run, self.run = self.run, []
        if not run:
            return
        decoded = "".join(d for d, _ in run)
        raw = "".join(r for _, r in run)
        raw_at = _raw_offsets(run)
        cursor = 0
        for start, end in placeholders(decoded):
            if start > cursor:
                self._append(decoded[cursor:start])
            self._add(raw[raw_at(start, -1):raw_at(end, 1)])
            cursor = end
        if cursor < len(decoded):
            self._append(decoded[cursor:])


def _raw_offsets(run: list[tuple[str, str]]) -> Callable[[int, int], int]:
    """Maps an offset in the decoded text of `run` to the raw text's (a piece decoded unchanged maps
    character by character; inside another (an entity), to its start (side -1) or end (side 1))."""
    starts, raw_starts, d, r = [], [], 0, 0
    for decoded, raw in run:
        starts.append(d)
        raw_starts.append(r)
        d += len(decoded)
        r += len(raw)

    def at(offset: int, side: int) -> int:
        k = bisect.bisect_right(starts, offset) - 1
        decoded, raw = run[k]
        inside = offset - starts[k]
        if inside == 0:
            return raw_starts[k]
        if inside >= len(decoded):
            return raw_starts[k] + len(raw)
        if decoded == raw:
            return raw_starts[k] + inside
        return raw_starts[k] + (0 if side < 0 else len(raw))

    return at


# ---------------------------------------------------------------------------------------------
# rendering


def _children(spans: Sequence[Span]) -> list[list[int]]:
    """The indices of each span's children, in list order, and last the top level's (so that
    children[parent] works for parent -1); a parent must come before its children."""
    children: list[list[int]] = [[] for _ in range(len(spans) + 1)]
    for i, span in enumerate(spans):
        if not -1 <= span.parent < i:
            raise ValueError(f"span {i}: parent {span.parent} must be -1 or an earlier span")
        children[span.parent].append(i)
    return children


def _check_spans(text: str, spans: Sequence[Span]) -> list[list[int]]:
    """Validate spans over text (ranges inside the text and their parent's, voids empty, parents
    before children, siblings not overlapping); returns _children's lists in render order."""
    children = _children(spans)
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


def render_unit(target: str, spans: Sequence[Span], escape: Optional[Escape] = None) -> str:
    """`target` with each span's markup written around its range (voids at their place), siblings in
    order of position. escape: applied to the text between markup (HTML escaping), not to markup.
    Invalid spans (crossing, outside the text or their parent) are a ValueError."""
    children = _check_spans(target, spans)
    escape = escape or (lambda s: s)
    out: list[str] = []
    cursor = 0

    def upto(position: int) -> None:
        nonlocal cursor
        if position > cursor:
            out.append(escape(target[cursor:position]))
            cursor = position

    stack: list[tuple[int, object]] = [(-1, iter(children[-1]))]
    while stack:
        index, kids = stack[-1]
        child = next(kids, None)  # type: ignore[call-overload]
        if child is not None:
            upto(spans[child].start)
            out.append(spans[child].open)
            stack.append((child, iter(children[child])))
            continue
        stack.pop()
        if index >= 0:
            span = spans[index]
            upto(span.end)
            out.append(span.close)
            if span.replaces_space and cursor < len(target) and target[cursor].isspace():
                cursor += 1
    upto(len(target))
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# placing spans in a translation

# scripts written without spaces between words: a "word" there is one character
_UNSPACED = re.compile("[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]")


def _word_char(c: str) -> bool:
    return c.isalnum() and not _UNSPACED.match(c)


def _snap(text: str, position: int, step: int) -> int:
    """Move `position` by `step` (-1 left, 1 right) until it is not inside a word."""
    while 0 < position < len(text) and _word_char(text[position - 1]) and _word_char(text[position]):
        position += step
    return position


def _cores(text: str, ranges: Sequence[tuple[int, int]], what: str) -> list[Optional[tuple[int, int]]]:
    """Each token's range without its surrounding whitespace (None: only whitespace)."""
    out: list[Optional[tuple[int, int]]] = []
    for k, (a, b) in enumerate(ranges):
        if not 0 <= a <= b <= len(text):
            raise ValueError(f"{what} token {k} ({a}, {b}) is outside its text of {len(text)} characters")
        while a < b and text[a].isspace():
            a += 1
        while b > a and text[b - 1].isspace():
            b -= 1
        out.append((a, b) if a < b else None)
    return out


class _Placer:
    """The geometry of one placement: source tokens in order of position, target tokens, and which align."""

    def __init__(self, unit: Unit, target: str, alignment, src_tokens, tgt_tokens):
        self.source, self.target = unit.text, target
        src = _cores(unit.text, src_tokens, "source")
        self.tgt = _cores(target, tgt_tokens, "target")
        self.links: dict[int, list[int]] = {}
        for i, j in alignment:
            if not (0 <= i < len(src) and 0 <= j < len(self.tgt)):
                raise ValueError(f"alignment pair ({i}, {j}) is outside {len(src)} source and {len(self.tgt)} target tokens")
            if src[i] is not None and self.tgt[j] is not None:
                self.links.setdefault(i, []).append(j)
        order = sorted((c[0], c[1], i) for i, c in enumerate(src) if c is not None)
        self.starts = [a for a, _, _ in order]
        self.ends = [b for _, b, _ in order]
        self.index = [i for _, _, i in order]
        self.aligned = [n for n, i in enumerate(self.index) if i in self.links]  # positions of aligned tokens

    def hull(self, positions: Sequence[int], words: bool = True) -> Optional[tuple[int, int]]:
        """The range of the target tokens aligned to the source tokens at these positions (words:
        widened to whole words); None when none is aligned. Where those target tokens fall apart
        into runs (a word aligned to "son ... son" of "son of Solomon, the son"), the longest run
        (the first of equals): a tag wraps one phrase, not everything between two guesses; measured
        on bible test sentences with <b> and <a> (bench/documents.py, 300 lines): 66.1% -> 95.0% of the tags
        whose word the alignment translates wrap only words of its translation."""
        found = sorted({j for n in positions for j in self.links.get(self.index[n], [])})
        if not found:
            return None
        runs: list[list[int]] = [[found[0]]]
        for j in found[1:]:
            if j - runs[-1][-1] <= 1:
                runs[-1].append(j)
            else:
                runs.append([j])
        targets = [self.tgt[j] for j in max(runs, key=len)]
        start, end = min(t[0] for t in targets), max(t[1] for t in targets)  # type: ignore[index]
        return (_snap(self.target, start, -1), _snap(self.target, end, 1)) if words else (start, end)

    def nearest_aligned(self, low: int, high: int) -> Optional[int]:
        """The aligned position nearest to the positions [low, high) from outside them (before on a tie)."""
        k = bisect.bisect_left(self.aligned, low)
        before = self.aligned[k - 1] if k > 0 else None
        k = bisect.bisect_left(self.aligned, high)
        after = self.aligned[k] if k < len(self.aligned) else None
        if before is None or (after is not None and after - (high - 1) < low - before):
            return after
        return before

    def point(self, p: int) -> int:
        """Where a point at source offset p goes: after the translation of the token before it, or
        before the one of the token after it (the one it touches first; in whitespace, as far into
        the target's whitespace as it was); with no token before it (after it) in the source, else
        the start (the end); between two unaligned tokens, beside the nearest aligned token."""
        k = bisect.bisect_left(self.starts, p)  # tokens [k:] start at or after p
        prev, nxt = (k - 1 if k > 0 else None), (k if k < len(self.starts) else None)
        sides = []
        if prev is not None:
            sides.append((prev, 1, p - self.ends[prev]))
        if nxt is not None:
            next_first = prev is None or (self.starts[nxt] == p and p > self.ends[prev])
            sides.insert(0 if next_first else len(sides), (nxt, -1, self.starts[nxt] - p))
        for n, step, gap in sides:
            hull = self.hull([n], words=False)
            if hull is not None:
                return self._over_space(hull[1] if step > 0 else hull[0], gap, step)
        if prev is None or nxt is None:
            return 0 if prev is None else len(self.target)
        n = self.nearest_aligned(prev, nxt + 1)
        if n is None:
            return len(self.target)
        hull = self.hull([n], words=False)
        return hull[1] if n < prev else hull[0]  # type: ignore[index]

    def _over_space(self, position: int, gap: int, step: int) -> int:
        """position moved by up to `gap` whitespace characters of the target (step 1: right, -1: left)."""
        while gap > 0 and 0 <= position + min(step, 0) < len(self.target) and self.target[position + min(step, 0)].isspace():
            position, gap = position + step, gap - 1
        return position

    def place(self, span: Span) -> tuple[int, int]:
        low = bisect.bisect_right(self.ends, span.start)  # tokens [low, high) overlap the span
        high = bisect.bisect_left(self.starts, span.end)
        words = self.source[span.start:span.end]
        if low >= high or span.start == span.end:
            q = self.point(span.start)
            return q, self._over_space(q, len(words) if words.isspace() else 0, 1)
        hull = self.hull(range(low, high))
        if hull is None:  # none of its tokens aligned: wrap what its nearest aligned neighbour became
            n = self.nearest_aligned(low, high)
            if n is None:
                return len(self.target), len(self.target)
            hull = self.hull([n])
        start = self._over_space(hull[0], len(words) - len(words.lstrip()), -1)  # type: ignore[index]
        return start, self._over_space(hull[1], len(words) - len(words.rstrip()), 1)  # type: ignore[index]


def place_spans(unit: Unit, target: str, alignment: Sequence[tuple[int, int]],
                src_tokens: Sequence[tuple[int, int]], tgt_tokens: Sequence[tuple[int, int]]) -> list[Span]:
    """Where each of unit.spans goes in `target` (its translation): the same spans, in the same order,
    with new ranges in target; render_unit(target, result) writes the markup back.

    src_tokens / tgt_tokens: the [start, end) character range of each token in unit.text / target
    (whitespace around a token's text is ignored); alignment: (source token index, target token
    index) pairs. A span covering source tokens S wraps the smallest range of target words covering
    the tokens aligned to S (none aligned: what its nearest aligned neighbour became; nothing aligned
    at all: an empty range at the end); whitespace just inside its ends stays inside it where the
    target has some. A span's range never splits a word of a script written with spaces.

    A void (or empty, or wrapping no token) span goes after the translation of the source token just
    before it, or before the translation of the token just after it (whichever it touches in the
    source first; in whitespace, as far into the target's whitespace as it was); when neither is
    aligned: at the start if no token precedes it in the source, at the end if none follows it,
    else beside the nearest aligned token. Voids go between target tokens, as aligned.

    Nesting is repaired top-down: a child is clipped into its parent's range, siblings are ordered
    by position, and one overlapping an earlier sibling starts where that one ends.
    """
    children = _children(unit.spans)
    placer = _Placer(unit, target, alignment, src_tokens, tgt_tokens)
    ranges = [list(placer.place(span)) for span in unit.spans]
    todo = [(-1, 0, len(target))]
    while todo:
        parent, low, high = todo.pop()
        kids = children[parent]
        for k in kids:
            ranges[k][0] = min(max(ranges[k][0], low), high)
            ranges[k][1] = min(max(ranges[k][1], ranges[k][0]), high)
        kids.sort(key=lambda k: (ranges[k][0], ranges[k][1], k))
        cursor = low
        for k in kids:
            ranges[k][0] = max(ranges[k][0], cursor)
            ranges[k][1] = max(ranges[k][1], ranges[k][0])
            cursor = ranges[k][1]
            todo.append((k, ranges[k][0], ranges[k][1]))
    return [replace(span, start=a, end=b) for span, (a, b) in zip(unit.spans, ranges)]


def space_voids(unit: Unit, target: str, placed: Sequence[Span]) -> tuple[str, list[Span]]:
    """target and its placed spans, with a space put beside each void (a URL, an e-mail address, an
    image) where the source had whitespace on that side and the target has a word character: a
    placeholder never glues onto the translated words around it ("the https://x.org world", not
    "thehttps://x.orgworld")."""
    spans = [list((s.start, s.end)) for s in placed]
    text = target
    for i, source in enumerate(unit.spans):
        if not source.void or source.replaces_space:
            continue
        for side in (-1, 1):
            had = unit.text[source.start - 1].isspace() if side < 0 and source.start > 0 else \
                unit.text[source.start].isspace() if side > 0 and source.start < len(unit.text) else False
            at = spans[i][0]
            neighbour = text[at - 1] if side < 0 and at > 0 else text[at] if side > 0 and at < len(text) else " "
            if not had or neighbour.isspace():
                continue
            text = text[:at] + " " + text[at:]
            for k, (a, b) in enumerate(spans):  # what lies after the new space moves one on
                if k == i:
                    spans[k] = [a + 1, b + 1] if side < 0 else [a, b]
                else:
                    spans[k] = [a + 1 if a > at or (a == at and side < 0 and b > at) else a, b + 1 if b > at else b]
    return text, [replace(s, start=a, end=b) for s, (a, b) in zip(placed, spans)]


# ---------------------------------------------------------------------------------------------
# documents: verbatim chunks around units


class Skeleton:
    """A document as its verbatim chunks and its units, in order: render() puts translated units back.

    `units[k]` is what the model translates; render(translated) takes one (target text, spans) per
    unit, the spans being the unit's own (same count, order, markup and parents) placed over the
    target (place_spans), and returns the document with every chunk unchanged.
    """

    def __init__(self, chunks: list, units: list[Unit], escapes: list[Optional[Escape]]):
        self.chunks, self.units, self.escapes = chunks, units, escapes

    def render(self, translated: Sequence[tuple[str, Sequence[Span]]]) -> str:
        if len(translated) != len(self.units):
            raise ValueError(f"render needs one (text, spans) per unit: {len(self.units)} units, got {len(translated)}")
        out = []
        for chunk in self.chunks:
            if isinstance(chunk, str):
                out.append(chunk)
                continue
            target, spans = translated[chunk]
            own = self.units[chunk].spans
            if len(spans) != len(own) or any((a.open, a.close, a.parent) != (b.open, b.close, b.parent) for a, b in zip(spans, own)):
                raise ValueError(f"unit {chunk}: the spans given are not the unit's own ({len(spans)} for {len(own)}); place them with place_spans")
            out.append(render_unit(target, spans, self.escapes[chunk]))
        return "".join(out)

    def identity(self) -> list[tuple[str, list[Span]]]:
        """Each unit's own text and spans: render(identity()) gives the document back (see each format)."""
        return [(unit.text, list(unit.spans)) for unit in self.units]


class SkeletonBuilder:
    """Collects a Skeleton: verbatim text and units (a unit with no text to translate stays verbatim)."""

    def __init__(self) -> None:
        self.chunks: list = []
        self.units: list[Unit] = []
        self.escapes: list[Optional[Escape]] = []

    def verbatim(self, text: str) -> None:
        if text:
            self.chunks.append(text)

    def unit(self, unit: Unit, raw: str, escape: Optional[Escape]) -> None:
        if unit.text.strip():
            self.chunks.append(len(self.units))
            self.units.append(unit)
            self.escapes.append(escape)
        else:
            self.verbatim(raw)

    def finish(self, kind: type) -> Skeleton:
        return kind(self.chunks, self.units, self.escapes)


# ---------------------------------------------------------------------------------------------
# HTML

# elements that end a unit (their tags stay in the skeleton)
BLOCK = frozenset("""address article aside blockquote body caption center col colgroup dd details dialog dir div dl dt
    fieldset figcaption figure footer form frame frameset h1 h2 h3 h4 h5 h6 head header hgroup hr html legend li
    link main menu meta nav ol optgroup option p section summary table tbody td tfoot th thead title tr ul""".split())
# elements kept verbatim with their content: never translated
VERBATIM = frozenset("script style pre textarea code kbd samp svg math template iframe object noscript canvas video audio".split())
VOID_ELEMENTS = frozenset("area base br col embed hr img input keygen link meta param source track wbr".split())


# a character reference as browsers read it in text (the ; may be missing: html.unescape knows which names allow that)
_REFERENCE = re.compile(r"(&(?:#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[A-Za-z][A-Za-z0-9]*;?))")


def html_escape(text: str) -> str:
    """Text for HTML: & < > and U+00A0 as &amp; &lt; &gt; &nbsp;, every other character as itself."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\xa0", "&nbsp;")


class _HtmlEvents(HTMLParser):
    """html.parser's callbacks on doc[base:] as (kind, offset in doc, tag, attrs); each event's raw
    text runs to the next one's offset."""

    def __init__(self, newlines: list[int], base: int):
        super().__init__(convert_charrefs=False)
        self.events: list[tuple[str, int, str, list]] = []
        self.newlines, self.base = newlines, base  # offsets of every \n in doc; where this parser starts

    def position(self) -> int:
        """Where the construct being read starts, in doc."""
        line, column = self.getpos()
        if line == 1:
            return self.base + column
        return self.newlines[bisect.bisect_left(self.newlines, self.base) + line - 2] + 1 + column

    def _add(self, kind: str, tag: str = "", attrs: Optional[list] = None) -> None:
        self.events.append((kind, self.position(), tag, attrs or []))

    def handle_starttag(self, tag, attrs):
        self._add("start", tag, attrs)

    def handle_startendtag(self, tag, attrs):
        self._add("void", tag, attrs)

    def handle_endtag(self, tag):
        self._add("end", tag)

    def handle_data(self, data):
        self._add("text")

    handle_entityref = handle_charref = handle_data

    def handle_comment(self, data):
        self._add("other")

    handle_decl = handle_pi = unknown_decl = handle_comment


def _html_events(doc: str) -> list[tuple[str, int, str, list]]:
    """The events of the whole document ("start", "void", "end", "text", "other"). html.parser gives up
    on some malformed declarations (`<![x`) with an AssertionError: the `<` it stopped at is then
    text, and reading goes on after it."""
    newlines = [m.start() for m in re.finditer("\n", doc)]
    events: list[tuple[str, int, str, list]] = []
    base = 0
    while True:
        parser = _HtmlEvents(newlines, base)
        try:
            parser.feed(doc[base:])
            parser.close()
            events += parser.events
            break
        except Exception:
            stop = parser.position()
            events += [e for e in parser.events if e[1] < stop] + [("text", stop, "", [])]
            base = stop + 1
    # Text and references as one event per run (html.parser cuts runs where it likes, a reference
    # too, at the end of input); whatever comes before its first event is text as well.
    merged: list[tuple[str, int, str, list]] = [("text", 0, "", [])] if doc and (not events or events[0][1] > 0) else []
    for event in events:
        kind = "text" if event[0] == "ref" else event[0]
        if not (kind == "text" and merged and merged[-1][0] == "text"):
            merged.append((kind, *event[1:]))
    return merged


def _no_translate(attrs: list) -> bool:
    for name, value in attrs:
        if name == "translate" and (value or "").strip().lower() == "no":
            return True
        if name == "class" and "notranslate" in (value or "").split():
            return True
    return False


class HtmlDocument(Skeleton):
    """An HTML document (or fragment) as units; see parse_html."""


def parse_html(doc: str) -> HtmlDocument:
    """An HTML document -> its units and skeleton, with Python's html.parser (lenient: never raises).

    Units: the text between block elements (p, div, li, h1-h6, td, th, title, ...: BLOCK) as the
    model reads it (character references decoded), with the inline elements inside it (b, i, a,
    span, ...: any element not in BLOCK or VERBATIM) as spans whose markup is the original tag text;
    void elements (VOID_ELEMENTS), comments and stray end tags are void spans, and a `<br>` between
    two words stands on a space in the text (Span.replaces_space). Kept verbatim, never a unit:
    elements in VERBATIM (script, style, pre, code, textarea, ...) and any element with
    translate="no" or class "notranslate", with all their content (inside a unit they are one void
    span); doctype, comments and processing instructions between blocks; attribute values.

    Bad input: an unclosed inline element ends with its unit (its start tag becomes a void span);
    an end tag that closes elements opened inside it ends those too (they become void); an end tag
    with nothing to close is a void span; what html.parser cannot read as markup (a stray `<`, a
    broken declaration) is text; an unclosed verbatim element runs to the end of the document.

    Rendering writes the text with html_escape: an input whose text writes & < > U+00A0 as
    &amp; &lt; &gt; &nbsp; and no other character as a reference comes back byte for byte from
    the identity translation; otherwise the identity gives the same document with its references
    written that way (every tag, attribute and verbatim part unchanged).
    """
    events = _html_events(doc)
    out = SkeletonBuilder()
    builder: Optional[_UnitBuilder] = None
    unit_start = 0
    verbatim: Optional[list] = None  # [tag, depth, start offset, is a block]

    def flush(upto: int) -> None:
        nonlocal builder
        if builder is not None:
            out.unit(builder.finish(), doc[unit_start:upto], html_escape)
            builder = None

    def inline(at: int) -> _UnitBuilder:
        nonlocal builder, unit_start
        if builder is None:
            builder, unit_start = _UnitBuilder(), at
        return builder

    def close_verbatim(upto: int) -> None:
        """The verbatim element ends at `upto`: a chunk of its own (a block) or a void span of the unit."""
        nonlocal verbatim
        tag, _, start, block = verbatim  # type: ignore[misc]
        if block:
            out.verbatim(doc[start:upto])
        else:
            inline(start).void(doc[start:upto])
        verbatim = None

    for k, (kind, start, tag, attrs) in enumerate(events):
        end = events[k + 1][1] if k + 1 < len(events) else len(doc)
        raw = doc[start:end]
        if verbatim is not None:
            if kind == "start" and tag == verbatim[0]:
                verbatim[1] += 1
            elif kind == "end" and tag == verbatim[0]:
                verbatim[1] -= 1
                if verbatim[1] == 0:
                    close_verbatim(end)
            continue
        if kind in ("start", "void") and (tag in VERBATIM or _no_translate(attrs)):
            block = tag in BLOCK or tag in ("pre", "textarea", "template")
            if kind == "void" or tag in VOID_ELEMENTS:
                if block:
                    flush(start)
                    out.verbatim(raw)
                else:
                    inline(start).void(raw)
                continue
            if block:
                flush(start)
            verbatim = [tag, 1, start, block]
            continue
        if tag in BLOCK:
            flush(start)
            out.verbatim(raw)
            continue
        builder_now = inline(start)
        if kind == "text":
            for piece in _REFERENCE.split(raw):  # a reference decoded, the text between as it is
                builder_now.text(html.unescape(piece) if piece.startswith("&") else piece, piece)
        elif kind == "start" and tag not in VOID_ELEMENTS:
            builder_now.open(raw, tag)
        elif kind in ("start", "void"):
            builder_now.void(raw, line_break=tag == "br")
        elif kind == "end":
            if not builder_now.close(raw, tag):
                builder_now.void(raw)
        else:
            builder_now.void(raw)
    if verbatim is not None:
        close_verbatim(len(doc))
    flush(len(doc))
    return out.finish(HtmlDocument)  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# Markdown

_FRONT_MATTER = re.compile(r"\A(---|\+\+\+)[ \t]*\n.*?\n(?:\1|\.\.\.)[ \t]*(?:\n|\Z)", re.DOTALL)
_HTML_OPEN = re.compile(r"<([A-Za-z][A-Za-z0-9-]*)(?:\s[^>]*)?(?<!/)>\Z", re.DOTALL)
_HTML_CLOSE = re.compile(r"</([A-Za-z][A-Za-z0-9-]*)\s*>\Z")


@functools.lru_cache(maxsize=1)
def _markdown_parser():
    """markdown-it-py for CommonMark with tables and strikethrough, its escapes kept apart and its block
    rules recording where lines start (one, reused: parsing keeps its state per call)."""
    try:
        from markdown_it import MarkdownIt
    except ImportError:
        raise ConfigError("Markdown documents need markdown-it-py: pip install 'seqtool[documents]'") from None
    md = MarkdownIt("commonmark").enable(["table", "strikethrough"])
    if "text_join" not in md.get_all_rules()["core"]:  # markdown-it-py < 3 (rich accepts 2.2) joins escapes into text
        raise ConfigError("Markdown documents need markdown-it-py 3 or later: pip install 'seqtool[documents]'")
    md.disable("text_join")  # keep escapes and entities as tokens of their own, with their source form
    ruler = md.block.ruler
    for name in ("paragraph", "heading", "lheading", "table"):
        rule = ruler.__rules__[ruler.__find__(name)]
        ruler.at(name, _recording(rule.fn), {"alt": list(rule.alt)})
    return md


def _recording(rule):
    """A block rule that also records, in each inline token it makes, where each of its lines' content
    starts in the source (the rule sees the lines with their container markers, `>` and list indents, skipped)."""

    def wrapped(state, start_line, end_line, silent):
        before = len(state.tokens)
        matched = rule(state, start_line, end_line, silent)
        if matched and not silent:
            for token in state.tokens[before:]:
                if token.type == "inline" and token.map:
                    token.meta["starts"] = [state.bMarks[line] + state.tShift[line] for line in range(*token.map)]
        return matched

    return wrapped


class MarkdownDocument(Skeleton):
    """A Markdown document as units; see parse_markdown."""


class _NotFound(Exception):
    """The inline tokens of a block could not be located in its source: it stays verbatim."""


def parse_markdown(doc: str) -> MarkdownDocument:
    """A Markdown document (CommonMark with GitHub tables and strikethrough) -> units and skeleton.

    Parsed with markdown-it-py; units are the inline content of paragraphs, headings, table cells
    (so of list items and block quotes too). Inside a unit: emphasis, strong, strikethrough and links
    are spans (a link's `open` is "[", its `close` "](target)"), raw inline HTML tags are spans
    (paired by name) or voids, and inline code, images, autolinks and line ends (with the next
    line's container prefix, `> ` or a list indent; Span.replaces_space) are void spans. Code blocks,
    HTML blocks, link reference definitions, front matter (--- or +++) and every marker stay verbatim.

    The document is never re-rendered: only the character ranges of translated text are replaced,
    so everything else comes back byte for byte, and the identity translation gives the document
    back exactly. A unit's text is its source characters as written (backslash escapes and entity
    references included); a target's line breaks become spaces, and a `|` in a table cell is
    written `\\|`. A block whose inline text cannot be found in its lines stays verbatim.
    """
    md = _markdown_parser()
    source = doc.replace("\r\n", "\n").replace("\r", "\n").replace("\0", "\ufffd")  # what markdown-it reads
    crlf = [m.start() - k for k, m in enumerate(re.finditer("\r\n", doc))]  # source offsets where doc has one more character

    def original(a: int, b: int) -> str:
        return doc[a + bisect.bisect_right(crlf, a - 1):b + bisect.bisect_right(crlf, b - 1)]

    front = _FRONT_MATTER.match(source)
    base = front.end() if front else 0
    tokens = md.parse(source[base:])
    out = SkeletonBuilder()
    cursor = 0
    for k, token in enumerate(tokens):
        if token.type != "inline" or not token.children or "starts" not in token.meta:
            continue
        opener = tokens[k - 1] if k else None
        table = opener is not None and opener.type in ("th_open", "td_open")
        begin = token.meta["starts"][0] + base
        if table:
            begin = max(begin, cursor)
            while begin < len(source) and source[begin] in " \t|":
                begin += 1
        elif opener is not None and opener.type == "heading_open" and opener.markup.startswith("#"):
            begin = re.compile(r"#{1,6}[ \t]*").match(source, begin).end()
        try:
            unit, end = _markdown_unit(token.children, source, begin, original, [s + base for s in token.meta["starts"]])
        except _NotFound:
            continue
        if render_unit(unit.text, unit.spans) != original(begin, end):
            continue
        out.verbatim(original(cursor, begin))
        escape = _escape_cell if table else one_line
        out.unit(unit, original(begin, end), escape)
        cursor = end
    out.verbatim(original(cursor, len(source)))
    return out.finish(MarkdownDocument)  # type: ignore[return-value]


def one_line(text: str) -> str:
    """A target written on one line: its line breaks as spaces (a unit that is one line stays one)."""
    return text.replace("\n", " ")


def _escape_cell(text: str) -> str:
    return re.sub(r"(?<!\\)\|", r"\\|", one_line(text))


def _markdown_unit(children, source: str, at: int, original, starts: list[int]) -> tuple[Unit, int]:
    """One inline token's children located in `source` from offset `at` -> (unit, end offset)."""
    builder = _UnitBuilder()
    skip_until_close = False
    for token in children:
        kind = token.type
        if skip_until_close:  # inside an autolink, already written as one void
            skip_until_close = kind != "link_close"
            continue
        if kind == "text":
            if not token.content:
                continue
            end = _match_text(source, at, token.content)
            builder.text(original(at, end))
        elif kind == "text_special":
            end = _expect(source, at, token.markup)
            builder.text(original(at, end))
        elif kind in ("softbreak", "hardbreak"):
            newline = source.find("\n", at)
            if newline < 0 or source[at:newline].strip(" \t\\"):
                raise _NotFound
            after = bisect.bisect_left(starts, newline + 1)
            end = starts[after] if after < len(starts) else newline + 1
            builder.void(original(at, end), stand_in=True)
        elif kind in ("em_open", "strong_open", "s_open"):
            end = _expect(source, at, token.markup)
            builder.open(original(at, end), kind[:-5])
        elif kind in ("em_close", "strong_close", "s_close"):
            end = _expect(source, at, token.markup)
            builder.close(original(at, end), kind[:-6])
        elif kind == "link_open" and token.markup == "autolink":
            close = source.find(">", at)
            if not source.startswith("<", at) or close < 0:
                raise _NotFound
            end = close + 1
            builder.void(original(at, end))
            skip_until_close = True
        elif kind == "link_open":
            end = _expect(source, at, "[")
            builder.open(original(at, end), "link")
        elif kind == "link_close":
            end = _link_tail(source, _expect(source, at, "]"))
            builder.close(original(at, end), "link")
        elif kind == "image":
            end = _link_tail(source, _expect(source, _expect(source, at, "!["), token.content + "]"))
            builder.void(original(at, end))
        elif kind == "code_inline":
            ticks = _expect(source, at, token.markup) - at
            closing = re.compile(rf"(?<!`)`{{{ticks}}}(?!`)").search(source, at + ticks)
            if closing is None:
                raise _NotFound
            end = closing.end()
            builder.void(original(at, end))
        elif kind == "html_inline":
            end = _expect(source, at, token.content)
            raw = original(at, end)
            opening, closing_tag = _HTML_OPEN.match(token.content), _HTML_CLOSE.match(token.content)
            if opening and opening.group(1).lower() not in VOID_ELEMENTS:
                builder.open(raw, ("html", opening.group(1).lower()))
            elif not (closing_tag and builder.close(raw, ("html", closing_tag.group(1).lower()))):
                builder.void(raw, line_break=bool(opening) and opening.group(1).lower() == "br")
        else:
            raise _NotFound
        at = end
    return builder.finish(), at


def _expect(source: str, at: int, text: str) -> int:
    if not source.startswith(text, at):
        raise _NotFound
    return at + len(text)


def _match_text(source: str, at: int, content: str) -> int:
    """The end of `content` written at `at` (a table cell may write its | as \\|)."""
    if source.startswith(content, at):
        return at + len(content)
    for char in content:
        if source.startswith(char, at):
            at += 1
        elif char == "|" and source.startswith("\\|", at):
            at += 2
        else:
            raise _NotFound
    return at


def _link_tail(source: str, at: int) -> int:
    """The end of what follows a link's `]`: `(destination "title")`, `[label]`, or nothing (as markdown-it reads it)."""
    from markdown_it.helpers import parseLinkDestination, parseLinkTitle

    if source.startswith("(", at):
        pos = _skip_space(source, at + 1)
        if pos < len(source) and source[pos] != ")":
            destination = parseLinkDestination(source, pos, len(source))
            if destination.ok:
                pos = _skip_space(source, destination.pos)
                title = parseLinkTitle(source, pos, len(source))
                if pos != destination.pos and title.ok:
                    pos = _skip_space(source, title.pos)
        if pos < len(source) and source[pos] == ")":
            return pos + 1
    if source.startswith("[", at):
        pos = at + 1
        while pos < len(source) and source[pos] != "]":
            pos += 2 if source[pos] == "\\" else 1
        if pos < len(source):
            return pos + 1
    return at


def _skip_space(source: str, pos: int) -> int:
    while pos < len(source) and source[pos] in " \t\n":
        pos += 1
    return pos
