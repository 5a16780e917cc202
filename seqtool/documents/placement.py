"""Where a unit's spans go in its translation, from the model's word alignment. It cannot fail.

`place_spans(unit, target, alignment, src_tokens, tgt_tokens)` returns the unit's spans (same
count, order, markup and parents) over `target`, always valid for render_unit, for any alignment
(pairs out of range are ignored, token ranges clipped), in time O(n log n) in the unit's size:

1. Where each span would like to go. A span with text wraps the target words aligned to its
   tokens (the longest run of them: a tag wraps one phrase, not everything between two guesses),
   or, none aligned, what its nearest aligned neighbour became. A span with no text of its own (a
   void, `<a><code>x</code></a>`, a link around a URL, `<b> </b>`) is an atom: it and everything
   inside it go to one point, after the translation of the token before it or before the one after
   it (as it touched them in the source).
2. Nesting and order, top down: a span's range first widened to hold where its children would go,
   then each span inside its parent's range, siblings in their source order
   (the tag stream is the source's), each span with text given at least one word of the target
   where the parent's range has enough for all of them. The top level stays off the target's outer
   whitespace.
3. Edges: a Markdown emphasis run starts and ends where CommonMark reads it as one (left- and
   right-flanking; `_` becomes `*` inside a word); a soft line break is left out; spacing is
   recorded for render_unit (pad_before / pad_after where the source had whitespace, guard on
   placeholders).
"""

from __future__ import annotations

import bisect
import itertools
import re
import unicodedata
from dataclasses import replace
from typing import Optional, Sequence

from .spans import EMPHASIS, HARD_BREAK, PLACEHOLDER, SOFT_BREAK, UNSPACED, UNSPACED_CLASS, Span, Unit, children_of

# in scripts written without spaces between words, a "word" is one character
_WORD = re.compile(f"[{UNSPACED_CLASS}]|(?:(?![{UNSPACED_CLASS}])[^\\W_])+")
SHORT_SPAN = 4  # tokens: a span over at most this many wraps one unbroken run of their translations' tokens
_RUNS = re.compile(r"\s+|\S+")
LONG_SPAN = 64  # tokens: a span over more is placed by the hull of all its tokens' translations (no run search)


def _word_char(c: str) -> bool:
    return c.isalnum() and not UNSPACED.match(c)


def _punctuation(c: str) -> bool:
    return unicodedata.category(c)[0] in "PS"


def has_words(text: str) -> bool:
    return any(c.isalnum() for c in text)


class _Target:
    """The target's geometry: its words, its whitespace runs."""

    def __init__(self, text: str):
        self.text = text
        words = [m.span() for m in _WORD.finditer(text)]
        self.word_starts = [a for a, _ in words]
        self.word_ends = [b for _, b in words]
        n = len(text)
        # position p: the end of the whitespace run starting at p, the start of the one ending at p; the
        # same for runs of anything else (built a run at a time: a unit of any length costs little)
        self.space_end, self.space_start = list(range(n + 1)), list(range(n + 1))
        self.solid_end, self.solid_start = list(range(n + 1)), list(range(n + 1))
        for run in _RUNS.finditer(text):
            a, b = run.span()
            ends, starts = (self.space_end, self.space_start) if text[a].isspace() else (self.solid_end, self.solid_start)
            ends[a:b] = [b] * (b - a)
            starts[a + 1:b + 1] = [a] * (b - a)

    def snap(self, position: int, step: int) -> int:
        """`position` moved out of the word it is inside (left: step -1; right: 1)."""
        k = bisect.bisect_right(self.word_starts, position) - 1
        if k >= 0 and self.word_starts[k] < position < self.word_ends[k] and _word_char(self.text[position]):
            return self.word_starts[k] if step < 0 else self.word_ends[k]
        return position

    def over_space(self, position: int, gap: int, step: int) -> int:
        """position moved by up to `gap` whitespace characters of the target (step 1: right, -1: left)."""
        if gap <= 0:
            return position
        if step > 0:
            return min(self.space_end[position], position + gap)
        return max(self.space_start[position], position - gap)

    def words_in(self, low: int, high: int) -> tuple[int, int]:
        """The indices [i, j) of the words wholly inside [low, high)."""
        return bisect.bisect_left(self.word_starts, low), bisect.bisect_right(self.word_ends, high)


class _SparseExtent:
    """min of starts / max of ends over a range of positions, in O(1) after O(n log n)."""

    def __init__(self, starts: list[float], ends: list[float]):
        self.low, self.high = [starts], [ends]
        width = 1
        while 2 * width <= len(starts):
            lo, hi = self.low[-1], self.high[-1]
            self.low.append([min(lo[i], lo[i + width]) for i in range(len(lo) - width)])
            self.high.append([max(hi[i], hi[i + width]) for i in range(len(hi) - width)])
            width *= 2

    def query(self, a: int, b: int) -> tuple[float, float]:
        level = (b - a).bit_length() - 1
        width = 1 << level
        return (min(self.low[level][a], self.low[level][b - width]), max(self.high[level][a], self.high[level][b - width]))


def _cores(text: str, ranges: Sequence[tuple[int, int]]) -> list[Optional[tuple[int, int]]]:
    """Each token's range (clipped to the text) without its surrounding whitespace (None: only whitespace)."""
    out: list[Optional[tuple[int, int]]] = []
    n = len(text)
    for a, b in ranges:
        a, b = min(max(int(a), 0), n), min(max(int(b), 0), n)
        while a < b and text[a].isspace():
            a += 1
        while b > a and text[b - 1].isspace():
            b -= 1
        out.append((a, b) if a < b else None)
    return out


class _Placer:
    """The geometry of one placement: source tokens in order of position, target tokens, and which align."""

    def __init__(self, unit: Unit, target: _Target, alignment, src_tokens, tgt_tokens):
        self.source, self.target = unit.text, target
        src = _cores(unit.text, src_tokens)
        self.tgt = _cores(target.text, tgt_tokens)
        self.links: dict[int, list[int]] = {}
        for pair in alignment:
            i, j = int(pair[0]), int(pair[1])
            if 0 <= i < len(src) and 0 <= j < len(self.tgt) and src[i] is not None and self.tgt[j] is not None:
                self.links.setdefault(i, []).append(j)
        order = sorted((c[0], c[1], i) for i, c in enumerate(src) if c is not None)
        self.starts = [a for a, _, _ in order]
        self.ends = [b for _, b, _ in order]
        self.index = [i for _, _, i in order]
        self.aligned = [n for n, i in enumerate(self.index) if i in self.links]  # positions of aligned tokens
        self._extent: Optional[_SparseExtent] = None  # built when a span of more than LONG_SPAN tokens asks
        self.target_inner = (len(target.text) - len(target.text.lstrip()), len(target.text.rstrip()))

    def extent(self) -> _SparseExtent:
        if self._extent is None:
            inf = float("inf")
            lows = [min((self.tgt[j][0] for j in self.links.get(i, [])), default=inf) for i in self.index]  # type: ignore[index]
            highs = [max((self.tgt[j][1] for j in self.links.get(i, [])), default=-inf) for i in self.index]  # type: ignore[index]
            self._extent = _SparseExtent(lows, highs)
        return self._extent

    def first(self, p: int) -> int:
        """Where a point with no token before it goes: as far into the target's leading whitespace as it was."""
        return self.target.over_space(0, p, 1)

    def last(self, p: int) -> int:
        """Where a point with no token after it goes: as far from the target's end as it was, in whitespace."""
        return self.target.over_space(len(self.target.text), len(self.source) - p, -1)

    def hull(self, low: int, high: int, words: bool = True) -> Optional[tuple[int, int]]:
        """The range of the target tokens aligned to the source tokens at positions [low, high)
        (words: widened to whole words); None when none is aligned. Where those target tokens fall
        apart into runs (a word aligned to "son ... son" of "son of Solomon, the son"), the longest
        run (the first of equals): measured on bible test sentences with <b> and <a>
        (bench/documents.py, 300 lines): 66.1% -> 95.0% of the tags whose word the alignment
        translates wrap only words of its translation. A run of a span over more than SHORT_SPAN
        tokens may have gaps of half its length (words reordered in and out of a clause); a span
        of more than LONG_SPAN tokens takes the hull of all its tokens' translations."""
        if high - low > LONG_SPAN:
            start, end = self.extent().query(low, high)
            if start == float("inf"):
                return None
        else:
            found = sorted({j for n in range(low, high) for j in self.links.get(self.index[n], [])})
            if not found:
                return None
            gap = 1 if high - low <= SHORT_SPAN else max(2, (high - low) // 2)  # (a long span tolerates words moved in and out)
            runs: list[list[int]] = [[found[0]]]
            for j in found[1:]:
                if j - runs[-1][-1] <= gap:
                    runs[-1].append(j)
                else:
                    runs.append([j])
            targets = [self.tgt[j] for j in max(runs, key=len)]
            start, end = min(t[0] for t in targets), max(t[1] for t in targets)  # type: ignore[index]
        start, end = int(start), int(end)
        return (self.target.snap(start, -1), self.target.snap(end, 1)) if words else (start, end)

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
        """Where a point at source offset p goes: with no token before it (after it) in the source, to
        the start (the end), as far into the target's whitespace as it was; else after the translation
        of the token before it, or before the one of the token after it (the one it touches first; in
        whitespace, as far into the target's whitespace as it was); between two unaligned tokens,
        beside the nearest aligned token."""
        k = bisect.bisect_left(self.starts, p)  # tokens [k:] start at or after p
        prev, nxt = (k - 1 if k > 0 else None), (k if k < len(self.starts) else None)
        if prev is None:  # before every token: at the start, whatever the first word became
            return self.first(p)
        if nxt is None:
            return self.last(p)
        inside = 0 < p < len(self.source) and self.source[p - 1].isalnum() and self.source[p].isalnum()
        sides = []
        sides.append((prev, 1, p - self.ends[prev]))
        next_first = self.starts[nxt] == p and p > self.ends[prev]
        sides.insert(0 if next_first else len(sides), (nxt, -1, self.starts[nxt] - p))
        for n, step, gap in sides:
            hull = self.hull(n, n + 1, words=False)
            if hull is not None:
                q = hull[1] if step > 0 else hull[0]  # (never inside a word, unless it was inside one)
                return self.target.over_space(q if inside else self.target.snap(q, step), gap, step)
        n = self.nearest_aligned(prev, nxt + 1)
        if n is None:
            return self.last(p)
        hull = self.hull(n, n + 1, words=False)
        if inside:
            return hull[1] if n < prev else hull[0]  # type: ignore[index]
        return self.target.snap(hull[1], 1) if n < prev else self.target.snap(hull[0], -1)  # type: ignore[index]

    def place(self, span: Span) -> tuple[int, int]:
        """Where a span with words would like to go."""
        low = bisect.bisect_right(self.ends, span.start)  # tokens [low, high) overlap the span
        high = bisect.bisect_left(self.starts, span.end)
        if low >= high:
            q = self.point(span.start)
            return q, q
        hull = self.hull(low, high)
        if hull is None:  # none of its tokens aligned: wrap what its nearest aligned neighbour became
            n = self.nearest_aligned(low, high)
            if n is None:
                end = self.target_inner[1]
                return end, end
            hull = self.hull(n, n + 1)
        words = self.source[span.start:span.end]  # whitespace just inside its ends stays inside it where the target has some
        start = self.target.over_space(hull[0], len(words) - len(words.lstrip()), -1)  # type: ignore[index]
        return start, self.target.over_space(hull[1], len(words) - len(words.rstrip()), 1)  # type: ignore[index]


def place_spans(unit: Unit, target: str, alignment: Sequence[tuple[int, int]],
                src_tokens: Sequence[tuple[int, int]], tgt_tokens: Sequence[tuple[int, int]]) -> list[Span]:
    """Where each of unit.spans goes in `target` (its translation): the same spans, in the same order,
    with new ranges in target, valid for render_unit whatever the alignment (see the module's
    docstring for how). src_tokens / tgt_tokens: the [start, end) character range of each token in
    unit.text / target; alignment: (source token index, target token index) pairs."""
    spans = unit.spans
    if not spans:
        return []
    children = children_of(spans)
    geometry = _Target(target)
    placer = _Placer(unit, geometry, alignment, src_tokens, tgt_tokens)
    text = unit.text
    # 1. wishes: atoms (no word of their own, or inside one) go to a point
    atom = [False] * len(spans)
    wish: list[tuple[int, int]] = []
    for k, span in enumerate(spans):
        atom[k] = span.void or not text[span.start:span.end].strip() or (span.parent >= 0 and atom[span.parent])
        if atom[k]:  # (its whitespace, if it wraps some, with it where the target has some there)
            q = placer.point(span.start)
            wish.append((q, q if span.void else geometry.over_space(q, span.end - span.start, 1)))
        else:
            wish.append(placer.place(span))
    for k in range(len(spans) - 1, -1, -1):  # a span wraps where its children would go (children come after parents)
        parent = spans[k].parent
        if parent >= 0 and not atom[parent]:
            wish[parent] = (min(wish[parent][0], wish[k][0]), max(wish[parent][1], wish[k][1]))
    wordy = [not atom[k] and has_words(text[s.start:s.end]) for k, s in enumerate(spans)]
    # 2. nesting and order, top down. Each sibling with words gets one of the target (where it has enough), and
    # so does each stretch of source text with words beside an atom, between two (`x` or `y`: a word stays
    # between them) or at an end ("Press <kbd>S</kbd> to search": a word stays before it and after it).
    ranges: list[tuple[int, int]] = [(0, 0)] * len(spans)
    dropped: set[int] = set()  # Markdown line breaks with no two words around them: left out (a space stays)
    source_words, target_words = _alnum_prefix(text), _alnum_prefix(target)

    def words_between(a: int, b: int, counts: list[int]) -> bool:
        return a < b and counts[b] > counts[a]

    todo = [(-1, 0, len(target))]
    while todo:
        parent, low, high = todo.pop()
        kids = sorted(children[parent], key=lambda k: (spans[k].start, k))  # (their order in the source)
        inner = (spans[parent].start, spans[parent].end) if parent >= 0 else (0, len(text))
        gaps = [atom[k] and (n == 0 or atom[kids[n - 1]]) and words_between(spans[kids[n - 1]].end if n else inner[0], spans[k].start,
                                                                           source_words) for n, k in enumerate(kids)]
        tail = bool(kids) and atom[kids[-1]] and words_between(spans[kids[-1]].end, inner[1], source_words)
        first, last = geometry.words_in(low, high)
        if last - first < sum(wordy[k] for k in kids) + sum(gaps) + tail:  # too few words for every gap: as the alignment says
            gaps, tail = [False] * len(kids), False
        needing = sum(wordy[k] for k in kids) + sum(gaps) + tail
        cursor = line = low  # (line: where the current line of the parent starts, after its last hard break)
        content = False  # a sibling other than a line break was placed since the line started
        for n, k in enumerate(kids):
            needing -= wordy[k] + gaps[n]  # (what comes after this one needs words: they are kept free of it)
            first, last = geometry.words_in(cursor, high)
            if gaps[n] and first < last and not words_between(cursor, max(wish[k][0], cursor), target_words):
                cursor = geometry.word_ends[first]  # (a word of the text before it stays before it)
                first += 1
            spare = last - needing  # the first of the words kept for what follows
            limit = max(geometry.word_starts[spare], cursor) if needing and spare - wordy[k] >= first else high
            if limit < wish[k][0] < high and geometry.word_ends[spare] > wish[k][0]:  # (inside that word: a point in "ab<x>cd")
                limit = wish[k][0]
            if atom[k]:
                a = min(max(wish[k][0], cursor), limit)
                if spans[k].kind == HARD_BREAK:  # a Markdown line break stays inside its parent's content, or goes
                    later = any(spans[x].kind != HARD_BREAK for x in kids[n + 1:n + 2])
                    a = _inside(geometry, a, line, high, cursor, content, later)
                    if a is None:
                        dropped.add(k)
                        a = cursor
                    else:
                        line, content = a, False  # (the next break needs content after this one)
                b = a if spans[k].void or spans[k].kind == EMPHASIS else min(max(wish[k][1], a), limit)  # (** around a space is no emphasis)
                ranges[k] = (a, b)
                cursor = b
                content = content or spans[k].kind != HARD_BREAK
                todo.append((k, a, b))
                continue
            a = min(max(wish[k][0], cursor), limit)
            b = min(max(wish[k][1], a), limit)
            if not (words_between(a, b, target_words) if wordy[k] else target[a:b].strip()):  # give it a word: the first free one
                i, j = geometry.words_in(cursor, limit)
                if i < j:
                    w = min(bisect.bisect_left(geometry.word_starts, a), j - 1)
                    w = max(w, i)
                    a, b = geometry.word_starts[w], geometry.word_ends[w]
            if spans[k].kind == EMPHASIS:
                a, b = _flanking(target, a, b)
            ranges[k] = (a, b)
            cursor = b
            content = True
            todo.append((k, a, b))
    # 3. edges: spacing, soft breaks, emphasis written as CommonMark reads it. A span's markup is the
    # first after the source's whitespace before it (first) when no enclosing span opens and no earlier
    # sibling ends at the same place; the last before the whitespace after it (last) likewise.
    first, last = [True] * len(spans), [True] * len(spans)
    for parent, kids in enumerate(children):
        parent -= 0 if parent < len(spans) else len(spans) + 1  # (the top level's list is last)
        kids = sorted(kids, key=lambda k: (spans[k].start, k))
        for n, k in enumerate(kids):
            span = spans[k]
            if parent >= 0 and spans[parent].start == span.start or n and spans[kids[n - 1]].end == span.start:
                first[k] = False
            if parent >= 0 and spans[parent].end == span.end or n + 1 < len(kids) and spans[kids[n + 1]].start == span.end:
                last[k] = False
    out = []
    for k, span in enumerate(spans):
        a, b = ranges[k]
        if span.kind == SOFT_BREAK or k in dropped:
            out.append(replace(span, start=a, end=b, open="", replaces_space=False))
            continue
        changes = {}
        if not span.replaces_space and (atom[k] or a < b):  # (a span emptied by placement needs no room)
            # kept apart from a word unless the source had it against one ("super<b>man</b>" stays glued)
            changes["pad_before"] = first[k] and not (span.start > 0 and text[span.start - 1].isalnum())
            changes["pad_after"] = last[k] and not (span.end < len(text) and text[span.end].isalnum())
        if span.kind == PLACEHOLDER:
            changes["guard"] = True
        if span.kind == EMPHASIS:
            parent = out[span.parent] if span.parent >= 0 else None
            if not atom[k] and not target[a:b].strip():  # no word left for it (the translation has fewer): ** alone is text
                changes["open"] = changes["close"] = ""
            elif "_" in span.open and ((a > 0 and target[a - 1].isalnum()) or (b < len(target) and target[b].isalnum())):
                changes["open"], changes["close"] = span.open.replace("_", "*"), span.close.replace("_", "*")  # (inside a word)
            elif parent is not None and parent.kind == EMPHASIS and parent.open[:1] == span.open[:1] and span.open[:1] in ("*", "_") \
                    and not (a > 0 and target[a - 1].isalnum() and not changes.get("pad_before")) \
                    and not (b < len(target) and target[b].isalnum() and not changes.get("pad_after")):  # (_ is not read in a word)
                other = "_" if span.open[:1] == "*" else "*"  # *a *b* c*: which * closes which is a guess; *a _b_ c* is not
                changes["open"], changes["close"] = other * len(span.open), other * len(span.close)
        out.append(replace(span, start=a, end=b, **changes))
    for k, span in enumerate(out):  # a verbatim piece in an emphasis that starts or ends with its delimiter: **2024*... -> _..._
        parent = out[span.parent] if span.parent >= 0 else None
        if span.void and parent is not None and parent.kind == EMPHASIS and parent.open[:1] in ("*", "_") and span.open and \
                parent.open[0] in (span.open[0], span.open[-1]):
            other = "_" if parent.open[0] == "*" else "*"
            out[span.parent] = replace(parent, open=other * len(parent.open), close=other * len(parent.close))
    return out


def _alnum_prefix(text: str) -> list[int]:
    """counts[i]: how many letters and digits text[:i] has (has text[a:b] any: counts[b] > counts[a])."""
    return [0, *itertools.accumulate(map(str.isalnum, text))]


def _inside(geometry: _Target, a: int, low: int, high: int, cursor: int, before: bool, after: bool) -> Optional[int]:
    """Where a line break at a goes so that something of its parent's content (text, or a sibling:
    before, after say there are siblings on that side) comes before it and after it; None: nowhere."""
    if not before and geometry.space_end[low] >= a:  # nothing before it: after the first run of text
        first = geometry.space_end[max(low, cursor)]
        if first >= high:
            return None
        a = geometry.solid_end[first]
    if not after and geometry.space_end[a] >= high:  # nothing after it: before the last run of text
        last = geometry.space_start[high]  # (the end of the text before high's whitespace)
        start = geometry.solid_start[last]
        if last <= low or start < max(cursor, low) or (not before and geometry.space_end[low] >= start):
            return None
        a = geometry.space_start[start]
    return min(max(a, cursor, low), high)


def _flanking(target: str, a: int, b: int) -> tuple[int, int]:
    """[a, b) narrowed so that delimiters around it are left-flanking at a and right-flanking at b
    (CommonMark 6.2): no whitespace just inside; punctuation just inside only where whitespace or
    punctuation is just outside. Never narrowed to nothing when it has a word."""
    while a < b and target[a].isspace():
        a += 1
    while b > a and target[b - 1].isspace():
        b -= 1
    if a < b and _punctuation(target[a]) and a > 0 and not (target[a - 1].isspace() or _punctuation(target[a - 1])):
        s = a
        while s < b and not target[s].isalnum():
            s += 1
        a = s if s < b else a
    if a < b and _punctuation(target[b - 1]) and b < len(target) and not (target[b].isspace() or _punctuation(target[b])):
        e = b
        while e > a and not target[e - 1].isalnum():
            e -= 1
        b = e if e > a else b
    return a, b
