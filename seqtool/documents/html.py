"""HTML documents: units for the model, everything else byte for byte, with Python's html.parser.

`parse_html(doc, attributes=True)` -> an HtmlDocument (a Skeleton; `render(translated, lang)`).

Units: the text between block elements (p, div, li, h1-h6, td, th, title, ...: BLOCK) as the
model reads it (character references decoded), with the inline elements inside it (b, i, a, span,
...: any element not in BLOCK or VERBATIM) as spans whose markup is the original tag text; void
elements, comments and stray end tags are void spans, and a `<br>` between two words stands on a
space in the text (Span.replaces_space). With `attributes`, the values of the attributes people
read (title, alt, placeholder, aria-label, aria-description, a button's value, a page's
description) are units of their own, wherever their tag is. `<html lang>` is written as the target
language.

Kept verbatim, never a unit: elements in VERBATIM (script, style, pre, code, kbd, samp, var,
textarea, ...) and any element with translate="no" or class "notranslate", with all their content
and attributes (inside a unit they are one void span); doctype, comments and processing
instructions between blocks; every other attribute.

Bad input: an unclosed inline element ends with its unit (its start tag becomes a void span);
an end tag that closes elements opened inside it ends those too (they become void); an end tag
with nothing to close is a void span; what html.parser cannot read as markup (a stray `<`, a
broken declaration) is text; an unclosed verbatim element runs to the end of the document. Reading
is linear in the document's size.

A unit that comes back as it was is written byte for byte (Skeleton); a translated one is written
with html_escape (& < > and U+00A0 as references, every other character as itself).
"""

from __future__ import annotations

import bisect
import html
import re
from dataclasses import replace
from html.parser import HTMLParser
from typing import Optional

from ..interrupts import check_deadline
from .protect import UnitBuilder
from .skeleton import Hole, Skeleton, SkeletonBuilder

# elements that end a unit (their tags stay in the skeleton)
BLOCK = frozenset("""address article aside blockquote body caption center col colgroup dd details dialog dir div dl dt
    fieldset figcaption figure footer form frame frameset h1 h2 h3 h4 h5 h6 head header hgroup hr html legend li
    link main menu meta nav ol optgroup option p section summary table tbody td tfoot th thead title tr ul""".split())
# elements kept verbatim with their content: never translated
VERBATIM = frozenset("script style pre textarea code kbd samp var svg math template iframe object noscript canvas video audio".split())
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
        check_deadline()  # (a server request's work stops at its --request-timeout)
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


# the attributes whose values people read: translated with their element (a tag's other attributes are kept)
READABLE = frozenset("title alt placeholder aria-label aria-description aria-roledescription aria-valuetext label".split())
_BUTTONS = frozenset("button submit reset".split())  # <input type=...>: its value is the label on it
_META = frozenset("description og:title og:description og:site_name twitter:title twitter:description".split())
# an attribute in a start tag, as html.parser finds it (its attrfind_tolerant): name, then = and a value
_ATTRIBUTE = re.compile(r"""((?<=['"\s/])[^\s/>][^\s/=>]*)(\s*=+\s*('[^']*'|"[^"]*"|(?!['"])[^>\s]*))?(?:\s|/(?!>))*""")
_TAG_NAME = re.compile(r"<[a-zA-Z][^\t\n\r\f />\x00]*")


def _attribute_values(raw: str):
    """(name lowercased, value start, value end, quote) of each attribute with a value in a start tag's text."""
    name = _TAG_NAME.match(raw)
    at = name.end() if name else 1
    while True:
        match = _ATTRIBUTE.search(raw, at)
        if not match or not raw[at:match.start()].strip(" \t\n\r\f/") == "":
            return
        at = match.end()
        if match.group(3) is None:
            continue
        start, end = match.span(3)
        quote = raw[start] if raw[start] in "'\"" else ""
        yield match.group(1).lower(), start + len(quote), end - len(quote), quote
        if at >= len(raw) or match.end() == match.start():
            return


def _readable(tag: str, attrs: list, name: str) -> bool:
    if name in READABLE:
        return True
    values = {k: (v or "").strip().lower() for k, v in attrs}
    if name == "value":
        return tag == "input" and values.get("type", "") in _BUTTONS
    if name == "content":
        return tag == "meta" and (values.get("name", "") in _META or values.get("property", "") in _META)
    return False


def _attribute_escape(quote: str):
    """How a translated value is written back: & and its quote as references (unquoted: now quoted)."""
    if quote == "'":
        return lambda s: s.replace("&", "&amp;").replace("'", "&#39;")
    if quote == '"':
        return lambda s: s.replace("&", "&amp;").replace('"', "&quot;")
    return lambda s: '"' + s.replace("&", "&amp;").replace('"', "&quot;") + '"'


def _attribute_unit(value: str) -> "UnitBuilder":
    builder = UnitBuilder()
    for piece in _REFERENCE.split(value):
        builder.text(html.unescape(piece) if piece.startswith("&") else piece, piece)
    return builder


class HtmlDocument(Skeleton):
    """An HTML document (or fragment) as units; see parse_html."""


def parse_html(doc: str, attributes: bool = True) -> HtmlDocument:
    """An HTML document -> its units and skeleton (see the module's docstring); never raises.
    attributes: translate the values of the attributes people read (title, alt, ...)."""
    events = _html_events(doc)
    out = SkeletonBuilder()
    builder: Optional[UnitBuilder] = None
    holes: list[Hole] = []
    unit_start = 0
    verbatim: Optional[list] = None  # [tag, depth, start offset, is a block]

    def flush(upto: int) -> None:
        nonlocal builder, holes
        check_deadline()
        if builder is not None:
            unit = builder.finish()
            if builder.renumbered is not None:  # (a span merged into a letterless one keeps its attributes as they are)
                holes = [replace(h, span=builder.renumbered[h.span]) for h in holes if h.span in builder.renumbered]
            out.unit(unit, doc[unit_start:upto], html_escape, holes)
            builder, holes = None, []

    def inline(at: int) -> UnitBuilder:
        nonlocal builder, unit_start
        if builder is None:
            builder, unit_start = UnitBuilder(), at
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

    def readable(tag: str, attrs: list, raw: str) -> list[tuple[int, int, str]]:
        """The translatable attribute values of a start tag: (start, end, quote) in raw, and `lang` of <html>."""
        found = []
        for name, start, end, quote in _attribute_values(raw):
            if (attributes and _readable(tag, attrs, name)) or (tag == "html" and name in ("lang", "xml:lang")):
                found.append((start, end, quote if name not in ("lang", "xml:lang") else "lang"))
        return found

    def block_tag(tag: str, attrs: list, raw: str) -> None:
        """A tag between units: verbatim, its readable attribute values units of their own."""
        at = 0
        for start, end, quote in readable(tag, attrs, raw) if attrs else []:
            out.verbatim(raw[at:start])
            if quote == "lang":
                out.lang(raw[start:end])
            else:
                out.unit(_attribute_unit(raw[start:end]).finish(), raw[start:end], _attribute_escape(quote))
            at = end
        out.verbatim(raw[at:])

    def span_holes(tag: str, attrs: list, raw: str, index: int) -> None:
        """A tag inside a unit (span `index`'s markup): its readable attribute values as holes."""
        for start, end, quote in readable(tag, attrs, raw) if attrs else []:
            if quote == "lang":
                continue
            k = out.hidden(_attribute_unit(raw[start:end]).finish(), raw[start:end], _attribute_escape(quote))
            if k is not None:
                holes.append(Hole(index, start, end, k))

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
            block_tag(tag, attrs, raw) if kind in ("start", "void") else out.verbatim(raw)
            continue
        builder_now = inline(start)
        if kind == "text":
            for piece in _REFERENCE.split(raw):  # a reference decoded, the text between as it is
                builder_now.text(html.unescape(piece) if piece.startswith("&") else piece, piece)
        elif kind == "start" and tag not in VOID_ELEMENTS:
            span_holes(tag, attrs, raw, builder_now.open(raw, tag))
        elif kind in ("start", "void"):
            span_holes(tag, attrs, raw, builder_now.void(raw, line_break=tag == "br"))
        elif kind == "end":
            if not builder_now.close(raw, tag):
                builder_now.void(raw)
        else:
            builder_now.void(raw)
    if verbatim is not None:
        close_verbatim(len(doc))
    flush(len(doc))
    return out.finish(HtmlDocument)  # type: ignore[return-value]
