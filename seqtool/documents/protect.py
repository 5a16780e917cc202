"""What the model never sees: URLs and e-mail addresses (placeholders), and text with no letters.

- `placeholders(text)`: where the URLs and e-mail addresses are; linear in the text.
- `letterless(text)`: text with no letter (numbers, dates, versions, punctuation, `[22]`): it is
  written back as it is, never given to the model (a model asked to translate "2024" invents a
  sentence).
- `UnitBuilder`: a unit built from a stream of text and markup events (the HTML, Markdown and plain
  text readers share it), its placeholders cut out of the text as void spans.
- `protect(text)`: plain text -> a Unit without its URLs and e-mail addresses.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import replace
from typing import Callable, Optional

from .spans import EMPHASIS, GLUES, MARKUP, PLACEHOLDER, Span, Unit

# A URL: a scheme (or www.) and everything up to whitespace, quotes or angle brackets; trailing
# punctuation that ends the sentence, and closing brackets without an opening one, are not part of
# it. An e-mail address: a local part (or a quoted one) and a domain (localhost and intranet names
# included). Nothing is found inside a run of the characters these are made of (the lookbehind),
# so every run is scanned once: linear time.
_LOCAL = r"[\w.!#$%&'*+/=?^`{|}~-]"
_PLACEHOLDER = re.compile(
    rf"(?<![\w{re.escape(GLUES)}])(?:"
    r"(?:https?|ftp|sftp|file)://[^\s<>\"]+|www\.[^\s<>\"]+|mailto:[^\s<>\"]+"
    rf"|{_LOCAL}+@[\w-]+(?:\.[\w-]+)*|\"[^\"\n@]{{1,64}}\"@[\w-]+(?:\.[\w-]+)*)",
    re.IGNORECASE,
)
_TRAILING = ".,;:!?'\"»”’…\\"  # (a backslash too: in Markdown it would escape what follows the URL)
_PAIRS = {")": "(", "]": "[", "}": "{"}
_SCHEME = re.compile(r"(?:https?|ftp|sftp|file)://|mailto:|www\.")
_TOP_LEVEL = re.compile(r"\.[^\W\d_]{2,}$")  # a domain that ends in a name of letters (example.com, not x.1)
_DOMAIN_WORD = re.compile(r"[^\W\d_][\w-]+$")  # a name with no dot (localhost, dominio): an intranet address


def placeholders(text: str) -> list[tuple[int, int]]:
    """The [start, end) ranges of the URLs (with a scheme: http, https, ftp, sftp, file, mailto; or
    starting www.) and e-mail addresses (user@example.com, jose@localhost, "a b"@example.com) in
    `text`, in order. A bare domain (example.com) is a word."""
    found = []
    for match in _PLACEHOLDER.finditer(text):
        start, end = match.span()
        unmatched = {close: text.count(close, start, end) - text.count(open_, start, end) for close, open_ in _PAIRS.items()}
        while end > start:
            last = text[end - 1]
            if last in _TRAILING or unmatched.get(last, 0) > 0:
                unmatched[last] = unmatched.get(last, 0) - 1
                end -= 1
            else:
                break
        candidate = text[start:end].lower()
        scheme = _SCHEME.match(candidate)
        if scheme:
            rest = candidate[scheme.end():]
            if not re.search(r"\w", rest) or (scheme.group() == "www." and not re.match(r"[^.]+\.\w", rest)):
                continue
        else:
            local, at, domain = candidate.rpartition("@")
            if not at or not local.strip('"') or not (_TOP_LEVEL.search(domain) or _DOMAIN_WORD.match(domain)) \
                    or local.startswith(".") or local.endswith("."):
                continue
        found.append((start, end))
    return found


def letterless(text: str) -> bool:
    """Whether text has no letter of any script (digits, punctuation, symbols and spaces only)."""
    return not any(c.isalpha() for c in text)


class UnitBuilder:
    """Accumulates one unit from a stream of text and markup events. Text comes as (decoded, raw)
    pairs: the model reads the decoded form; a placeholder found in it is written back in its raw
    form. Spans still open at the end, and the ones an end tag skips over, become void spans (their
    markup written where they opened). Every event costs time linear in its own size (an end tag
    with nothing to close: O(1)), so a document of any shape is read in linear time."""

    def __init__(self) -> None:
        self.chars: list[str] = []
        self.length = 0
        self.spans: list[list] = []  # [start, end, open, close, parent, replaces_space, kind]
        self.stack: list[tuple[int, object, int]] = []  # (span index, key, len(chars) at its start) of the open spans
        self.open_keys: dict[object, int] = {}  # how many spans of each key are open
        self.run: list[tuple[str, str]] = []  # text not yet searched for placeholders
        self.pending_break: Optional[int] = None  # a line-break void that may need a stand-in space
        self.voided: set[int] = set()  # spans opened but never closed: voids, their children re-parented at the end
        self.renumbered: Optional[dict[int, int]] = None  # after finish: the spans' new indices, where some were merged
        self.raws: list[str] = []  # what was read, as written (raw())
        self.raw_spans: dict[int, list[int]] = {}  # a span's [first, end) in raws (its markup and all inside it)

    def text(self, decoded: str, raw: Optional[str] = None) -> None:
        if decoded:
            self.run.append((decoded, decoded if raw is None else raw))
            self.raws.append(decoded if raw is None else raw)

    def raw(self) -> str:
        """Everything read so far as it was written: text in its raw form and markup, in order."""
        return "".join(self.raws)

    def open(self, markup: str, key: object, kind: str = MARKUP) -> int:
        """A span opening here (its index)."""
        self._flush_run()
        self.raw_spans[len(self.spans)] = [len(self.raws), 0]
        self.raws.append(markup)
        index = self._add(markup, kind)
        self.stack.append((index, key, len(self.chars)))
        self.open_keys[key] = self.open_keys.get(key, 0) + 1
        return index

    def is_open(self, key: object) -> bool:
        return self.open_keys.get(key, 0) > 0

    def close(self, markup: str, key: object) -> bool:
        """Close the innermost open span with this key (those inside it become voids); False if none is open."""
        if not self.is_open(key):
            return False
        self._flush_run()
        self.raws.append(markup)
        while self.stack[-1][1] != key:
            self._to_void(self._pop()[0])
        index = self._pop()[0]
        self.spans[index][1], self.spans[index][3] = self.length, markup
        self.raw_spans[index][1] = len(self.raws)
        return True

    def atom(self, markup_end: str, key: object) -> bool:
        """Close the innermost open span with this key as one void: its opening markup, everything
        read since (text and markup, as written) and markup_end, verbatim (a Markdown reference
        link whose label must match its definition). False if none is open."""
        if not self.is_open(key):
            return False
        self._flush_run()
        self.raws.append(markup_end)
        while self.stack[-1][1] != key:
            self._to_void(self._pop()[0])
        index, _, at = self._pop()
        text_at = self.spans[index][0]
        self.voided = {v for v in self.voided if v < index}
        raw = "".join(self.raws[self.raw_spans[index][0]:])  # (its opening markup to markup_end, as written)
        self.raw_spans = {k: v for k, v in self.raw_spans.items() if k <= index}
        del self.spans[index + 1:]
        del self.chars[at:]
        self.length = text_at
        self.pending_break = None
        self.spans[index][1:4] = [text_at, raw, ""]
        self.raw_spans[index][1] = 0  # (a void now: never merged again)
        return True

    def void(self, markup: str, line_break: bool = False, stand_in: bool = False, kind: str = MARKUP) -> int:
        """A void span (its index). line_break: it separates words; when no whitespace is next to it, a
        stand-in space goes into the text (stand_in: always; the markup then holds the whitespace itself)."""
        self._flush_run()
        self.raws.append(markup)
        index = self._add(markup, kind)
        if stand_in:
            self._stand_in(index)
        elif line_break and self.length and not self.chars[-1][-1:].isspace():
            self.pending_break = index
        return index

    def finish(self) -> Unit:
        """The unit; an inline element whose text has no letter (`<sup>[22]</sup>`, `**2024**`) becomes one void,
        written as it was (it is no longer the model's to read)."""
        self._flush_run()
        while self.stack:
            self._to_void(self._pop()[0])
        parents = self._parents()
        spans = [Span(s, e, o, c, parents[k], r, MARKUP if kind == EMPHASIS and not c else kind)
                 for k, (s, e, o, c, _, r, kind) in enumerate(self.spans)]
        def raw(k: int) -> Optional[str]:
            first, end = self.raw_spans.get(k, (0, 0))
            return "".join(self.raws[first:end]) if end else None

        unit, self.renumbered = collapse_letterless(Unit("".join(self.chars), spans), raw)
        return unit

    def _parents(self) -> list[int]:
        """Each span's parent, where a span inside one that became void is inside that one's parent."""
        parents: list[int] = []
        for span in self.spans:
            parent = span[4]
            parents.append(parents[parent] if parent in self.voided else parent)
        return parents

    def _pop(self) -> tuple[int, object, int]:
        entry = self.stack.pop()
        self.open_keys[entry[1]] -= 1
        return entry

    def _add(self, markup: str, kind: str) -> int:
        """A span opening here, inside the innermost open one (a void until it is closed)."""
        self.spans.append([self.length, self.length, markup, "", self.stack[-1][0] if self.stack else -1, False, kind])
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
            self._add(raw[raw_at(start, -1):raw_at(end, 1)], PLACEHOLDER)
            cursor = end
        if cursor < len(decoded):
            self._append(decoded[cursor:])


def collapse_letterless(unit: Unit, raw: Callable[[int], Optional[str]]) -> tuple[Unit, Optional[dict[int, int]]]:
    """unit with each outermost non-void span whose text has something but no letter (a footnote
    marker, a number) made one void: raw(k), the span as written with everything inside it (None:
    not known, the span stays). Such text is never the model's to translate; placed as one piece,
    it comes back as it was. Also returns each kept span's new index (None: nothing changed)."""
    text, spans = unit.text, unit.spans
    gone: set[int] = set()
    roots: list[int] = []
    markup: dict[int, str] = {}
    for k, span in enumerate(spans):  # (parents come before their children)
        if span.parent in gone:
            gone.add(k)
        elif span.close and text[span.start:span.end].strip() and letterless(text[span.start:span.end]):
            written = raw(k)
            if written is not None:
                markup[k] = written
                roots.append(k)
                gone.add(k)
    if not roots:
        return unit, None
    holds_url, top = set(), {}
    for j, span in enumerate(spans):  # (descendants follow their ancestors: each root's subtree in one pass)
        top[j] = j if j in markup else top.get(span.parent)
        if span.kind == PLACEHOLDER and top[j] is not None:
            holds_url.add(top[j])
    keep = [k for k in range(len(spans)) if k not in gone or k in roots]
    index = {k: n for n, k in enumerate(keep)}
    cuts = [(spans[k].start, spans[k].end) for k in roots]  # (in order, none inside another)
    ends, removed = [e for _, e in cuts], [0]
    for a, b in cuts:
        removed.append(removed[-1] + b - a)

    def moved(p: int) -> int:
        n = bisect.bisect_left(ends, p)  # cuts [0, n) end before p
        if n < len(cuts) and cuts[n][0] < p:  # inside cut n: to its start
            return cuts[n][0] - removed[n]
        return p - removed[n]

    out = []
    for k in keep:
        span = spans[k]
        parent = index.get(span.parent, -1)
        if k in markup:  # (one that holds a URL is kept apart from the words around it as the URL would be)
            at = moved(span.start)
            out.append(Span(at, at, markup[k], "", parent, False, PLACEHOLDER if k in holds_url else MARKUP))
        else:
            out.append(replace(span, start=moved(span.start), end=moved(span.end), parent=parent))
    cut_text, at = [], 0
    for a, b in cuts:
        cut_text.append(text[at:a])
        at = b
    cut_text.append(text[at:])
    return Unit("".join(cut_text), out), index


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


def protect(text: str) -> Unit:
    """Plain text -> a Unit without its URLs and e-mail addresses: each is a void span (its text the
    span's `open`), so the model never sees it and render_unit puts it back."""
    builder = UnitBuilder()
    builder.text(text)
    return builder.finish()
