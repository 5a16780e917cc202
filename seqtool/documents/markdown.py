"""Markdown documents (CommonMark with GitHub tables and strikethrough), read with markdown-it-py.

`parse_markdown(doc, attributes=True)` -> a MarkdownDocument (a Skeleton).

Units are the inline content of paragraphs, headings and table cells (so of list items and block
quotes too). Inside a unit: emphasis, strong and strikethrough are spans of kind EMPHASIS (placed
where CommonMark still reads them: placement.py), links are spans (`open` "[", `close`
"](target)" or "][label]"), raw inline HTML tags are spans (paired by name) or voids, and inline
code, images, autolinks, hard line breaks and the reference links whose label must match a
definition (`[label]`, `[label][]`) are void spans. A soft line break (with the next line's
container prefix, `> ` or a list indent) stands on a space and is left out of a translation: a
translated paragraph is one line, so no word of it can land at a line start and begin a block.
HTML blocks at the top level are read as HTML (seqtool.documents.html). Code blocks, link
reference definitions, front matter (--- or +++), nested HTML blocks and every marker stay
verbatim.

The document is never re-rendered: only the character ranges of translated text are replaced, so
everything else comes back byte for byte, and the identity translation gives the document back
exactly. A unit's text is what a reader reads (backslash escapes and entity references decoded,
a cell's `\\|` as `|`). A translated unit is written on one line, with the characters that would
be markup escaped (a backslash, `*`, `_`, `~`, a backtick, brackets, `<`; at its start a `#`, `>`
or list marker; in a table cell `|`) and an `&` that would start an entity as `&amp;`. A block whose inline text cannot be located in its lines
(markdown-it nesting past its limit, say) stays verbatim, and `notes` says which line it is on.
"""

from __future__ import annotations

import bisect
import functools
import re

from ..errors import ConfigError
from ..interrupts import check_deadline
from .html import VOID_ELEMENTS, parse_html
from .protect import UnitBuilder
from .skeleton import Skeleton, SkeletonBuilder
from .spans import EMPHASIS, HARD_BREAK, PLACEHOLDER, SOFT_BREAK, Unit, render_unit

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


class MarkdownText:
    """How a translated unit's text is written: on one line, the characters that would be markup
    escaped (see the module's docstring), an & that would start an entity as &amp;; `lead` escapes
    what would open a block at the unit's start."""

    _INLINE = re.compile(r"([\\`*_\[\]<~])")
    _CELL = re.compile(r"([\\`*_\[\]<~|])")
    _ENTITY = re.compile(r"&(?=#?[0-9A-Za-z]+;)")
    _LEAD = re.compile(r"\A([#>]|[-+](?=[ \t]|\Z)|\d{1,9}(?=[.)](?:[ \t]|\Z)))")

    def __init__(self, cell: bool = False):
        self.cell = cell

    def __call__(self, text: str) -> str:
        text = self._ENTITY.sub("&amp;", one_line(text))
        return (self._CELL if self.cell else self._INLINE).sub(r"\\\1", text)

    def lead(self, text: str) -> str:
        text = text.lstrip()  # (a unit's first line starts where its block's content does: spaces there would move it)
        match = self._LEAD.match(text)
        if not match:
            return text
        if match.group(1)[0].isdigit():
            end = match.end()
            return text[:end] + "\\" + text[end:]
        return "\\" + text


def one_line(text: str) -> str:
    """A target written on one line: its line breaks as spaces (a unit that is one line stays one)."""
    return text.replace("\r", " ").replace("\n", " ")


def parse_markdown(doc: str, attributes: bool = True) -> MarkdownDocument:
    """A Markdown document -> units and skeleton (see the module's docstring). attributes: as
    parse_html's, for its HTML blocks."""
    md = _markdown_parser()
    source = doc.replace("\r\n", "\n").replace("\r", "\n").replace("\0", "\ufffd")  # what markdown-it reads
    crlf = [m.start() - k for k, m in enumerate(re.finditer("\r\n", doc))]  # source offsets where doc has one more character

    def original(a: int, b: int) -> str:
        return doc[a + bisect.bisect_right(crlf, a - 1):b + bisect.bisect_right(crlf, b - 1)]

    front = _FRONT_MATTER.match(source)
    base = front.end() if front else 0
    lines = [0] + [m.end() for m in re.finditer("\n", source)]  # where each line of source starts
    first_line = bisect.bisect_right(lines, base) - 1
    tokens = md.parse(source[base:])
    out = SkeletonBuilder()
    limit = md.options["maxNesting"]
    deep = [t for t in tokens if t.nesting == 1 and t.level >= limit - 1 and t.map]
    if deep:  # markdown-it reads nothing inside a container past its nesting limit: that text stays as it is
        out.notes.append(f"line {first_line + deep[0].map[0] + 1}: nested deeper than {limit} levels (markdown-it's limit); "
                         "the text inside is kept untranslated")
    cursor = 0
    for k, token in enumerate(tokens):
        check_deadline()  # (a server request's work stops at its --request-timeout)
        if token.type == "html_block" and token.level == 0 and token.map:
            begin = max(lines[first_line + token.map[0]], cursor)
            end = lines[first_line + token.map[1]] if first_line + token.map[1] < len(lines) else len(source)
            out.verbatim(original(cursor, begin))
            out.embed(parse_html(original(begin, end), attributes))
            cursor = end
            continue
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
            unit, end, raw = _markdown_unit(token.children, source, begin, original, [s + base for s in token.meta["starts"]])
            if raw != original(begin, end):
                raise _NotFound
        except _NotFound:
            line = bisect.bisect_right(lines, begin)
            out.notes.append(f"line {line}: a block whose text could not be located (markdown-it read it otherwise) is kept untranslated")
            continue
        out.verbatim(original(cursor, begin))
        out.unit(unit, original(begin, end), MarkdownText(cell=table))
        cursor = end
    out.verbatim(original(cursor, len(source)))
    return out.finish(MarkdownDocument)  # type: ignore[return-value]


def _markdown_unit(children, source: str, at: int, original, starts: list[int]) -> tuple[Unit, int, str]:
    """One inline token's children located in `source` from offset `at` -> (unit, end offset, the
    source it was read from, put together again: the check that every token was located)."""
    builder = UnitBuilder()
    skip_until_close = False
    for token in children:
        kind = token.type
        if skip_until_close:  # inside an autolink, already written as one void
            skip_until_close = kind != "link_close"
            continue
        if kind == "text":  # (the model reads text as it reads: a cell's \| as |, an escape or entity decoded)
            if not token.content:
                continue
            end = _match_text(source, at, token.content)
            builder.text(token.content, original(at, end))
        elif kind == "text_special":
            end = _expect(source, at, token.markup)
            builder.text(token.content, original(at, end))
        elif kind in ("softbreak", "hardbreak"):
            newline = source.find("\n", at)
            if newline < 0 or source[at:newline].strip(" \t\\"):
                raise _NotFound
            after = bisect.bisect_left(starts, newline + 1)
            end = starts[after] if after < len(starts) else newline + 1
            builder.void(original(at, end), stand_in=True, kind=SOFT_BREAK if kind == "softbreak" else HARD_BREAK)
        elif kind in ("em_open", "strong_open", "s_open"):
            end = _expect(source, at, token.markup)
            builder.open(original(at, end), kind[:-5], EMPHASIS)
        elif kind in ("em_close", "strong_close", "s_close"):
            end = _expect(source, at, token.markup)
            builder.close(original(at, end), kind[:-6])
        elif kind == "link_open" and token.markup == "autolink":
            close = source.find(">", at)
            if not source.startswith("<", at) or close < 0:
                raise _NotFound
            end = close + 1
            builder.void(original(at, end), kind=PLACEHOLDER)  # (a URL: kept apart from the words around it)
            skip_until_close = True
        elif kind == "link_open":
            end = _expect(source, at, "[")
            builder.open(original(at, end), "link")
        elif kind == "link_close":
            label_end = _expect(source, at, "]")
            end = _link_tail(source, label_end)
            tail = source[label_end:end]
            if tail.startswith("(") or (tail.startswith("[") and tail != "[]"):
                builder.close(original(at, end), "link")
            else:  # [label] or [label][]: the label names a definition and stays as it is
                builder.atom(original(at, end), "link")
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
    return builder.finish(), at, builder.raw()


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
