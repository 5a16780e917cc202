"""What a translated document must keep of its source, checked without the model's help (the tests and
bench/documents.py share these): HTML's tag and attribute stream (the translated attributes and
`lang` aside), the text of verbatim elements, Markdown's structure as markdown-it reads it, every
URL and e-mail address verbatim and not glued to a word, text with no letter unchanged, and text
with letters still having letters.
Number-only text: a digit and no letter (2024, 3.14, [22], 1.).

Each check returns a list of problems (empty: it holds), so a report can say what broke where.
"""

from __future__ import annotations

import re
from collections import Counter
from html.parser import HTMLParser

from seqtool.documents import placeholders

READABLE = frozenset("title alt placeholder aria-label aria-description aria-roledescription aria-valuetext label lang xml:lang".split())
VERBATIM = frozenset("script style pre code kbd samp var textarea".split())


class _Html(HTMLParser):
    """The tag stream (with the readable attributes' values and lang blanked: they are translated),
    the text nodes with the number of tags before each, and the verbatim elements' raw contents."""

    def __init__(self, doc: str):
        super().__init__(convert_charrefs=True)
        self.doc = doc
        self.stream: list[tuple] = []
        self.texts: list[tuple[int, str]] = []
        self.verbatim: list[str] = []
        self._open: list[tuple[str, int]] = []  # verbatim elements open: (tag, offset where their content starts)
        self._lines = [0] + [m.end() for m in re.finditer("\n", doc)]
        self.feed(doc)
        self.close()

    def _offset(self) -> int:
        line, column = self.getpos()
        return self._lines[line - 1] + column

    def _attrs(self, tag: str, attrs) -> tuple:
        values = {k: (v or "").lower() for k, v in attrs}
        def readable(name: str) -> bool:
            return name in READABLE or (name == "value" and tag == "input" and values.get("type") in ("button", "submit", "reset")) \
                or (name == "content" and tag == "meta")
        return tuple((k, "*" if readable(k) else v) for k, v in attrs)

    def handle_starttag(self, tag, attrs):
        self.stream.append(("start", tag, self._attrs(tag, attrs)))
        if tag in VERBATIM:
            self._open.append((tag, self._offset() + len(self.get_starttag_text() or "")))

    def handle_startendtag(self, tag, attrs):
        self.stream.append(("void", tag, self._attrs(tag, attrs)))

    def handle_endtag(self, tag):
        self.stream.append(("end", tag, ()))
        if self._open and self._open[-1][0] == tag:
            _, start = self._open.pop()
            if not self._open:
                self.verbatim.append(self.doc[start:self._offset()])

    def handle_data(self, data):
        if not any(t in ("script", "style") for t, _ in self._open):
            self.texts.append((len(self.stream), data))


def html_problems(source: str, output: str) -> list[str]:
    """Every way output fails to keep what an HTML translation must keep of source."""
    a, b = _Html(source), _Html(output)
    problems = []
    if a.stream != b.stream:
        first = next((k for k, (x, y) in enumerate(zip(a.stream, b.stream)) if x != y), min(len(a.stream), len(b.stream)))
        problems.append(f"tag stream differs at tag {first}: {a.stream[first:first + 1]} -> {b.stream[first:first + 1]} "
                        f"({len(a.stream)} tags -> {len(b.stream)})")
    if a.verbatim != b.verbatim:
        problems.append(f"verbatim elements differ: {len(a.verbatim)} -> {len(b.verbatim)}")
    problems += _placeholder_problems([t for _, t in a.texts], [t for _, t in b.texts])
    if not problems:  # (text nodes correspond where the tag streams are the same)
        got, want = _by_position(b.texts), _by_position(a.texts)
        for position, text in want.items():  # an element holding only a number
            wrapped = 0 < position < len(a.stream) and a.stream[position - 1][:2] == ("start", a.stream[position][1]) \
                and a.stream[position][0] == "end"
            if wrapped and _number_only(text) and got.get(position, "").strip() != text.strip():
                problems.append(f"text with no letter changed: {text.strip()!r} -> {got.get(position, '').strip()!r}")
        source_blocks, output_blocks = _blocks(a), _blocks(b)
        for k, text in enumerate(source_blocks):  # a block holding only a number (a table cell, a list item)
            if _number_only(text) and output_blocks[k].strip() != text.strip():
                problems.append(f"text with no letter changed: {text.strip()!r} -> {output_blocks[k].strip()!r}")
    return problems


BLOCKS = frozenset("p div li td th h1 h2 h3 h4 h5 h6 title tr table ul ol dt dd blockquote section article header footer nav main body".split())


def _blocks(parsed: "_Html") -> list[str]:
    """The text of each stretch between block-level tags."""
    out = [""] * (sum(1 for t in parsed.stream if t[1] in BLOCKS) + 1)
    ends = [k for k, t in enumerate(parsed.stream) if t[1] in BLOCKS]
    import bisect
    for position, text in parsed.texts:
        out[bisect.bisect_right(ends, position - 1)] += text
    return out


def _by_position(texts: list[tuple[int, str]]) -> dict[int, str]:
    out: dict[int, str] = {}
    for position, text in texts:
        out[position] = out.get(position, "") + text
    return out


def letters_kept(source: str, output: str, format: str) -> tuple[int, int]:
    """(text nodes or blocks with letters in source, those whose counterpart in output has letters)."""
    if format == "html":
        a, b = _by_position(_Html(source).texts), _by_position(_Html(output).texts)
    else:
        a, b = dict(enumerate(_markdown_blocks(source))), dict(enumerate(_markdown_blocks(output)))
    with_letters = [p for p, t in a.items() if _has_letters(t)]
    return len(with_letters), sum(_has_letters(b.get(p, "")) for p in with_letters)


def _number_only(text: str) -> bool:
    """Text with a digit and no letter: a number, a date, a version, a footnote marker ([22])."""
    return any(c.isdigit() for c in text) and not _has_letters(text)


def _has_letters(text: str) -> bool:
    return any(c.isalpha() for c in text)


def _placeholder_problems(source_texts: list[str], output_texts: list[str]) -> list[str]:
    """Each URL or e-mail address of the source's text is found, as itself, in the output's text."""
    def found(texts):
        return Counter(t[a:b] for t in texts for a, b in placeholders(t))
    missing = found(source_texts) - found(output_texts)
    return [f"URL or e-mail address not kept verbatim and apart: {x!r}" for x in sorted(missing)]


# ---------------------------------------------------------------------------------------------
# Markdown


def _markdown():
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable(["table", "strikethrough"])


def markdown_structure(doc: str) -> dict:
    """What markdown-it reads of a document besides its text: the blocks, the counts of inline
    elements, code, link targets and image sources."""
    tokens = _markdown().parse(doc)
    blocks = [(t.type, t.tag, t.nesting) for t in tokens if t.type != "inline"]
    inline = [c for t in tokens if t.type == "inline" for c in (t.children or [])]
    counts = Counter(c.type for c in inline if c.type in ("strong_open", "em_open", "s_open", "code_inline", "link_open", "image",
                                                            "html_inline"))
    code = [c.content for c in inline if c.type == "code_inline"] + [t.content for t in tokens if t.type in ("fence", "code_block")]
    links = [c.attrGet("href") for c in inline if c.type == "link_open"]
    images = [c.attrGet("src") for c in inline if c.type == "image"]
    return {"blocks": blocks, "counts": dict(counts), "code": code, "links": links, "images": images}


def _markdown_blocks(doc: str) -> list[str]:
    """Each inline block's text as a reader sees it (text tokens joined, line breaks as spaces, an
    autolink's <> as spaces: nothing glues to it)."""
    def piece(c) -> str:
        if c.type == "text":
            return c.content
        return " " if c.type in ("softbreak", "hardbreak") or c.markup == "autolink" else ""
    return ["".join(piece(c) for c in t.children or []) for t in _markdown().parse(doc) if t.type == "inline"]


def markdown_problems(source: str, output: str) -> list[str]:
    """Every way output fails to keep what a Markdown translation must keep of source."""
    a, b = markdown_structure(source), markdown_structure(output)
    problems = [f"{key} differ: {_diff(a[key], b[key])}" for key in a if a[key] != b[key]]
    problems += _placeholder_problems(_markdown_blocks(source), _markdown_blocks(output))
    if not problems:
        for x, y in zip(_markdown_blocks(source), _markdown_blocks(output)):
            if _number_only(x) and x.strip() != y.strip():
                problems.append(f"text with no letter changed: {x.strip()!r} -> {y.strip()!r}")
    return problems


def _diff(a, b) -> str:
    if isinstance(a, dict):
        return ", ".join(f"{k} {a.get(k, 0)} -> {b.get(k, 0)}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
    first = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"at {first}: {a[first:first + 1]} -> {b[first:first + 1]} ({len(a)} -> {len(b)})"


def problems(source: str, output: str, format: str) -> list[str]:
    return html_problems(source, output) if format == "html" else markdown_problems(source, output)


# ---------------------------------------------------------------------------------------------
# a stand-in for a model, for tests that need no model


def scrambled(doc) -> list:
    """Each unit of a parsed document 'translated' as a model might: its words changed (reversed),
    some dropped, some added, neighbours swapped, the alignment saying so; its spans placed on that
    with place_spans. Deterministic (a hash of each word decides)."""
    import zlib

    from seqtool.documents import place_spans

    out = []
    for unit in doc.units:
        if not _has_letters(unit.text):  # (the pipeline's pass-through)
            out.append((unit.text, list(unit.spans)))
            continue
        lead, trail = unit.text[:len(unit.text) - len(unit.text.lstrip())], unit.text[len(unit.text.rstrip()):]
        tokens = [m.span() for m in re.finditer(r"\S+", unit.text)]
        words = []  # (target word, source token or None)
        for i, (a, b) in enumerate(tokens):
            h = zlib.crc32(unit.text[a:b].encode()) + i
            if h % 7 == 0 and len(tokens) >= 6 and len(words) == i:
                continue  # dropped (one word at most, of a longer unit: as a model may)
            word = unit.text[a:b]
            words.append((word[::-1] if _has_letters(word) else word, i))
            if h % 11 == 0:
                words.append(("zz", None))  # added
        for k in range(0, len(words) - 1, 3):  # neighbours swapped
            words[k], words[k + 1] = words[k + 1], words[k]
        target, ranges, pairs = lead, [], []  # (the unit's outer whitespace kept, as the pipeline keeps it)
        for j, (word, i) in enumerate(words):
            target += " " if target.strip() else ""
            ranges.append((len(target), len(target) + len(word)))
            target += word
            if i is not None:
                pairs.append((i, j))
        target += trail
        out.append((target, place_spans(unit, target, pairs, tokens, ranges)))
    return out
