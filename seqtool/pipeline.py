"""The one decode pipeline: segments in, translations out. encode -> batch -> search -> format.

A `Segment` is what one decode request is about, whoever asked: its key (the identity of its random
draws when sampling: a line number, a request's segment index), its source ids, its target prefix
ids, its constraint groups, and where it came from (`Origin`: the line or document, the block
within a document, the sentence within a line or block, and how warnings name it). Every per-segment
feature is a field here, not a parameter threaded through the call chain.

Three front-ends feed `run`: translate_file (the CLI, a chunk of lines at a time), Translator's
translate_stream (the Python API) and the server's batcher (segments of many requests); run sorts
the segments by length and packs them with data.make_batches (the packer training uses, under
--max-tokens and --batch-size), searches each batch (here, or in worker processes), puts the
results back in the segments' order and detokenizes them in one call.

`encode` makes segments of text (one tokenizer call per chunk, cropped to the model's positions
with a warning naming the segment); `split` and `join` cut a line into sentences and put their
translations back together with the line's own whitespace (documents.py says where sentences
end); documents go through documents.py's units, each unit's sentences becoming segments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from . import log
from .config import SearchOptions
from .data import make_batches
from .search import Hypothesis

NO_LIMIT = 2 ** 62  # make_batches' token budget when only --batch-size limits a batch


@dataclass(frozen=True)
class Origin:
    """Where a segment came from: its line (or document, or a request's segment), the block within a
    document, the sentence within a line or block; `label` is how messages name it."""
    line: int = 0
    block: int = 0
    sentence: int = 0
    label: str = ""


@dataclass
class Segment:
    key: int  # its random draws' identity when sampling: the same key, the same samples, whatever the batch
    text: str  # the source text (for Translation.source)
    ids: list[int]  # source token ids, without EOS, cropped to the model's positions
    prefix: list[int] = field(default_factory=list)  # the translation starts with these target ids
    constraints: list = field(default_factory=list)  # groups of alternative token sequences it must contain
    origin: Origin = Origin()


@dataclass
class Translation:
    index: int  # 0-based input line number (or the segment's key)
    source: str
    hypotheses: list[Hypothesis]  # best first; empty for an empty segment
    texts: list[str]
    alignments: Optional[list[list[tuple[int, int]]]] = None  # per hypothesis, when the process computes them
    origin: Origin = Origin()


def encode(translator, texts: Sequence[str], origins: Sequence[Origin], prefixes: Optional[Sequence[str]] = None,
           constraints: Optional[Sequence[list]] = None, keys: Optional[Sequence[int]] = None) -> list[Segment]:
    """Segments of texts (one tokenizer call for all), each cropped to the model's positions with a
    warning naming it; prefixes: each one's target prefix ("" none); constraints: each one's items
    (terms.py: a phrase or a list of alternative phrases); keys: default each origin's line."""
    ids = translator.tokenizer.encode_batch(list(texts)) if texts else []
    prefix_ids = translator.tokenizer.encode_batch(list(prefixes)) if prefixes is not None else [[] for _ in ids]
    limit = translator.max_src
    for k, origin in enumerate(origins):
        for what, seqs in (("", ids), ("target prefix of ", prefix_ids)):
            if len(seqs[k]) > limit:
                log.warn(f"{what}{origin.label}: {len(seqs[k])} tokens, cropped to the model's {limit}")
                seqs[k] = seqs[k][:limit]
    groups = [translator.constraint_ids(items) for items in constraints] if constraints is not None else [[] for _ in ids]
    keys = keys if keys is not None else [o.line for o in origins]
    return [Segment(key, text, i, p, g, o) for key, text, i, p, g, o in zip(keys, texts, ids, prefix_ids, groups, origins)]


def lines(start: int, texts: Sequence[str], what: str = "line") -> list[Origin]:
    """The origins of consecutive lines numbered from `start` (0-based; named 1-based)."""
    return [Origin(line=start + k, label=f"{what} {start + k + 1}") for k in range(len(texts))]


def run(translator, segments: Sequence[Segment], options: SearchOptions,
        abandoned: Optional[Callable[[], frozenset]] = None) -> list[Translation]:
    """The segments' translations, in their order. abandoned: asked at every step of a batch, the
    indices (into `segments`) nobody waits for any more: they leave the search at once and get
    nothing. A segment whose best translation lacks a constraint (it did not fit in the length
    limit) gets a warning naming it."""
    from .constraints import satisfied

    ids = [s.ids[: translator.max_src] for s in segments]  # (stored ids, e.g. validation's, are cropped silently)
    todo = [k for k, seq in enumerate(ids) if seq]  # an empty segment translates to nothing
    batches = [[todo[i] for i in b] for b in pack(translator.config, [len(ids[k]) + 1 for k in todo])]  # (+1: the EOS)
    jobs = [([ids[k] for k in batch], [segments[k].key for k in batch], options, [segments[k].prefix for k in batch],
             [segments[k].constraints for k in batch]) for batch in batches]
    if translator.pool is not None:  # worker processes (they cannot ask `abandoned`)
        done = translator.pool.search(jobs)
    else:
        done = (translator.search_batch(*job, wanted=_wanted(abandoned, batch)) for job, batch in zip(jobs, batches))
    hyps: list[list[Hypothesis]] = [[] for _ in segments]
    alignments: list[Optional[list]] = [None] * len(segments)
    for batch, (found, aligned) in zip(batches, done):
        for i, k in enumerate(batch):
            hyps[k] = found[i]
            if aligned is not None:
                alignments[k] = aligned[i]
    for s, h in zip(segments, hyps):
        if s.constraints and h and not satisfied(h[0].tokens, s.constraints):
            log.warn(f"{s.origin.label}: the translation lacks a constraint (it does not fit in the output length limit)")
    texts = iter(translator.tokenizer.decode_batch([x.tokens for h in hyps for x in h]))  # one call for all
    return [Translation(s.key, s.text, h, [next(texts) for _ in h], a, s.origin) for s, h, a in zip(segments, hyps, alignments)]


def pack(config, lengths: Sequence[int]) -> list[list[int]]:
    """Batches (indices into lengths) of sentences sorted by length, within config.max_tokens
    padded tokens (0: no limit) and config.batch_size sentences: data.make_batches, the packer
    training uses. Longest first: a batch too big for memory fails at once, not at the end."""
    if not lengths:
        return []
    sizes = np.asarray(lengths, dtype=np.int64)
    return [list(b) for b in reversed(make_batches(sizes, sizes, config.max_tokens or NO_LIMIT, None, max_sentences=config.batch_size))]


def _wanted(abandoned: Optional[Callable[[], frozenset]], batch: list[int]) -> Optional[Callable[[], Optional[torch.Tensor]]]:
    """search's `wanted` for one batch: None while no segment of the call is abandoned."""
    if abandoned is None:
        return None

    def wanted() -> Optional[torch.Tensor]:
        gone = abandoned()
        return torch.tensor([k not in gone for k in batch]) if gone else None
    return wanted
