"""Greedy search, beam search and sampling over token ids.

Owns decoding on tensors only (no text, no I/O). Works with any model that offers
``encode(src) -> (memory, src_pad)``, ``new_cache(memory, src_pad, group)`` (each sentence decoded as `group` adjacent rows),
``decode(tokens, memory, src_pad, cache) -> logits`` and a ``config`` with bos/eos/pad ids and
max_positions, so tests can script the probabilities with a fake model.

Beam search follows fairseq's rules: 2 x beam candidates per step so finished hypotheses never
starve the beam; an EOS candidate among the best `beam` is finished with score
sum(log p) / length^lenpen (length counts the EOS); a sentence stops when it has `beam` finished
hypotheses or reaches its maximum length (a*source + b, EOS forced). Every step is batched over
sentences and beams; finished sentences leave the batch so later steps get cheaper. Which
candidates a step takes is an object's (as fairseq's Search): Candidates ranks them by score,
ConstrainedCandidates runs lexical constraints (constraints.py), and the loop calls either the same way.

Sampling runs greedy's loop (the same KV-cached step, finished rows leave the batch) with a random
draw instead of the arg max: N rows per sentence for N samples, each drawn from
softmax(log p / temperature) restricted to the top-k tokens and to the nucleus (the most probable
tokens whose mass reaches top-p). The random numbers are a hash of (seed, sentence key, sample,
step) computed on tensors, not a generator's stream: a sentence's samples depend on the seed and
its key (translate passes the input line number) only, never on which sentences share its batch.
A sample's score is the model's own log-probability (temperature 1, no truncation) / length^lenpen.

All three take the same bans against repetition (RepeatBans): no_repeat_ngram_size, and the loop
guard that stops a phrase at loop_guard - 1 copies in a row unless the source has such a run.

All three give alignments when asked (align_layer): for each output token, the source position that
one decoder layer's encoder-decoder attention, averaged over heads, weighted most while the token
was chosen (fairseq's hard alignment, without EOS and padding). They are the search's own weights
(the cache keeps that layer's, KVCache.record), carried with the hypotheses as their tokens are:
one id per position, gathered with the beams. No second pass over the outputs.
"""


from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from .beam import beam_search
from .config import Sampling, SearchOptions
from .constraints import ConstraintState, WordPieces
from .errors import ConfigError
from .steps import _OPTIONS, Hypothesis, RepeatBans, Wanted, _cut, _max_lengths, _prefix_pass, _recording, _step_lprobs

__all__ = ["Hypothesis", "Sampling", "SearchOptions", "beam_search", "greedy_search", "sample", "search"]


def _one_path_per_row(model, src: Tensor, copies: int, choose, max_len_a: float, max_len_b: int, lenpen: float,
                      min_len: int, prefix: Optional[Tensor] = None, wanted: Optional[Wanted] = None, max_len: int = 0,
                      no_repeat_ngram_size: int = 0, loop_guard: int = 0,
                      align_layer: Optional[int] = None) -> list[list[Hypothesis]]:
    """`copies` rows per sentence, each extended by one token per step until its EOS, with
    choose(lprobs (rows, V), row_ids (rows,), step) -> tokens (rows,); row_ids are indices into the
    B x copies layout (sentence b's rows are b*copies ... b*copies + copies - 1). prefix (B, P): the
    output's first P tokens, given (their log-probabilities count in the score). wanted: see
    search(); an abandoned sentence's rows leave at once. no_repeat_ngram_size, loop_guard:
    RepeatBans (0: off). align_layer: alignments (see the module's docstring). Hypotheses of a
    sentence best first."""
    c = model.config
    B, N = src.size(0), copies
    device = src.device
    repeats = RepeatBans.of(src, no_repeat_ngram_size, loop_guard, c)
    memory, src_pad = model.encode(src)
    cache = model.new_cache(memory, src_pad, group=N)  # the sentence's N rows adjacent
    recording = _recording(cache, align_layer)
    limit = _max_lengths(src_pad, max_len_a, max_len_b, c.max_positions, max_len).repeat_interleave(N)  # (B*N,)
    P = 0 if prefix is None else prefix.size(1)
    L = max(int(limit.max()), P) + 1
    R = B * N
    alive = torch.arange(R, device=device)  # row of each active hypothesis
    last = torch.full((R, 1), c.bos_id, dtype=torch.long, device=device)
    out = torch.full((R, L), c.pad_id, dtype=torch.long, device=device)
    score = torch.zeros(R, device=device)
    lengths = torch.zeros(R, dtype=torch.long, device=device)
    links = torch.zeros((R, L), dtype=torch.long, device=device) if recording else None  # (R, L) alignments
    first = None
    if P:
        rows_prefix = prefix.repeat_interleave(N, dim=0)  # (R, P)
        score, first = _prefix_pass(model, torch.cat([last, rows_prefix], dim=1), cache, limit, min_len)
        out[:, :P] = rows_prefix
        if links is not None:
            links[:, : P + 1] = cache.attended  # (R, P + 1)
    for step in range(P, L):
        lprobs = first if step == P and first is not None else _step_lprobs(model, last, cache, step, limit[alive], min_len)
        if links is not None and not (step == P and first is not None):
            links[alive, step] = cache.attended[:, -1]
        if repeats is not None:
            repeats.ban(lprobs, out[alive, :step], alive // N)
        token = choose(lprobs, alive, step)  # (rows,)
        score[alive] += lprobs.gather(1, token[:, None]).squeeze(1)
        out[alive, step] = token
        ended = token.eq(c.eos_id)
        if wanted is not None and (w := wanted()) is not None:  # abandoned sentences' rows leave as if ended
            ended |= ~w.to(device)[alive // N]
        if bool(ended.any()):
            lengths[alive[ended]] = step + 1
            keep = (~ended).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            alive = alive[keep]
            cache.reorder(keep)
            token = token[keep]
        last = token[:, None]
    result: list[list[Hypothesis]] = []
    rows, lens, scores = out.tolist(), lengths.tolist(), score.tolist()
    aligned = links.tolist() if links is not None else [None] * R
    for b in range(B):
        hyps = [Hypothesis(rows[r][: lens[r] - 1], scores[r] / (lens[r] ** lenpen), _cut(aligned[r], lens[r] - 1))
                for r in range(b * N, (b + 1) * N)]
        hyps.sort(key=lambda h: h.score, reverse=True)
        result.append(hyps)
    return result


def _arg_max(lprobs: Tensor, rows: Tensor, step: int) -> Tensor:
    return lprobs.argmax(dim=-1)  # (rows,)


@torch.no_grad()
def greedy_search(model, src: Tensor, max_len_a: float = _OPTIONS.max_len_a, max_len_b: int = _OPTIONS.max_len_b, lenpen: float = _OPTIONS.lenpen,
                  min_len: int = _OPTIONS.min_len, prefix: Optional[Tensor] = None, wanted: Optional[Wanted] = None,
                  max_len: int = 0, no_repeat_ngram_size: int = 0, loop_guard: int = 0,
                  align_layer: Optional[int] = None) -> list[list[Hypothesis]]:
    """The most probable token at every step (after the prefix (B, P), if given); one hypothesis per sentence."""
    return _one_path_per_row(model, src, 1, _arg_max, max_len_a, max_len_b, lenpen, min_len, prefix, wanted, max_len,
                             no_repeat_ngram_size, loop_guard, align_layer)


_MASK32 = 0xFFFFFFFF


def _mix32(x: Tensor) -> Tensor:
    """A 32-bit integer hash (two xor-shift-multiply rounds) on int64 tensors. Values stay below
    2^32 and the multiplier below 2^31, so no product overflows int64 on any device."""
    x = x & _MASK32
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK32
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK32
    return (x >> 16) ^ x


def uniforms(seed: int, keys: Tensor, copies: Tensor, step: int) -> Tensor:
    """One number in [0, 1) per row (float64, 53 random bits), a pure function of
    (seed, key, copy, step): the same row of the same sentence draws the same number whatever else
    is in the batch. keys, copies: (rows,) int64."""
    h = _mix32(torch.full_like(keys, seed & _MASK32) ^ _mix32(torch.full_like(keys, seed >> 32)))
    h = _mix32(h + _mix32(keys & _MASK32) + _mix32(keys >> 32))
    h = _mix32(h + copies)
    h = _mix32(h + step)
    low = _mix32(h ^ 0x5BD1E995)  # a second 32-bit word from the same state
    bits = (h << 21) | (low >> 11)  # (rows,) 53 bits
    return bits.double() / float(1 << 53)


def draw(lprobs: Tensor, u: Tensor, topk: int = 0, topp: float = 1.0, temperature: float = 1.0) -> Tensor:
    """One token per row by inverse-CDF sampling with the numbers u (rows,) in [0, 1), from
    softmax(lprobs / temperature) restricted to the top-k and then to the nucleus of mass topp
    (the most probable tokens until their mass reaches topp; the best token always stays).
    Tokens with log-probability -inf (banned) are never drawn."""
    V = lprobs.size(1)
    scaled = lprobs.float() / temperature  # (rows, V)
    index: Optional[Tensor] = None  # sorted order -> token id; None: the vocabulary's own order
    if 0 < topk < V:
        values, index = scaled.topk(topk, dim=1)  # (rows, k) best first
    elif topp < 1.0:
        values, index = scaled.sort(dim=1, descending=True)  # (rows, V)
    else:
        values = scaled  # the whole vocabulary: inverse-CDF sampling needs no order, so no sort
    probs = values.double().softmax(dim=1)  # (rows, n) float64: tiny masses keep their share of the CDF
    keep = probs > 0  # (rows, n)
    if index is not None:
        before = probs.cumsum(dim=1) - probs  # (rows, n) mass of the better tokens
        keep &= before < topp
        keep[:, 0] = True  # the best token, even when it alone has more than topp
    probs = probs * keep
    cdf = probs.cumsum(dim=1)  # (rows, n) rises only at kept positions
    target = (u.to(cdf.dtype) * cdf[:, -1])[:, None]  # (rows, 1) in [0, total)
    pick = torch.searchsorted(cdf, target, right=True)  # first position whose CDF exceeds the target: a kept one...
    positions = torch.arange(probs.size(1), device=probs.device)
    last = torch.where(keep, positions, 0).max(dim=1, keepdim=True).values  # (rows, 1)
    pick = torch.minimum(pick, last)  # ...unless rounding put the target at the total: then the last kept
    return (pick if index is None else index.gather(1, pick)).squeeze(1)  # (rows,)


@torch.no_grad()
def sample(model, src: Tensor, nbest: int = _OPTIONS.nbest, sampling: Sampling = Sampling(), max_len_a: float = _OPTIONS.max_len_a,
           max_len_b: int = _OPTIONS.max_len_b, lenpen: float = _OPTIONS.lenpen, min_len: int = _OPTIONS.min_len, keys: Optional[Tensor] = None,
           prefix: Optional[Tensor] = None, wanted: Optional[Wanted] = None, max_len: int = 0, no_repeat_ngram_size: int = 0,
           loop_guard: int = 0, align_layer: Optional[int] = None) -> list[list[Hypothesis]]:
    """`nbest` samples per sentence, best score first, each continuing the prefix (B, P) if given.
    keys (B,): each sentence's identity for the random numbers (default: its row); translate
    passes input line numbers."""
    B = src.size(0)
    if keys is None:
        keys = torch.arange(B)
    keys = keys.to(device=src.device, dtype=torch.long)
    row_key = keys.repeat_interleave(nbest)  # (B*N,)
    row_copy = torch.arange(nbest, device=src.device).repeat(B)  # (B*N,)

    def choose(lprobs: Tensor, rows: Tensor, step: int) -> Tensor:
        u = uniforms(sampling.seed, row_key[rows], row_copy[rows], step)  # (rows,)
        return draw(lprobs, u, sampling.topk, sampling.topp, sampling.temperature)

    return _one_path_per_row(model, src, nbest, choose, max_len_a, max_len_b, lenpen, min_len, prefix, wanted, max_len,
                             no_repeat_ngram_size, loop_guard, align_layer)


def search(model, src: Tensor, options: SearchOptions = SearchOptions(), keys: Optional[Tensor] = None,
           prefix: Optional[Tensor] = None, constraints: Optional[Sequence] = None,
           pieces: Optional[WordPieces] = None, wanted: Optional[Wanted] = None,
           align_layer: Optional[int] = None) -> list[list[Hypothesis]]:
    """Sampling when options.sampling is given (nbest samples; beam unused; keys (B,) identify the
    sentences for the random numbers), else greedy (beam 1) or beam search. prefix (B, P), one
    length for the batch: the output's given first tokens (P = 0 or None: none). constraints: per
    sentence, groups of alternative token sequences that the output must contain (constraints.py),
    as whole words where `pieces` says what a word is; beam search runs them, also at beam 1.
    wanted: asked before every step, None (all) or which sentences (B,) bool are still wanted: the
    others leave the batch at once (a server's requests whose clients went away) and get whatever
    they had finished, perhaps nothing. align_layer: decoder layer (0-based) whose attention gives
    each hypothesis its alignment (None: none)."""
    o = options
    if prefix is not None and prefix.size(1) == 0:
        prefix = None
    common = dict(no_repeat_ngram_size=o.no_repeat_ngram_size, loop_guard=o.loop_guard, align_layer=align_layer)
    if constraints is not None and any(any(any(alt for alt in g) for g in groups) for groups in constraints):
        if o.sampling is not None:
            raise ConfigError("constraints are kept by beam search; drop sampling")
        state = ConstraintState(constraints, src.device, pieces, model.config.bos_id)
        return beam_search(model, src, o.beam, o.max_len_a, o.max_len_b, o.lenpen, o.nbest, o.min_len, prefix, state, wanted, o.max_len,
                           **common)
    if o.sampling is not None:
        return sample(model, src, o.nbest, o.sampling, o.max_len_a, o.max_len_b, o.lenpen, o.min_len, keys, prefix, wanted, o.max_len,
                      **common)
    if o.beam == 1:
        return greedy_search(model, src, o.max_len_a, o.max_len_b, o.lenpen, o.min_len, prefix, wanted, o.max_len, **common)
    return beam_search(model, src, o.beam, o.max_len_a, o.max_len_b, o.lenpen, o.nbest, o.min_len, prefix, wanted=wanted, max_len=o.max_len,
                       **common)
