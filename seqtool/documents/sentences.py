"""Sentences: where a block's sentences end, and their translations joined back into one.

- `split_sentences(text, lang, mode="always") -> list[(sentence, whitespace)]`: the sentences of
  text, each without surrounding whitespace, with the whitespace after it;
  "".join(s + ws for s, ws in pieces) == text. Whitespace before the first sentence is a first
  piece ("", whitespace); "" gives []. mode "always": the rule-based splitter (sentence-splitter,
  the Moses rules; chosen by measurement, bench/results.md), a ConfigError naming the extra to
  install when it is missing; "never": the whole text as one sentence; "auto": split when the
  splitter is installed and looks_like_several_sentences(text), else one sentence.
- `splitter_available() -> bool`; `looks_like_several_sentences(text, lang) -> bool` (a regular
  expression: sentence-final punctuation followed by more text).
- `Aligned(target, alignment, source_tokens, target_tokens)` and `join_aligned(pieces, parts)`:
  the sentences' translations joined with the source's whitespace into one for the whole unit.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..errors import ConfigError

MODES = ("auto", "always", "never")
INSTALL = "pip install 'seqtool[documents]'"


# ---------------------------------------------------------------------------------------------
# sentences

# sentence-final punctuation (closing quotes and brackets may follow), whitespace, then more text
_SEVERAL = re.compile(r"[.!?…。！？][\"'”’»)\]]*\s+\S")


def looks_like_several_sentences(text: str, lang: str) -> bool:
    """Whether `text` may hold more than one sentence: a . ! ? … (or 。！？) followed by whitespace and
    more text. Cheap (one regular expression, whatever `lang`); a False is certain, a True is a maybe."""
    return _SEVERAL.search(text.strip()) is not None


def splitter_available() -> bool:
    """Whether split_sentences can split (the sentence-splitter package is installed)."""
    try:
        import sentence_splitter  # noqa: F401
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=None)
def _splitter(lang: str):
    """The Moses splitter for `lang` ("es", "pt-BR", "de_AT": its first two letters), with English's
    non-breaking prefixes for a language that has none of its own (as Moses' split-sentences.perl does)."""
    try:
        from sentence_splitter import SentenceSplitter, SentenceSplitterException
    except ImportError:
        raise ConfigError(f"splitting sentences needs the sentence-splitter package: {INSTALL}") from None
    base = re.split(r"[-_]", lang.strip().lower(), maxsplit=1)[0][:2]
    try:
        return SentenceSplitter(language=base)
    except SentenceSplitterException:
        return SentenceSplitter(language="en")


def split_sentences(text: str, lang: str, mode: str = "always") -> list[tuple[str, str]]:
    """The sentences of `text` and the whitespace after each: [(sentence, whitespace), ...] with
    "".join(s + ws for s, ws in result) == text, every sentence without whitespace at either end,
    leading whitespace as a first piece ("", whitespace), [] for "". mode: "always" (split; a
    ConfigError when the splitter is not installed), "never" (one sentence), "auto" (split when the
    splitter is installed and the text looks like several sentences)."""
    if mode not in MODES:
        raise ConfigError(f"sentence splitting mode {mode!r}: choose one of {', '.join(MODES)}")
    if mode == "auto" and not (looks_like_several_sentences(text, lang) and splitter_available()):
        mode = "never"
    core = text.strip()
    lead = text[:len(text) - len(text.lstrip())]
    pieces = [("", lead)] if lead else []
    if not core:
        return pieces if text else []
    if mode == "never":
        return pieces + [(core, text[len(lead) + len(core):])]
    # The splitter reads spaces only and writes sentences with their whitespace collapsed: give it
    # every whitespace character as a space, and find its sentences in the text by counting the
    # characters that are not whitespace (it changes no other).
    sentences = _splitter(lang).split(re.sub(r"\s", " ", core))
    sizes = [sum(1 for c in s if not c.isspace()) for s in sentences]
    solid = [k for k, c in enumerate(text) if not c.isspace()]  # offsets of the characters that are not whitespace
    if sum(sizes) != len(solid) or not all(sizes):
        return pieces + [(core, text[len(lead) + len(core):])]
    done = 0
    for n, size in enumerate(sizes):
        start, end = solid[done], solid[done + size - 1] + 1
        done += size
        following = solid[done] if done < len(solid) else len(text)
        pieces.append((text[start:end], text[end:following]))
    return pieces


# ---------------------------------------------------------------------------------------------
# sentences' translations joined into one per unit


@dataclass
class Aligned:
    """A translation with its alignment: target text; (source token index, target token index) pairs;
    each source token's [start, end) character range in the source text; each target token's in target."""

    target: str
    alignment: list[tuple[int, int]] = field(default_factory=list)
    source_tokens: list[tuple[int, int]] = field(default_factory=list)
    target_tokens: list[tuple[int, int]] = field(default_factory=list)


def join_aligned(pieces: Sequence[tuple[str, str]], parts: Sequence[Optional[Aligned]]) -> Aligned:
    """The translations of split_sentences' pieces (parts[k] for pieces[k]; None, or anything, where the
    sentence is "") joined with the source's whitespace: one Aligned over the whole text, whose source
    ranges are offsets in "".join(s + ws for s, ws in pieces) and whose token indices count on from
    one sentence to the next."""
    if len(parts) != len(pieces):
        raise ValueError(f"join_aligned needs one part per piece: {len(pieces)} pieces, {len(parts)} parts")
    whole = Aligned("")
    target: list[str] = []
    source_at = target_at = 0
    for (sentence, space), part in zip(pieces, parts):
        if sentence and part is not None:
            n_src, n_tgt = len(whole.source_tokens), len(whole.target_tokens)
            whole.alignment += [(i + n_src, j + n_tgt) for i, j in part.alignment]
            whole.source_tokens += [(a + source_at, b + source_at) for a, b in part.source_tokens]
            whole.target_tokens += [(a + target_at, b + target_at) for a, b in part.target_tokens]
            target.append(part.target)
            target_at += len(part.target)
        target.append(space)
        source_at += len(sentence) + len(space)
        target_at += len(space)
    whole.target = "".join(target)
    return whole
