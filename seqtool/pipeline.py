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

`encode` makes segments of text (one tokenizer call per chunk). What happens to text before and
after the model, the same for every front-end, is policy.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from . import log
from .errors import ConfigError
from .config import SearchOptions
from .data import make_batches
from .steps import Hypothesis

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
    align: bool = False  # its best translation's alignment is wanted (markup or placeholders to place)
    tag: Optional[int] = None  # a multilingual model's target-language tag, put in front of the source (languages.py)


@dataclass
class Translation:
    index: int  # 0-based input line number (or the segment's key)
    source: str
    hypotheses: list[Hypothesis]  # best first; empty for an empty segment
    texts: list[str]
    alignments: Optional[list[list[tuple[int, int]]]] = None  # per hypothesis, when the process computes them
    origin: Origin = Origin()
    capped: int = 0  # the output length cap its best hypothesis reached (its end may be missing); 0: it ended itself


def encode(translator, texts: Sequence[str], origins: Sequence[Origin], prefixes: Optional[Sequence[str]] = None,
           constraints: Optional[Sequence[list]] = None, keys: Optional[Sequence[int]] = None) -> list[Segment]:
    """Segments of texts (one tokenizer call for all), each cropped to the model's positions with a
    warning naming it; prefixes: each one's target prefix ("" none); constraints: each one's items
    (terms.py: a phrase or a list of alternative phrases); keys: default each origin's line."""
    ids = translator.tokenizer.encode_batch(list(texts)) if texts else []
    prefix_ids = translator.tokenizer.encode_batch(list(prefixes), "target") if prefixes is not None else [[] for _ in ids]
    limit = translator.max_src
    for k, origin in enumerate(origins):
        for what, seqs in (("", ids), ("target prefix of ", prefix_ids)):
            if len(seqs[k]) > limit:
                log.warn(f"{what}{origin.label}: {len(seqs[k])} tokens, cropped to the model's {limit}")
                seqs[k] = seqs[k][:limit]
    groups = [translator.constraint_ids(items) for items in constraints] if constraints is not None else [[] for _ in ids]
    keys = keys if keys is not None else [o.line for o in origins]
    tag = translator.tag  # a multilingual model's chosen target language (None: no tag)
    return [Segment(key, text, i, p, g, o, tag=tag) for key, text, i, p, g, o in zip(keys, texts, ids, prefix_ids, groups, origins)]


def lines(start: int, texts: Sequence[str], what: str = "line") -> list[Origin]:
    """The origins of consecutive lines numbered from `start` (0-based; named 1-based)."""
    return [Origin(line=start + k, label=f"{what} {start + k + 1}") for k in range(len(texts))]


def check_target(translator, segments: Sequence[Segment] = ()) -> None:
    """A model trained into several languages translates a segment only into a chosen one."""
    langs = translator.languages
    if langs is not None and (translator.tag is None if not segments else any(s.tag is None for s in segments)):
        raise ConfigError(f"this model translates into {', '.join(langs.targets)}: choose one with --tgt-lang "
                          "(Python: tgt_lang=; the server: target)")


def run(translator, segments: Sequence[Segment], options: SearchOptions,
        abandoned: Optional[Callable[[], frozenset]] = None) -> list[Translation]:
    """The segments' translations, in their order. abandoned: asked at every step of a batch, the
    indices (into `segments`) nobody waits for any more: they leave the search at once and get
    nothing. A segment whose best translation lacks a constraint (it did not fit in the length
    limit) gets a warning naming it."""
    from .constraints import satisfied

    check_target(translator, segments)
    # (stored ids, e.g. validation's, are cropped silently); a target-language tag leads the source
    ids = [s.ids[: translator.max_src] if s.tag is None else [s.tag, *s.ids[: translator.max_src - 1]] for s in segments]
    todo = [k for k, s in enumerate(segments) if s.ids]  # an empty segment translates to nothing
    batches = [[todo[i] for i in b] for b in pack(translator.config, [len(ids[k]) + 1 for k in todo])]  # (+1: the EOS)
    jobs = [([ids[k] for k in batch], [segments[k].key for k in batch], options, [segments[k].prefix for k in batch],
             [segments[k].constraints for k in batch], any(segments[k].align for k in batch)) for batch in batches]
    if translator.pool is not None:  # worker processes (they cannot ask `abandoned`)
        done = translator.pool.search(jobs)
    else:
        done = (translator.search_batch(*job, wanted=_wanted(abandoned, batch)) for job, batch in zip(jobs, batches))
    hyps: list[list[Hypothesis]] = [[] for _ in segments]
    alignments: list[Optional[list]] = [None] * len(segments)
    for batch, (found, aligned) in zip(batches, done):
        for i, k in enumerate(batch):
            hyps[k] = found[i]
            if aligned is not None:  # (source positions counted without the tag)
                alignments[k] = aligned[i] if segments[k].tag is None else [[(max(a - 1, 0), b) for a, b in h] for h in aligned[i]]
    caps = output_limits([len(i) + 1 for i in ids], options, translator.max_src + 1).tolist() if ids else []
    capped = [cap if h and len(h[0].tokens) >= cap else 0 for h, cap in zip(hyps, caps)]
    at_cap: dict[tuple[int, int], list[tuple[Segment, int]]] = {}
    for s, h, cap in zip(segments, hyps, capped):
        if s.constraints and h and not satisfied(h[0].tokens, s.constraints):
            log.warn(f"{s.origin.label}: the translation lacks a constraint (it does not fit in the output length limit)")
        if cap:
            at_cap.setdefault((s.origin.line, s.origin.block), []).append((s, cap))
    for group in list(at_cap.values())[:MAX_TOLD]:  # one warning per line or block, naming its first piece at the cap
        (first, cap), more = group[0], f" (and {len(group) - 1} more of its pieces)" if len(group) > 1 else ""
        log.warn(f"{first.origin.label}{more}: {capped_note(cap, translator.max_src)}")
    if len(at_cap) > MAX_TOLD:
        log.warn(f"and {len(at_cap) - MAX_TOLD:,} more lines or blocks of this batch reached their output length caps")
    texts = iter(translator.tokenizer.decode_batch([x.tokens for h in hyps for x in h]))  # one call for all
    return [Translation(s.key, s.text, h, [next(texts) for _ in h], a, s.origin, c)
            for s, h, a, c in zip(segments, hyps, alignments, capped)]


MAX_TOLD = 10  # warnings of translations at their length caps per call of run; beyond, one line counts the rest


def capped_note(cap: int, max_src: int) -> str:
    """What a translation at its output length cap is told (its end may be missing), and what raises the cap."""
    why = "the model's positions" if cap >= max_src else "max_len_b, max_len_a: --max-len-b, --max-len-a"
    return f"the translation reached the output length cap of {cap} tokens ({why}): its end may be missing"


def output_limits(lengths: Sequence[int], options: SearchOptions, max_positions: int) -> torch.Tensor:
    """Each segment's output length cap (its source length with the EOS): what search stops at."""
    from .steps import max_lengths

    return max_lengths(torch.tensor(lengths, dtype=torch.long), options.max_len_a, options.max_len_b, max_positions, options.max_len)


# --- lines cut into sentences and joined back ------------------------------------------------------


_said: set = set()


def say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        log.info(message)


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
