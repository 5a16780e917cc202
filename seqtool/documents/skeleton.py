"""A document as verbatim chunks around its units: whatever is not translated text comes back byte for byte.

`Skeleton.units[k]` is what the model translates; `render(translated, lang)` takes one (target
text, spans) per unit, the spans being the unit's own placed over the target (placement.py), and
returns the document with every chunk unchanged. Besides text in the flow of the document, a unit
may be an attribute's value (an image's alt text, a title): inside a verbatim chunk it is a chunk
of its own; inside a span's markup (a link's title inside a paragraph) it is a hole in that
markup, filled when the unit holding the span is written. A document's language (`<html lang>`)
is a chunk that `render` writes as `lang` when one is given.

A unit given back as it was (its own text and span ranges, as `identity()` gives) is written as its
source was, byte for byte, whatever its escaping.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence, Union

from .spans import Escape, Span, Unit, render_unit


@dataclass(frozen=True)
class Lang:
    """A language code in the document (`<html lang="es">`): written as the target language."""
    raw: str


@dataclass(frozen=True)
class Hole:
    """Characters [start, end) of span `span`'s opening markup are unit `unit`'s translation."""
    span: int
    start: int
    end: int
    unit: int


Chunk = Union[str, int, Lang]


class Skeleton:
    """A document as its verbatim chunks and its units, in order; see the module's docstring."""

    def __init__(self, chunks: list[Chunk], units: list[Unit], escapes: list[Optional[Escape]], raws: list[str],
                 holes: dict[int, list[Hole]], notes: Optional[list[str]] = None):
        self.chunks, self.units, self.escapes, self.raws, self.holes = chunks, units, escapes, raws, holes
        self.notes: list[str] = notes or []  # what the reader could not do (a block left untranslated), for a warning

    def render(self, translated: Sequence[tuple[str, Sequence[Span]]], lang: Optional[str] = None) -> str:
        if len(translated) != len(self.units):
            raise ValueError(f"render needs one (text, spans) per unit: {len(self.units)} units, got {len(translated)}")
        done: dict[int, str] = {}

        def written(k: int) -> str:
            if k not in done:
                done[k] = self._unit(k, translated[k], written)
            return done[k]

        out = []
        for chunk in self.chunks:
            if isinstance(chunk, str):
                out.append(chunk)
            elif isinstance(chunk, Lang):
                out.append(lang if lang else chunk.raw)
            else:
                out.append(written(chunk))
        return "".join(out)

    def _unit(self, k: int, translation: tuple[str, Sequence[Span]], written) -> str:
        target, spans = translation
        own = self.units[k]
        if len(spans) != len(own.spans) or any(a.parent != b.parent for a, b in zip(spans, own.spans)):
            raise ValueError(f"unit {k}: the spans given are not the unit's own ({len(spans)} for {len(own.spans)}); "
                             "place them with place_spans")
        holes = self.holes.get(k, [])
        if target == own.text and all((a.start, a.end) == (b.start, b.end) for a, b in zip(spans, own.spans)) and \
                all(written(h.unit) == self.raws[h.unit] for h in holes):
            return self.raws[k]  # as it was: byte for byte
        if holes:
            spans = list(spans)
            for hole in sorted(holes, key=lambda h: (h.span, -h.start)):  # (from the right: offsets stay valid)
                span = spans[hole.span]
                spans[hole.span] = replace(span, open=span.open[:hole.start] + written(hole.unit) + span.open[hole.end:])
        return render_unit(target, spans, self.escapes[k])

    def identity(self) -> list[tuple[str, list[Span]]]:
        """Each unit's own text and spans: render(identity()) gives the document back."""
        return [(unit.text, list(unit.spans)) for unit in self.units]


class SkeletonBuilder:
    """Collects a Skeleton: verbatim text and units (a unit with no text to translate stays verbatim)."""

    def __init__(self) -> None:
        self.chunks: list[Chunk] = []
        self.units: list[Unit] = []
        self.escapes: list[Optional[Escape]] = []
        self.raws: list[str] = []
        self.holes: dict[int, list[Hole]] = {}
        self.notes: list[str] = []

    def verbatim(self, text: str) -> None:
        if text:
            self.chunks.append(text)

    def lang(self, raw: str) -> None:
        self.chunks.append(Lang(raw))

    def unit(self, unit: Unit, raw: str, escape: Optional[Escape], holes: Sequence[Hole] = ()) -> None:
        """A unit in the flow of the document (verbatim when it has no text, unless it holds holes)."""
        k = self.hidden(unit, raw, escape, force=bool(holes))
        if k is None:
            self.verbatim(raw)
            return
        self.chunks.append(k)
        if holes:
            self.holes[k] = list(holes)

    def hidden(self, unit: Unit, raw: str, escape: Optional[Escape], force: bool = False) -> Optional[int]:
        """A unit only a Hole refers to (an attribute's value inside a span's markup): its index, or
        None when it has no text to translate."""
        if not (unit.text.strip() or force):
            return None
        self.units.append(unit)
        self.escapes.append(escape)
        self.raws.append(raw)
        return len(self.units) - 1

    def embed(self, other: Skeleton) -> None:
        """Another document's chunks and units here (an HTML block inside Markdown)."""
        offset = len(self.units)
        for chunk in other.chunks:
            self.chunks.append(chunk + offset if isinstance(chunk, int) else chunk)
        self.units += other.units
        self.escapes += other.escapes
        self.raws += other.raws
        for k, holes in other.holes.items():
            self.holes[k + offset] = [replace(h, unit=h.unit + offset) for h in holes]
        self.notes += other.notes

    def finish(self, kind: type) -> Skeleton:
        return kind(self.chunks, self.units, self.escapes, self.raws, self.holes, self.notes)
