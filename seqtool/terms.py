"""Terminology as text: the constraints a line's translation must contain, from a constraints file
or a glossary. Text only; translate.py turns the phrases into token ids and constraints.py keeps
them in the search.

A line's constraints are a list of items; an item is a phrase (a string) or a list of
alternative phrases ("one of these forms", e.g. the inflections of a term), any one of which
satisfies it.

- constraints file (`translate --constraints FILE`): one JSON list per input line; an empty line
  or [] means none. `["Dios", ["cielo", "cielos"]]`: "Dios" and one of "cielo" / "cielos".
- glossary (`translate --glossary FILE.tsv`): `source term<TAB>target term[<TAB>another form...]`
  per line (blank lines and lines starting with # are skipped; a source term given again is
  warned about and its first entry kept). When a source term occurs in an input line as whole
  words (case-sensitive unless asked otherwise), its target forms become one item of that line's
  constraints.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from . import log
from .errors import InputError
from .textio import read_lines, strip_line_end

Item = Union[str, list[str]]


def parse_items(value: Any, where: str) -> list[Item]:
    """A line's constraints from parsed JSON: a list of phrases or lists of phrases (non-empty strings)."""
    if not isinstance(value, list):
        raise InputError(f"{where}: expected a JSON list of phrases (or of lists of alternative phrases), got {type(value).__name__}")
    items: list[Item] = []
    for k, item in enumerate(value):
        forms = item if isinstance(item, list) else [item]
        if not forms or not all(isinstance(f, str) and f.strip() for f in forms):
            raise InputError(f"{where}: item {k + 1} must be a non-empty phrase or a non-empty list of non-empty phrases, got {json.dumps(item)}")
        items.append(list(forms) if isinstance(item, list) else item)
    return items


def parse_constraints_line(line: str, where: str) -> list[Item]:
    """One line of a constraints file: a JSON list, or nothing (empty line)."""
    line = strip_line_end(line).strip()
    if not line:
        return []
    try:
        value = json.loads(line)
    except json.JSONDecodeError as error:
        raise InputError(f"{where}: not JSON ({error.msg} at column {error.colno}); write one JSON list of phrases per line") from None
    return parse_items(value, where)


@dataclass(frozen=True)
class Entry:
    source: str
    targets: tuple[str, ...]
    pattern: re.Pattern


class Glossary:
    """Source terms and their target forms; `match(line)` gives the constraints a line calls for."""

    def __init__(self, entries: list[tuple[str, list[str]]], ignore_case: bool = False):
        flags = re.IGNORECASE if ignore_case else 0
        # whole words: no word character just before or after the term
        self.entries = [Entry(src, tuple(tgts), re.compile(rf"(?<!\w){re.escape(src)}(?!\w)", flags)) for src, tgts in entries]

    @classmethod
    def read(cls, path: Path, ignore_case: bool = False) -> "Glossary":
        """The glossary file at `path`; a source term given again (whatever its case, with
        ignore_case) is warned about, naming both lines, and its first entry kept."""
        entries = []
        first_line: dict[str, int] = {}  # source term (lowercased with ignore_case) -> its line
        for lineno, line in enumerate(read_lines(Path(path), "strict"), start=1):
            line = strip_line_end(line)
            if not line.strip() or line.startswith("#"):
                continue
            fields = [f.strip() for f in line.split("\t")]
            if len(fields) < 2 or not fields[0] or not all(fields[1:]):
                raise InputError(f"{path}:{lineno}: expected 'source term<TAB>target term' (more TAB-separated target forms "
                                 f"allowed), got {line!r}")
            term = fields[0].lower() if ignore_case else fields[0]
            if term in first_line:
                log.warn(f"{path}:{lineno}: duplicate source term {fields[0]!r} (first at {path}:{first_line[term]}); "
                         f"the first entry is kept, this one ignored")
                continue
            first_line[term] = lineno
            entries.append((fields[0], fields[1:]))
        return cls(entries, ignore_case)

    def match(self, line: str) -> list[Item]:
        """The target forms of every source term that occurs in `line`, once per term."""
        out: list[Item] = []
        for e in self.entries:
            if e.pattern.search(line):
                out.append(e.targets[0] if len(e.targets) == 1 else list(e.targets))
        return out
