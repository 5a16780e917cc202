"""Which format a document is in, how its bytes become text and back, and the plain text reader.

- `FORMATS`, `choose_format(format, name)`: "auto" (the default) is chosen from a file's name:
  .html/.htm/.xhtml -> html, .md/.markdown/.mdown/.mkd -> markdown, anything else text; names and
  formats are case-insensitive. `looks_like_html(text)`: for a warning where stdin is read as text.
- `parse(doc, format, attributes=True)`: parse_text, parse_html or parse_markdown.
- `read_document(data, format, name, errors)` -> (text, Encoding); `Encoding.encode(text)`: the
  bytes written back in the document's own encoding (a BOM kept; HTML declared in another
  charset by its <meta> written in it, characters it lacks as references; line ends untouched).
- `parse_text(doc)` -> TextDocument: a unit per line with text, its URLs and e-mail addresses cut
  out; line ends (\\n, \\r\\n), blank lines and an empty document are kept as they are.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from pathlib import PurePath
from typing import Optional, Protocol, Sequence

from .. import log
from ..errors import ConfigError, InputError
from .html import parse_html
from .markdown import one_line, parse_markdown
from .protect import protect
from .skeleton import Skeleton, SkeletonBuilder
from .spans import Span, Unit

FORMATS = ("auto", "text", "html", "markdown")
SUFFIXES = {".html": "html", ".htm": "html", ".xhtml": "html", ".md": "markdown", ".markdown": "markdown",
            ".mdown": "markdown", ".mkd": "markdown"}


class Document(Protocol):
    units: list[Unit]
    notes: list[str]

    def render(self, translated: Sequence[tuple[str, Sequence[Span]]], lang: Optional[str] = None) -> str: ...

    def identity(self) -> list[tuple[str, list[Span]]]: ...


def check_format(format: str, what: str = "format") -> str:
    """The format named (any case), or a ConfigError listing the choices."""
    chosen = format.strip().lower()
    if chosen not in FORMATS:
        raise ConfigError(f"{what} {format!r}: choose one of {', '.join(FORMATS)}")
    return chosen


def choose_format(format: str, name: Optional[str] = None) -> str:
    """`format`, with auto resolved from the file's name (text without one)."""
    chosen = check_format(format)
    if chosen != "auto":
        return chosen
    return SUFFIXES.get(PurePath(name).suffix.lower(), "text") if name else "text"


_HTML_START = re.compile(r"\s*(?:<!--.*?-->\s*)*<(?:!doctype\s+html|html|head|body)\b", re.IGNORECASE | re.DOTALL)
_HTML_TAGS = re.compile(r"</(?:p|div|li|td|th|h[1-6]|span|a|b|i|em|strong|ul|ol|table|tr)>", re.IGNORECASE)


def looks_like_html(text: str) -> bool:
    """Whether text read as lines is more likely an HTML document (a doctype or <html> at its start,
    or closing tags of common elements in its first 64 KiB)."""
    head = text[:65536]
    return bool(_HTML_START.match(head)) or len(_HTML_TAGS.findall(head)) >= 3


def parse(doc: str, format: str, attributes: bool = True) -> Document:
    """parse_text, parse_html or parse_markdown, by `format` ("text", "html", "markdown")."""
    format = check_format(format)
    if format == "html":
        return parse_html(doc, attributes)
    if format == "markdown":
        return parse_markdown(doc, attributes)
    if format == "text":
        return parse_text(doc)
    raise ConfigError("document format auto: choose text, html or markdown (auto is chosen from a file's name)")


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


# ---------------------------------------------------------------------------------------------
# bytes <-> text

_BOMS = [(codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be"), (codecs.BOM_UTF8, "utf-8"),
         (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be")]
_META_CHARSET = re.compile(rb"""<meta\s[^>]*?charset\s*=\s*["']?\s*([A-Za-z0-9._:-]+)""", re.IGNORECASE)
# what browsers read these labels as (the WHATWG Encoding Standard): Latin-1 labels mean windows-1252
_LABELS = {"iso-8859-1": "cp1252", "iso8859-1": "cp1252", "latin1": "cp1252", "latin-1": "cp1252", "l1": "cp1252",
           "us-ascii": "cp1252", "ascii": "cp1252", "windows-1252": "cp1252", "x-sjis": "shift_jis", "utf8": "utf-8"}


@dataclass(frozen=True)
class Encoding:
    """How a document's bytes were written: its codec, its BOM, and whether characters the codec lacks
    may be written as HTML references."""
    codec: str = "utf-8"
    bom: bytes = b""
    references: bool = False

    def encode(self, text: str) -> bytes:
        return self.bom + text.encode(self.codec, "xmlcharrefreplace" if self.references else "strict")


def read_document(data: bytes, format: str, name: str, errors: str = "replace") -> tuple[str, Encoding]:
    """A document's text from its bytes: by its BOM; an HTML document by the charset its <meta>
    declares in its first 1024 bytes; else UTF-8. Bytes the codec cannot read: errors "strict", an
    InputError naming the line; "replace", U+FFFD in their place, with a warning."""
    for bom, codec in _BOMS:
        if data.startswith(bom):
            return _decode(data[len(bom):], codec, name, errors), Encoding(codec, bom, format == "html")
    if format == "html":
        declared = _META_CHARSET.search(data[:1024])
        if declared:
            label = declared.group(1).decode("ascii").lower()
            codec = _LABELS.get(label, label)
            try:
                codec = codecs.lookup(codec).name
            except LookupError:
                codec = "utf-8"
            if codec not in ("utf-16-le", "utf-16-be", "utf-16"):  # (a declaration in ASCII cannot mean UTF-16)
                return _decode(data, codec, name, errors), Encoding(codec, b"", True)
    return _decode(data, "utf-8", name, errors), Encoding("utf-8", b"", format == "html")


def _decode(data: bytes, codec: str, name: str, errors: str) -> str:
    try:
        return data.decode(codec)
    except UnicodeDecodeError as error:
        line = data[:error.start].count(b"\n") + 1
        what = "UTF-8" if codec == "utf-8" else codec
        if errors == "strict":
            raise InputError(f"{name}:{line}: invalid {what} at byte {error.start}; fix the file or pass --errors replace") from None
        log.warn(f"{name}:{line}: invalid {what}, undecodable bytes replaced by U+FFFD (here and wherever else they are)")
        return data.decode(codec, "replace")
