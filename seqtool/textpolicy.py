"""The one text policy every front-end uses: what happens to text before and after the model.

`TextPolicy` says how a unit (a line, or a document's block: the documents package reads them) is
cut: into sentences (and a long sentence at its clauses) where it is longer than the training lines
or always, and any piece still over the token budget at its last word start; `unit_segments` makes
units into pipeline Segments under it, with notes of what it had to cut (`tell`). `assemble` and
`lines_translated` put the translations back together: sentences joined with the unit's own
whitespace, markup and placeholders placed by the alignments, every alternative, a line's pieces'
alignments joined.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional, Sequence

from . import log
from .documents.spans import Span, Unit
from .interrupts import check_deadline
from .pipeline import MAX_TOLD, Origin, Segment, Translation, encode, say_once
from .steps import Hypothesis


FALLBACK_LONGEST = 64  # tokens: a checkpoint without a length profile (older than it) splits lines past this


FALLBACK_CLAUSE = 48  # tokens: ... and cuts a sentence at its clauses past this
CLAUSE = re.compile(r"(?<=[;:])\s+")  # a clause ends at a semicolon or a colon
SPACE = re.compile(r"\s*")


def split_limit(translator) -> int:
    """Lines longer than this many tokens are cut into sentences by --split-sentences auto: the 99th
    percentile of the training source's lengths (kept in the checkpoint), else FALLBACK_LONGEST."""
    profile = translator.configs.get("source_lengths") or {}
    return int(profile.get("p99") or min(FALLBACK_LONGEST, translator.max_src))


def clause_limit(translator) -> int:
    """A sentence of a cut line longer than this many tokens is cut again at its clauses (; and :):
    the 90th percentile of the training source's lengths, else FALLBACK_CLAUSE. Measured on the
    bible test verses joined 5 to a paragraph (bench/documents.py): a Spanish bible sentence often
    runs over four verses joined by semicolons, longer than anything the model saw."""
    profile = translator.configs.get("source_lengths") or {}
    return int(profile.get("p90") or min(FALLBACK_CLAUSE, translator.max_src))


def budget(translator, mode: str) -> int:
    """The most tokens a segment may have: no piece is ever cropped. Where lines may be cut (split
    auto or always), twice the training lines' length (split_limit): a longer piece with no
    sentence or clause end is cut into runs the model has seen the like of; with split never (a
    user's choice, prefixes, constraints, token alignments), the model's positions alone (room
    left for a target-language tag)."""
    top = translator.max_src - 1
    return top if mode == "never" else max(1, min(top, 2 * split_limit(translator)))


def budgeted(translator, pieces: list[tuple[str, str]], limit: int) -> tuple[list[tuple[str, str]], int]:
    """pieces with every piece over `limit` tokens cut into runs of at most `limit` tokens: each
    at the last word start within its budget, a word longer than that at a token boundary;
    "".join of the pieces is unchanged. Also: how many pieces had to be cut."""
    sizes = [len(ids) for ids in translator.tokenizer.encode_batch([sentence for sentence, _ in pieces])]
    out: list[tuple[str, str]] = []
    cut = 0
    for (sentence, space), size in zip(pieces, sizes):
        if size <= limit:
            out.append((sentence, space))
            continue
        cut += 1
        check_deadline()
        starts = [a for a, _ in translator.tokenizer.encode_with_offsets(sentence)[1]]
        first, at = 0, 0  # the run's first token, and its first character
        while len(starts) - first > limit:
            ends = range(first + limit, first, -1)  # a cut before token k leaves tokens first..k-1 in the run
            k = next((k for k in ends if starts[k] > at and sentence[starts[k]].isspace()), None)
            if k is None:  # one word over the budget: at a token boundary
                k = next((k for k in ends if starts[k] > at), None)
            if k is None:  # one character of more tokens than the budget (byte pieces): after it
                k = next((k for k in range(first + limit + 1, len(starts)) if starts[k] > at), None)
            if k is None:
                break
            stripped = sentence[at:starts[k]].rstrip()
            gap = SPACE.match(sentence, at + len(stripped)).group()  # the whitespace between the runs
            out.append((stripped, gap))
            at += len(stripped) + len(gap)
            first = k  # (the token at k may begin in that whitespace: '▁' covers the space before its word)
        out.append((sentence[at:], space))
    return out, cut


def clauses(translator, pieces: list[tuple[str, str]], limit: int) -> list[tuple[str, str]]:
    """pieces (split_sentences') with every sentence longer than `limit` tokens cut at its clauses,
    the whitespace after each clause kept; "".join of the pieces is unchanged."""
    sizes = [len(ids) for ids in translator.tokenizer.encode_batch([sentence for sentence, _ in pieces])]
    out: list[tuple[str, str]] = []
    for (sentence, space), size in zip(pieces, sizes):
        if size <= limit or not CLAUSE.search(sentence):
            out.append((sentence, space))
            continue
        cuts = list(CLAUSE.finditer(sentence))
        start = 0
        for cut in cuts:
            out.append((sentence[start:cut.start()], cut.group()))
            start = cut.end()
        out.append((sentence[start:], space))
    return out


@dataclass(frozen=True)
class TextPolicy:
    """What happens to text before and after the model: one decision for every front-end (the CLI's
    best and n-best lines, the Python API, the server's /translate with or without alternatives and
    /v1/translate, and every document).

    - placeholders: URLs and e-mail addresses never reach the model; each is written back verbatim
      where the alignment puts the words beside it, kept apart from the words around it;
    - pass-through: text with no letter (numbers, dates, versions, `[22]`, punctuation) is written
      back as it is, never translated (a model asked to translate "2024" invents a sentence);
    - splitting: `split` (auto, always, never: unit_segments says when auto cuts);
    - spacing: whatever is put back keeps the whitespace it had beside it (documents.spans).

    A text the model translates into nothing is kept as it was (in a document, an emptied list item
    or cell would change its structure). Alternatives (n-best) go the same way: alternative k of a text is its sentences' k-th
    hypotheses joined, its placeholders placed by each one's own alignment. Two cases keep text whole:
    a target prefix or constraints (they belong to a whole line: split never, no pass-through), and
    token alignments in the output (they describe the model's own tokens of the line: `as_is`, the
    line given to the model exactly as it is)."""

    split: str = "auto"
    protect: bool = True
    passthrough: bool = True

    @classmethod
    def choose(cls, split: str = "auto", alignments: bool = False, whole: bool = False) -> "TextPolicy":
        """The policy for a request: alignments in the output -> as_is; prefixes or constraints (whole) -> unsplit."""
        if alignments:
            return AS_IS
        if whole:
            return cls("never", True, False)
        return cls(split)


AS_IS = TextPolicy("never", False, False)
COPY = -1  # a Joint's slot for a piece written back as it is (no letter in it)


@dataclass
class Joint:
    """How one unit (a line, or a block of a document) goes back together from its segments: the
    unit (its text and its markup or placeholders as spans), its pieces (split_sentences': each
    sentence and the whitespace after it) and, per piece, the index of its segment (None for an
    empty sentence, COPY for one written back as it is)."""
    unit: Unit
    pieces: list[tuple[str, str]]
    segments: list[Optional[int]]


@dataclass
class Plan:
    """Units made into segments (`segments`, for `run`) and how each unit goes back together (`joints`)."""
    segments: list[Segment]
    joints: list[Joint]
    notes: list[tuple[Origin, str]] = field(default_factory=list)  # units cut to fit the model (told by the front-end)


def units_of(lines: Sequence[str], policy: TextPolicy) -> list[Unit]:
    """Lines as units: their placeholders cut out where the policy says."""
    from .documents.protect import protect

    return [protect(line) if policy.protect else Unit(line, []) for line in lines]


def unit_segments(translator, units: Sequence[Unit], origins: Sequence[Origin], policy: TextPolicy, lang: str = "",
                  prefixes: Optional[Sequence[str]] = None, constraints: Optional[Sequence[list]] = None,
                  glossary=None, blocks: bool = False) -> Plan:
    """The segments of units (lines or document blocks), each unit whole or, by policy.split (auto,
    always, never), cut into its sentences (documents.split_sentences): auto cuts a unit only when it
    is longer than the model's training lines (split_limit) and holds several sentences, so a line
    like the training data goes through exactly as whole. A piece with no letter is written back as
    it is (policy.passthrough). A unit's sentences (and a document's blocks) are keyed apart from every
    whole line (negative keys from line, block and sentence), so sampling never draws a whole line's
    numbers for a sentence. Prefixes and constraints belong to whole units; glossary (terms.Glossary):
    each segment's terms become its constraints. blocks: the units are a document's (the whitespace
    around an uncut one stays out of the model's sight)."""
    from .documents import sentences
    from .documents.protect import letterless

    mode = policy.split
    if prefixes is not None or constraints is not None:
        mode = "never"
    if mode != "never" and not sentences.splitter_available():
        if mode == "always":
            sentences.split_sentences("x", lang)  # raises the one line saying what to install
        say_once("--split-sentences auto: no sentence splitter installed (pip install 'seqtool[documents]'); lines are translated whole")
        mode = "never"
    limit, most = split_limit(translator), budget(translator, mode)
    lengths = [len(ids) for ids in translator.tokenizer.encode_batch([u.text for u in units])]
    notes: list[tuple[Origin, str]] = []
    texts: list[str] = []
    keys: list[int] = []
    where: list[Origin] = []
    chosen_prefixes: list[str] = []
    chosen_constraints: list = []
    joints: list[Joint] = []
    for k, (unit, origin) in enumerate(zip(units, origins)):
        check_deadline()  # (a server request's work outside the model stops at its --request-timeout)
        cut = mode == "always" or (mode == "auto" and lengths[k] > limit and sentences.looks_like_several_sentences(unit.text, lang))
        # a line goes whole as it is; a document's block without the whitespace around it (kept in place)
        pieces = sentences.split_sentences(unit.text, lang, "always" if cut else "never") if cut or blocks else [(unit.text, "")]
        if cut:
            pieces = clauses(translator, pieces, clause_limit(translator))
        if lengths[k] > most:  # nothing is cropped: a piece still over the budget is cut into runs within it
            pieces, over = budgeted(translator, pieces, most)
            if over:
                notes.append((origin, f"{lengths[k]:,} tokens with {'no sentence end' if mode == 'never' else 'too few sentence ends'} "
                                      f"to cut at: translated in {len(pieces)} pieces of at most {most} tokens"))
        whole = len(pieces) == 1 and not pieces[0][1]
        slots: list[Optional[int]] = []
        for j, (sentence, _) in enumerate(pieces):
            if not sentence and not whole:
                slots.append(None)
                continue
            if policy.passthrough and letterless(sentence):
                slots.append(COPY)
                continue
            lead = not any(i is not None and i >= 0 for i in slots)  # the unit's first segment: its prefix and constraints
            slots.append(len(texts))
            texts.append(sentence)
            keys.append(origin.line if whole and not blocks else -(((origin.line << 20) + origin.block << 12) + j + 1))
            where.append(origin if whole else Origin(origin.line, origin.block, j, f"{origin.label}, sentence {j + 1}"))
            if prefixes is not None:
                chosen_prefixes.append(prefixes[k] if lead else "")
            if constraints is not None or glossary is not None:
                chosen_constraints.append((list(constraints[k]) if constraints is not None and lead else []) +
                                          (glossary.match(sentence) if glossary is not None else []))
        joints.append(Joint(unit, pieces, slots))
    segments = encode(translator, texts, where, chosen_prefixes if prefixes is not None else None,
                      chosen_constraints if constraints is not None or glossary is not None else None, keys)
    for j in joints:
        for i in j.segments:
            if i is not None and i >= 0:
                segments[i].align = bool(j.unit.spans)
    return Plan(segments, joints, notes)


def tell(notes: Sequence[tuple[Origin, str]]) -> None:
    """Plans' notes as warnings naming their lines or blocks (at most MAX_TOLD; one line counts the rest)."""
    for origin, note in notes[:MAX_TOLD]:
        log.warn(f"{origin.label}: {note}")
    if len(notes) > MAX_TOLD:
        log.warn(f"and {len(notes) - MAX_TOLD:,} more lines or blocks were cut to fit the model")


def alternatives(plan: Plan, translations: Sequence[Translation]) -> int:
    """How many alternatives the plan's units have: the most hypotheses any segment got (1 at least)."""
    return max([len(t.hypotheses) for t in translations] + [1])


def assemble(translator, plan: Plan, translations: Sequence[Translation], rank: int = 0) -> list[tuple[str, list[Span]]]:
    """Each unit's translation (its alternative `rank`: each sentence's hypothesis of that rank, or its
    last where it has fewer) and its spans placed on it: its sentences' translations joined with the
    unit's own whitespace; a unit with markup or placeholders gets them where the model's alignments
    put the words they wrapped (documents.place_spans; `run` aligned those units' segments:
    Segment.align). Placement cannot fail, whatever the alignment."""
    from .documents.placement import place_spans
    from .documents.sentences import Aligned, join_aligned

    out = []
    for j in plan.joints:
        check_deadline()
        if not any(i is not None and i >= 0 for i in j.segments):  # nothing given to the model: the unit as it is
            out.append((j.unit.text, list(j.unit.spans)))
            continue
        if not j.unit.spans:
            target = "".join(_text(translations, i, sentence, rank) + ws for i, (sentence, ws) in zip(j.segments, j.pieces))
            out.append((target if target.strip() else j.unit.text, []))
            continue
        parts: list[Optional[Aligned]] = []
        for i, (sentence, _) in zip(j.segments, j.pieces):
            if i == COPY:
                tokens = [m.span() for m in re.finditer(r"\S+", sentence)]
                parts.append(Aligned(sentence, [(n, n) for n in range(len(tokens))], tokens, tokens))
                continue
            if i is None or not translations[i].hypotheses:
                parts.append(None if i is None else Aligned(""))
                continue
            r = min(rank, len(translations[i].hypotheses) - 1)
            target, target_tokens = translator.tokenizer.decode_with_offsets(translations[i].hypotheses[r].tokens)
            source_tokens = translator.tokenizer.encode_with_offsets(sentence)[1][: len(plan.segments[i].ids)]
            aligned = translations[i].alignments
            pairs = aligned[r] if aligned and r < len(aligned) else []
            parts.append(Aligned(target, pairs, source_tokens, target_tokens))
        whole = join_aligned(j.pieces, parts)
        if not whole.target.strip():  # the model gave nothing: the unit as it was (an empty list item would end its list)
            out.append((j.unit.text, list(j.unit.spans)))
            continue
        out.append((whole.target, place_spans(j.unit, whole.target, whole.alignment, whole.source_tokens, whole.target_tokens)))
    return out


def _text(translations: Sequence[Translation], i: Optional[int], sentence: str, rank: int) -> str:
    """A piece's translation of this rank (COPY: the sentence itself)."""
    if i == COPY:
        return sentence
    if i is None or not translations[i].texts:
        return ""
    texts = translations[i].texts
    return texts[min(rank, len(texts) - 1)]


def lines_translated(translator, lines_in: Sequence[str], plan: Plan, translations: Sequence[Translation],
                     origins: Sequence[Origin]) -> list[Translation]:
    """One Translation per line (units of lines): a whole line given to the model as it is passes
    through as its segment's (n-best, alignments and all); any other has, per alternative, its
    assembled text (the sentences joined, the placeholders back, letterless pieces as they were)
    and the length-weighted mean score of its sentences."""
    from .documents.spans import render_unit

    ranks = alternatives(plan, translations)
    placed = [assemble(translator, plan, translations, rank) for rank in range(ranks)]
    out = []
    for u, (line, joint, origin) in enumerate(zip(lines_in, plan.joints, origins)):
        mine = [translations[i] for i in joint.segments if i is not None and i >= 0]
        if len(joint.pieces) == 1 and not joint.pieces[0][1] and not joint.unit.spans and joint.segments[0] not in (None, COPY):
            out.append(mine[0])
            continue
        hyps, texts = [], []
        aligned = [] if mine and all(t.alignments for t in mine) else None
        for rank in range(ranks if mine else 1):
            best = [t.hypotheses[min(rank, len(t.hypotheses) - 1)] for t in mine if t.hypotheses]
            weight = sum(len(h.tokens) + 1 for h in best)
            score = sum(h.score * (len(h.tokens) + 1) for h in best) / weight if weight else 0.0
            target, spans = placed[rank][u]
            hyps.append(Hypothesis([tok for h in best for tok in h.tokens], score))
            texts.append(render_unit(target, spans))
            if aligned is not None:  # a line cut to fit the model: its pieces' token alignments, one after another
                aligned.append(_joined_alignment(plan, joint, translations, rank))
        if not line.strip():
            hyps, texts = [], []
        out.append(Translation(origin.line, line, hyps, texts, aligned, origin,
                               max((t.capped for t in mine), default=0)))
    return out


def _joined_alignment(plan: Plan, joint: Joint, translations: Sequence[Translation], rank: int) -> list[tuple[int, int]]:
    """A unit's token alignment of rank `rank` from its segments' (each one's source and target
    positions moved past the segments before it)."""
    pairs: list[tuple[int, int]] = []
    source = target = 0
    for i in joint.segments:
        if i is None or i < 0 or not translations[i].hypotheses:
            continue
        t = translations[i]
        r = min(rank, len(t.hypotheses) - 1)
        pairs += [(a + source, b + target) for a, b in (t.alignments[r] if r < len(t.alignments) else [])]
        source += len(plan.segments[i].ids)
        target += len(t.hypotheses[r].tokens)
    return pairs
