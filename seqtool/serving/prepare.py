"""A translation request checked in full and turned into queued work, before any segment is queued.

Two steps, so that no request costs more than its limits allow and none can fail another's batch:
- `check_size`, on the event loop and cheap (counting only): segments, characters (segments,
  prefixes, constraint phrases and glossary terms together), glossary entries, constraints per
  segment: 413 naming the limit.
- `options`: this request's search options (the dataclasses' bounds: 422 naming the field), the
  server's caps (--max-beam, --max-nbest, --max-len: 422 naming the cap), and the rules across
  fields (sampling keeps no constraints).
- `segments`, in a worker thread (the event loop stays free for every other client): the glossary
  compiled and matched, constraint items parsed, text, prefixes and constraints tokenized, and
  the constraints a segment gets from the glossary counted against its cap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from .. import log, pipeline, textpolicy
from ..config import Sampling, SearchOptions, ServeConfig
from ..errors import FieldError, InputError
from ..interrupts import check_deadline
from ..pipeline import Origin, Segment
from .schemas import BadRequest, field_name


def _phrases(items: Sequence[Any]) -> list[str]:
    return [p for item in items for p in ([item] if isinstance(item, str) else item)]


def check_size(config: ServeConfig, texts: Sequence[str], prefixes: Optional[Sequence[str]] = None,
               constraints: Optional[Sequence[Sequence[Any]]] = None, glossary: Optional[dict] = None) -> None:
    """413 for a request past --max-lines, --max-chars, --max-glossary or --max-constraints, counted
    before any work is done on it."""
    if len(texts) > config.max_lines:
        raise BadRequest(413, f"{len(texts)} segments in one request; this server takes at most {config.max_lines} (--max-lines)")
    if glossary and len(glossary) > config.max_glossary:
        raise BadRequest(413, f"glossary: {len(glossary):,} entries; this server takes at most {config.max_glossary:,} "
                              "(--max-glossary)")
    for k, items in enumerate(constraints or []):
        if len(_phrases(items)) > config.max_constraints:
            raise BadRequest(413, f"constraints of segment {k + 1}: {len(_phrases(items))} phrases; this server takes at "
                                  f"most {config.max_constraints} per segment (--max-constraints)")
    chars = sum(map(len, texts)) + sum(map(len, prefixes or [])) + sum(len(p) for items in constraints or [] for p in _phrases(items))
    chars += sum(len(k) + sum(map(len, [v] if isinstance(v, str) else v)) for k, v in (glossary or {}).items())
    if chars > config.max_chars:
        raise BadRequest(413, f"{chars:,} characters in one request (segments, prefixes, constraints and glossary together); "
                              f"this server takes at most {config.max_chars:,} (--max-chars)")


def options(base: SearchOptions, config: ServeConfig, asked: dict[str, Any], sampling: Optional[dict] = None,
            constrained: bool = False, request: str = "native") -> SearchOptions:
    """The request's search options: what it asked over the server's defaults, within the caps."""
    beam = asked.get("beam")
    if beam is None:
        beam = max(base.beam, asked.get("nbest") or 1)
    try:
        chosen = base.replace(**{**asked, "beam": beam}, max_len=config.max_len,
                              sampling=Sampling(**sampling) if sampling is not None else None)
    except FieldError as error:
        raise BadRequest(422, field_name(error, request)) from None
    if chosen.nbest > config.max_nbest:
        if request == "libre":
            raise BadRequest(422, f"alternatives {chosen.nbest - 1}: this server gives at most {config.max_nbest - 1} "
                                  f"(--max-nbest {config.max_nbest})")
        raise BadRequest(422, f"nbest {chosen.nbest}: this server gives at most {config.max_nbest} hypotheses per segment (--max-nbest)")
    if chosen.sampling is None and chosen.beam > config.max_beam:
        raise BadRequest(422, f"beam {chosen.beam}: this server searches with a beam of at most {config.max_beam} (--max-beam)")
    if chosen.max_len_b > config.max_len:
        raise BadRequest(422, f"max_len_b {chosen.max_len_b}: this server's outputs have at most {config.max_len} tokens (--max-len)")
    if constrained and chosen.sampling is not None:
        raise BadRequest(422, "constraints and glossary are kept by beam search; drop sampling")
    return chosen


def lines(translator, name: str, texts: Sequence[str], prefixes: Optional[Sequence[str]] = None,
          constraints: Optional[Sequence[Sequence[Any]]] = None, glossary: Optional[dict] = None,
          max_constraints: int = 0, alignments: bool = False) -> "Lines":
    """The request's segments as lines under the one text policy (textpolicy.TextPolicy; a worker
    thread runs this). A segment is one line: a line break inside it is a space. BadRequest 422 for
    a constraint item that cannot be one, 413 when the glossary gives a segment more constraints
    than --max-constraints."""
    from ..terms import Glossary, parse_items

    texts = [t.replace("\r", " ").replace("\n", " ") for t in texts]
    prefixes = [p.replace("\r", " ").replace("\n", " ") for p in prefixes] if prefixes else None
    items = None
    if constraints is not None or glossary:
        terms = Glossary([(k, [v] if isinstance(v, str) else list(v)) for k, v in (glossary or {}).items()])
        try:
            items = [parse_items((list(constraints[k]) if constraints else []) + terms.match(text), f"constraints of segment {k + 1}")
                     for k, text in enumerate(texts)]
        except InputError as error:
            raise BadRequest(422, str(error)) from None
        for k, found in enumerate(items):
            if len(_phrases(found)) > max_constraints:
                raise BadRequest(413, f"constraints of segment {k + 1}: {len(_phrases(found))} phrases with the glossary's; "
                                      f"this server takes at most {max_constraints} per segment (--max-constraints)")
    origins = [Origin(line=k, label=f"{name}, segment {k + 1}") for k in range(len(texts))]
    policy = textpolicy.TextPolicy.choose(alignments=alignments, whole=prefixes is not None or items is not None)
    plan = textpolicy.unit_segments(translator, textpolicy.units_of(texts, policy), origins, policy, translator.source_lang,
                                  prefixes, items)
    textpolicy.tell(plan.notes)
    return Lines(texts, origins, plan)


@dataclass
class Lines:
    """A request's segments as lines: their texts, origins and plan (textpolicy.Plan)."""
    texts: list[str]
    origins: list[Origin]
    plan: textpolicy.Plan


def translations(segments: Sequence[Segment], results: Sequence[tuple]) -> list[pipeline.Translation]:
    """The batcher's results (hypotheses, texts, alignments, the length cap reached per segment) as the pipeline's Translations."""
    return [pipeline.Translation(s.key, s.text, r[0], r[1], r[2], s.origin, r[3]) for s, r in zip(segments, results)]


def warnings(translator, what: str, notes: Sequence[tuple[pipeline.Origin, str]], translations: Sequence[pipeline.Translation]) -> list[str]:
    """What a response tells of its texts (`what` 1, 2, ...: "segment", "text"): each one cut to fit
    the model (the plans' notes), each whose translation reached the output length cap (its end may
    be missing). Nothing is cut or cropped without the response saying so."""
    out = [f"{what} {origin.line + 1}: {note}" for origin, note in notes]
    capped = sorted({(t.origin.line, t.capped) for t in translations if t.capped})
    return out + [f"{what} {line + 1}: {pipeline.capped_note(cap, translator.max_src)}" for line, cap in capped]


def lines_answer(translator, request: Lines, results: Sequence[tuple]) -> list[pipeline.Translation]:
    """One Translation per segment of the request, every alternative placed (a worker thread runs this)."""
    return textpolicy.lines_translated(translator, request.texts, request.plan, translations(request.plan.segments, results),
                                     request.origins)


def readable(text: str, format: str) -> str:
    """What a reader reads of a text: an HTML page's text without its tags (what language detection
    goes by), plain text as it is."""
    if format != "html":
        return text
    from ..documents.html import parse_html

    return " ".join(u.text for u in parse_html(text).units)


@dataclass
class Documents:
    """A request's texts read as documents: each one's parsed form and plan (textpolicy.Plan), and where
    its segments start in the request's list."""
    parsed: list
    plans: list[textpolicy.Plan]
    starts: list[int]
    segments: list[Segment]


def documents(translator, name: str, texts: Sequence[str], format: str, split: str = "auto", glossary: Optional[dict] = None,
              attributes: bool = True) -> Documents:
    """The request's texts as documents (format text: lines kept, html, markdown; documents.parse),
    their blocks cut into sentences as `translate --split-sentences` does, under the one text policy
    (a worker thread runs this). Every segment of every text is queued as one request."""
    from ..documents.formats import parse
    from ..terms import Glossary

    terms = Glossary([(k, [v] if isinstance(v, str) else list(v)) for k, v in glossary.items()]) if glossary else None
    parsed, plans, starts, segments = [], [], [], []
    for d, text in enumerate(texts):
        check_deadline()
        doc = parse(text, format, attributes)
        for note in doc.notes:
            log.warn(f"{name}, text {d + 1}: {note}")
        origins = [Origin(d, k, 0, f"{name}, text {d + 1}, block {k + 1}") for k in range(len(doc.units))]
        plan = textpolicy.unit_segments(translator, doc.units, origins, textpolicy.TextPolicy(split), translator.source_lang,
                                      glossary=terms, blocks=True)
        parsed.append(doc)
        plans.append(plan)
        starts.append(len(segments))
        segments += plan.segments
    textpolicy.tell([n for plan in plans for n in plan.notes])  # (and the response names each)
    return Documents(parsed, plans, starts, segments)


def documents_warnings(translator, docs: Documents, results: Sequence[tuple]) -> list[str]:
    """warnings() of a request's documents."""
    return warnings(translator, "text", [n for plan in docs.plans for n in plan.notes], translations(docs.segments, results))


def rendered(translator, docs: Documents, results: Sequence[tuple]) -> list[list[str]]:
    """Each document written back with its blocks' translations (results: the batcher's, one per
    segment of docs.segments) and their markup placed by the alignments: every alternative of it
    (alternative k: its sentences' k-th translations), best first."""
    out = []
    for d, doc in enumerate(docs.parsed):
        check_deadline()
        plan = docs.plans[d]
        mine = translations(plan.segments, results[docs.starts[d]:docs.starts[d] + len(plan.segments)])
        out.append([doc.render(textpolicy.assemble(translator, plan, mine, rank), translator.target_lang or None)
                    for rank in range(textpolicy.alternatives(plan, mine))])
    return out
