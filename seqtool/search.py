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

import functools
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from .config import Sampling, SearchOptions
from .constraints import ConstraintState, WordPieces, stripes
from .errors import ConfigError
from .kernels import log_softmax_

__all__ = ["Hypothesis", "Sampling", "SearchOptions", "beam_search", "greedy_search", "sample", "search"]
_OPTIONS = SearchOptions()  # the defaults of the search functions below are its own (one declaration)

NEG_INF = float("-inf")
Wanted = Callable[[], Optional[Tensor]]  # search()'s `wanted`: None (every sentence) or (B,) bool
UNMET = 1e6  # subtracted from the rank (not the score) of a finished output that lacks a constraint


@dataclass
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    score: float  # length-normalised log-probability, as used for ranking
    alignment: Optional[list[int]] = None  # per token, the source position it attended to most (search's align_layer)


def _recording(cache, align_layer: Optional[int]) -> bool:
    """Start recording the alignment layer's attention (KVCache.record: after each decoder call its
    `attended` (rows, T) holds the source position each row's new positions attended to most)."""
    if align_layer is not None:
        cache.record(align_layer)
    return align_layer is not None


def max_lengths(src_len: Tensor, max_len_a: float, max_len_b: int, max_positions: int, max_len: int = 0) -> Tensor:
    """(B,) output length caps for sources of src_len tokens (incl. EOS): max_len_a * length + max_len_b,
    within the model's positions and max_len (pipeline.run warns about an output that reaches its cap)."""
    limit = (max_len_a * src_len.double() + max_len_b).long()
    return limit.clamp(min=1, max=min(max_positions - 1, max_len or max_positions))  # the BOS takes one position


def _max_lengths(src_pad: Tensor, max_len_a: float, max_len_b: int, max_positions: int, max_len: int = 0) -> Tensor:
    return max_lengths((~src_pad).sum(1), max_len_a, max_len_b, max_positions, max_len)  # (B,) lengths incl. EOS


def _step_lprobs(model, tokens: Tensor, cache, step: int, max_len: Tensor, min_len: int) -> Tensor:
    """Log-probabilities of the next token (rows, V) with bans and forced EOS applied."""
    logits = model.decode(tokens, None, None, cache)[:, -1]  # (rows, V)
    return _banned(model.config, log_softmax_(logits), step, max_len, min_len)


def _prefix_pass(model, tokens: Tensor, cache, max_len: Tensor, min_len: int) -> tuple[Tensor, Tensor]:
    """BOS + a target prefix (rows, 1 + P) through the decoder in one call (the cache takes the P + 1
    positions at once): each row's log-probability of the prefix (rows,), and the next token's
    log-probabilities after it (rows, V), bans applied, as _step_lprobs gives at step P."""
    P = tokens.size(1) - 1
    lprobs = model.decode(tokens, None, None, cache).float().log_softmax(dim=-1)  # (rows, 1 + P, V)
    prefix_lp = lprobs[:, :P].gather(2, tokens[:, 1:, None]).squeeze(2).sum(1)  # (rows,)
    return prefix_lp, _banned(model.config, lprobs[:, P], P, max_len, min_len)


def _banned(c, lprobs: Tensor, step: int, max_len: Tensor, min_len: int) -> Tensor:
    """lprobs (rows, V) of the token at `step` with PAD, BOS and language tags banned, EOS banned before min_len
    and the only choice at a row's max_len."""
    lprobs[:, c.pad_id] = NEG_INF
    lprobs[:, c.bos_id] = NEG_INF
    if c.language_tags:  # target-language tags lead a source; never an output (languages.py)
        lprobs[:, c.vocab_size - c.language_tags:] = NEG_INF
    if step < min_len:
        lprobs[:, c.eos_id] = NEG_INF
    at_limit = max_len <= step  # (rows,) only EOS may follow
    if bool(at_limit.any()):
        eos = lprobs[:, c.eos_id].clone()
        lprobs[at_limit] = NEG_INF
        lprobs[at_limit, c.eos_id] = torch.where(torch.isfinite(eos[at_limit]), eos[at_limit], torch.zeros_like(eos[at_limit]))
    return lprobs


GUARD_LONGEST = 8  # the loop guard watches phrases of 1 to 8 tokens


class RepeatBans:
    """Bans against repetition, from each row's output so far (the target prefix counts as output):

    - no_repeat_ngram_size n (fairseq's --no-repeat-ngram-size): no n-gram appears twice, so the
      token that would end a repeat of an earlier n-gram is banned;
    - the loop guard, `copies` k: no phrase of 1 to GUARD_LONGEST tokens appears k times in a row,
      so where the last k*m - 1 tokens have period m (k - 1 copies and m - 1 tokens of another),
      the token that would complete the k-th copy is banned. A sentence whose source has such a run
      (k copies of a phrase in a row, special tokens aside) is not guarded.

    Tokens that constraints want next (exempt) are never banned: a constraint that needs a
    repeated phrase wins. EOS is never banned, and a row left with no possible token may only end
    (EOS, log-probability 0 where the model's is -inf), so bans never leave a search nothing to
    choose."""

    def __init__(self, src: Tensor, ngram: int, copies: int, config):
        if copies == 1:
            raise ValueError("loop_guard counts copies of a phrase in a row: 0 (off) or at least 2")
        self.ngram, self.copies = ngram, copies
        self.eos, self.pad = config.eos_id, config.pad_id
        device = src.device
        self.guarded = ~has_loop(src, copies, (config.pad_id, config.bos_id, config.eos_id)) if copies else None  # (B,)
        self.everyone = bool(self.guarded.all()) if copies else False  # no source has a run (the usual batch)
        self.offsets = _guard_offsets(copies, device) if copies else []

    @classmethod
    def of(cls, src: Tensor, ngram: int, copies: int, config) -> Optional["RepeatBans"]:
        return cls(src, ngram, copies, config) if ngram or copies else None

    def ban(self, lprobs: Tensor, history: Tensor, sentence: Tensor, exempt: Optional[Callable[[], Optional[Tensor]]] = None) -> None:
        """Bans (-inf, in place) in lprobs (rows, V), given each row's output so far history (rows, t)
        and its sentence (rows,) (an index into the source batch); exempt() gives tokens (rows, A)
        never to ban (-1: none), or None (asked only when there is something to ban)."""
        parts = [p for p in (self._loop(history, sentence) if self.copies else None,
                             self._ngram(history) if self.ngram and history.size(1) >= self.ngram else None) if p is not None]
        if not parts:  # the usual step: nothing to ban
            return
        ids = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]  # (rows, M) PAD: none (PAD is banned already)
        keep = ids.eq(self.eos)
        if exempt is not None and (spared := exempt()) is not None:
            keep |= (ids[:, :, None] == spared[:, None, :]).any(2)
        ids = ids.masked_fill(keep, self.pad)
        lprobs.scatter_(1, ids, NEG_INF)
        stuck = ids.ne(self.pad).any(1) & (lprobs.amax(dim=1) == NEG_INF)  # (rows,) banned into having no token: they end
        lprobs[:, self.eos].masked_fill_(stuck, 0.0)

    def _loop(self, history: Tensor, sentence: Tensor) -> Optional[Tensor]:
        """(rows, m) for each period up to the longest that fits, the token that would complete
        the k-th copy, else PAD; None when there is none."""
        k, t = self.copies, history.size(1)
        periods = min(GUARD_LONGEST, (t + 1) // k)  # m fits when the output has k*m - 1 tokens
        if periods == 0:
            return None
        rows, J = history.size(0), (k - 1) * periods - 1
        pairs = periods * J
        tokens = history.gather(1, (self.offsets[periods - 1] + t).expand(rows, -1))  # (rows, 2 * pairs + m)
        left, right = tokens[:, :pairs].view(rows, periods, J), tokens[:, pairs: 2 * pairs].view(rows, periods, J)
        differ = (left != right).any(2)  # (rows, m) not periodic
        if not self.everyone:
            differ |= ~self.guarded[sentence][:, None]
        return None if bool(differ.all()) else tokens[:, 2 * pairs:].masked_fill(differ, self.pad)

    def _ngram(self, history: Tensor) -> Optional[Tensor]:
        """(rows, t - n + 1) the token after each earlier occurrence of the last n - 1 tokens, else
        PAD; None when there is none."""
        n = self.ngram
        follow = history[:, n - 1:]  # (rows, t - n + 1) each n-gram's last token
        if n == 1:
            return follow
        t = history.size(1)
        starts = history[:, : t - 1].unfold(1, n - 1, 1)  # (rows, t - n + 1, n - 1) each n-gram's first n - 1
        differ = (starts != history[:, t - n + 1:][:, None, :]).any(2)  # (rows, t - n + 1)
        return None if bool(differ.all()) else follow.masked_fill(differ, self.pad)


@functools.lru_cache(maxsize=32)
def _guard_offsets(copies: int, device: torch.device) -> list[Tensor]:
    """For the loop guard of k = `copies` and each p = 1..8, the positions one gather takes from an
    output of t tokens, as offsets from t: for every period m <= p the pairs (t-1-j, t-1-j-m),
    j < (k-1)m - 1, that must hold equal tokens (unused pairs: (-1, -1)), left sides then right
    sides, each (p, J) with J = (k-1)p - 1, flattened; then the offsets -m of the tokens the next
    one would repeat: (2 * p * J + p,)."""
    out = []
    for p in range(1, GUARD_LONGEST + 1):
        m = torch.arange(1, p + 1, device=device)[:, None]  # (p, 1)
        j = torch.arange((copies - 1) * p - 1, device=device)[None, :]  # (1, J)
        used = j < (copies - 1) * m - 1  # (p, J)
        out.append(torch.cat([torch.where(used, -1 - j, -1).view(-1), torch.where(used, -1 - j - m, -1).view(-1), -m[:, 0]]))
    return out


def has_loop(src: Tensor, copies: int, specials: Sequence[int]) -> Tensor:
    """(B,) whether each source sentence (B, S) says a phrase of 1 to GUARD_LONGEST tokens `copies`
    times in a row (special tokens are no phrase)."""
    B, S = src.shape
    word = ~torch.isin(src, torch.tensor(list(specials), device=src.device))  # (B, S)
    found = torch.zeros(B, dtype=torch.bool, device=src.device)
    for m in range(1, GUARD_LONGEST + 1):
        span = (copies - 1) * m  # k copies of m tokens: (k-1)m tokens each equal to the one m before
        if S - m < span:
            break
        same = (src[:, m:] == src[:, :-m]) & word[:, m:] & word[:, :-m]  # (B, S - m)
        found |= same.unfold(1, span, 1).all(2).any(1)
    return found


def top_k(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """x.topk(k, dim=1) for wide rows, in two cheap passes: the row's maximum of every block of
    columns, then an exact top-k over only the k blocks with the highest maxima (a value in the top
    k has at most k - 1 larger values, so at most k - 1 blocks can have a higher maximum than its
    own). Columns past the last whole block always take part. On CPU 1.5x faster than torch.topk
    over (rows, 8000), whose per-row selection was 8.6% of int8 beam search."""
    R, V = x.shape
    if x.device.type != "cpu" or V < 256 * k:  # narrow rows (and GPUs): torch.topk is fine
        return x.topk(k, dim=1)
    block = 64  # measured fastest for V = 8000 (ragged tail and all): 80, 50, 100 or 125 were 1.2-4x slower
    nb = V // block
    x = x.contiguous()
    whole = x[:, : nb * block].unflatten(1, (nb, block))  # (R, nb, block), a view
    best_blocks = whole.amax(dim=2).topk(k, dim=1).indices  # (R, k)
    # the k best blocks of every row, copied as whole blocks (index_select measured 5x faster
    # here than a gather with an expanded index)
    tail = V - nb * block
    if tail:  # rows are not a whole number of blocks: the blocks' elements by their flat positions
        # (merging (R, nb) into R*nb blocks would copy all of x: 20 ms a step at V = 58,101)
        start = best_blocks * block + torch.arange(0, R * V, V, device=x.device)[:, None]  # (R, k)
        where = (start[:, :, None] + torch.arange(block, device=x.device)).view(-1)  # (R*k*block,)
        cand = x.view(-1).index_select(0, where).view(R, k * block)  # (R, k*block)
        cand = torch.cat([cand, x[:, nb * block :]], dim=1)  # and the ragged tail joins every row's candidates
    else:
        flat = best_blocks + torch.arange(0, R * nb, nb, device=x.device)[:, None]  # (R, k) block ids in (R*nb)
        cand = whole.reshape(R * nb, block).index_select(0, flat.view(-1)).view(R, k * block)  # (R, k*block)
    values, pick = cand.topk(k, dim=1)  # (R, k) best first
    col = best_blocks.gather(1, (pick // block).clamp_(max=k - 1)) * block + pick % block  # (R, k)
    if tail:
        col = torch.where(pick >= k * block, pick - k * block + nb * block, col)
    return values, col


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


def _cut(links: Optional[list[int]], n: int) -> Optional[list[int]]:
    return None if links is None else links[:n]


def _arg_max(lprobs: Tensor, rows: Tensor, step: int) -> Tensor:
    return lprobs.argmax(dim=-1)  # (rows,)


@torch.no_grad()
def greedy_search(model, src: Tensor, max_len_a: float = _OPTIONS.max_len_a, max_len_b: int = _OPTIONS.max_len_b, lenpen: float = 1.0,
                  min_len: int = 1, prefix: Optional[Tensor] = None, wanted: Optional[Wanted] = None,
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
def sample(model, src: Tensor, nbest: int = 1, sampling: Sampling = Sampling(), max_len_a: float = _OPTIONS.max_len_a,
           max_len_b: int = _OPTIONS.max_len_b, lenpen: float = 1.0, min_len: int = 1, keys: Optional[Tensor] = None,
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


class Candidates:
    """Plain beam search's choice among a step's candidates (as fairseq's Search): each sentence's
    best 2 x beam by score, equal scores in candidate order; nothing banned, nothing added, nothing
    kept aside. beam_search calls every method at every step; ConstrainedCandidates overrides them."""

    def start(self, prefix: Tensor) -> None:
        """The hypotheses begin with the target prefix (B, P)."""

    def exempt(self) -> Optional[Tensor]:
        """(rows, A) tokens the repetition bans must leave possible (-1: none), or None."""
        return None

    def restrict(self, lprobs: Tensor, step: int, at_limit: Tensor) -> None:
        """Bans (-inf, in place) in the rows' log-probabilities (rows, V) of the token at `step`;
        at_limit (rows,): rows at their length limit, where only EOS may follow."""

    def widen(self, full: Tensor, lprobs: Tensor, row_token: Tensor) -> tuple[Tensor, Tensor]:
        """Each row's candidates (rows, W): log-probabilities and tokens, with any extra ones taken
        from the row's full log-probabilities (rows, V)."""
        return lprobs, row_token

    def rank(self, cand: Tensor, row_token: Tensor, alive: Tensor, n: int) -> tuple[Tensor, Tensor]:
        """The n candidates taken from each sentence's cand (b, rows*W) (tokens row_token (b*rows, W),
        sentences alive (b,)), in the order they are taken: their scores and indices (b, n)."""
        top_index = cand.argsort(dim=1, descending=True, stable=True)[:, :n]  # (b, n) best first, ties in candidate order
        return cand.gather(1, top_index), top_index

    def finish(self, norm: Tensor, top_index: Tensor, finishing: Tensor, alive: Tensor) -> Tensor:
        """What ranks the outputs that finish now (finishing (b, n), normalised scores norm) among
        the sentence's finished ones: their score."""
        return norm

    def done(self, done: Tensor, alive: Tensor) -> Tensor:
        """(b,) which sentences stop, given the plain rule's answer `done`."""
        return done

    def follow(self, parent_rows: Tensor, next_token: Tensor) -> None:
        """The surviving hypotheses (rows,): each from its parent row, extended by its next token."""


class ConstrainedCandidates(Candidates):
    """Candidate choice for lexical constraints (constraints.py, dynamic beam allocation): EOS waits
    until every constraint is met (except at the length limit), a met constraint is not placed
    again, each row may also take the next token of each unmet constraint, the beam is filled in
    stripes over the levels of progress, an output that lacks a constraint ranks below all that have
    them, and a sentence stops once its n-best outputs with every constraint have finished.

    rank() keeps which candidates have met every constraint (full_met, (b, rows*W)) for finish()."""

    def __init__(self, state: ConstraintState, eos: int, nbest: int):
        self.state, self.eos, self.nbest = state, eos, nbest
        self.full_met: Optional[Tensor] = None
        self.met_finished = torch.zeros(state.total.size(0), dtype=torch.long, device=state.total.device)  # (B,) outputs with every constraint finished

    def start(self, prefix: Tensor) -> None:
        for j in range(prefix.size(1)):  # the prefix may already place constraint tokens
            self.state.advance(prefix[:, j])

    def exempt(self) -> Tensor:
        return self.state.wanted()

    def restrict(self, lprobs: Tensor, step: int, at_limit: Tensor) -> None:
        waiting = ~self.state.ready() & ~at_limit  # no EOS before every constraint is met (unless at the limit)
        lprobs[:, self.eos] = torch.where(waiting, torch.full_like(lprobs[:, self.eos], NEG_INF), lprobs[:, self.eos])
        ban = self.state.banned()  # (rows, A) what would repeat a met constraint
        hit = ban >= 0
        if bool(hit.any()):
            lprobs[torch.arange(ban.size(0), device=ban.device)[:, None].expand_as(ban)[hit], ban[hit]] = NEG_INF

    def widen(self, full: Tensor, lprobs: Tensor, row_token: Tensor) -> tuple[Tensor, Tensor]:
        """Each row's candidates (rows, W) extended by the tokens its constraints want next (rows, A)
        and, with word pieces, by its best token that ends a word (not EOS), so a complete
        constraint always has a boundary to take. One already among the row's candidates, or there
        twice, is an impossible (-inf) extra."""
        extra = self.state.wanted()  # (rows, A) -1: none
        pieces = self.state.pieces
        if pieces is not None:
            free = full.masked_fill(pieces.continues, NEG_INF)
            free[:, self.eos] = NEG_INF
            extra = torch.cat([extra, free.argmax(dim=1, keepdim=True)], dim=1)  # (rows, A + 1)
        repeat = (extra[:, :, None] == extra[:, None, :]).tril(-1).any(2)  # an earlier one is the same
        dup = (extra[:, :, None] == row_token[:, None, :]).any(2) | repeat | (extra < 0)
        ids = extra.clamp(min=0)
        add = full.gather(1, ids).masked_fill(dup, NEG_INF)
        return torch.cat([lprobs, add], dim=1), torch.cat([row_token, ids], dim=1)

    def rank(self, cand: Tensor, row_token: Tensor, alive: Tensor, n: int) -> tuple[Tensor, Tensor]:
        """The first n in stripes over the levels of progress. Once an output with every constraint
        has finished, only such outputs go on: the search is then plain beam search among them and
        ends as it does (else the levels below keep the sentence going, and at the length limit long
        repetitive outputs win on their average)."""
        b = cand.size(0)
        total = self.state.total[alive]  # (b,)
        banks = self.state.progress(row_token).view(b, -1)  # (b, rows*W)
        self.full_met = banks == total[:, None]
        cand = torch.where((self.met_finished[alive] > 0)[:, None] & ~self.full_met, torch.full_like(cand, NEG_INF), cand)
        top_index = stripes(cand, banks, total).topk(n, dim=1, largest=False).indices  # (b, n)
        return cand.gather(1, top_index), top_index

    def finish(self, norm: Tensor, top_index: Tensor, finishing: Tensor, alive: Tensor) -> Tensor:
        """At the length limit an output may lack a constraint: it ranks below all that have them."""
        missing = ~self.full_met.gather(1, top_index)
        self.met_finished[alive] += (finishing & ~missing).sum(1)
        return torch.where(missing, norm - UNMET, norm)

    def done(self, done: Tensor, alive: Tensor) -> Tensor:
        """Also once the n-best outputs with every constraint have finished. (Longer searches only
        find longer outputs that win on their average: 600 bible lines, beam 5, BLEU 20.10 stopping
        at the first, 19.21 at the second, 18.05 after beam-many; unconstrained 18.67.)"""
        return done | (self.met_finished[alive] >= self.nbest)

    def follow(self, parent_rows: Tensor, next_token: Tensor) -> None:
        self.state.select(parent_rows)
        self.state.advance(next_token)


class _Finished:
    """Each sentence's best K finished outputs (B, K): normalised score, what ranks them
    (Candidates.finish), tokens BOS ... EOS (padded to L + 1), their alignments (when recorded: a
    source position per output token, padded to L + 1) and how many have finished."""

    def __init__(self, B: int, K: int, L: int, pad: int, device: torch.device, aligned: bool):
        self.scores = torch.full((B, K), NEG_INF, device=device)
        self.rank = torch.full((B, K), NEG_INF, device=device)
        self.tokens = torch.full((B, K, L + 1), pad, dtype=torch.long, device=device)
        self.links = torch.zeros((B, K, L + 1), dtype=torch.long, device=device) if aligned else None
        self.count = torch.zeros(B, dtype=torch.long, device=device)

    def merge(self, alive: Tensor, norm: Tensor, rank: Tensor, seqs: Tensor, finishing: Tensor,
              links: Optional[Tensor] = None) -> None:
        """The outputs finishing (b, n) of the sentences alive (b,), with their scores norm, ranks,
        tokens seqs (b, n, L + 1) and alignments links (b, n, L + 1), merged into each sentence's best K."""
        K, width = self.scores.size(1), self.tokens.size(2)
        merged_scores = torch.cat([self.scores[alive], norm], dim=1)  # (b, K + n)
        best, pick = torch.cat([self.rank[alive], rank], dim=1).topk(K, dim=1)  # (b, K)
        self.rank[alive] = best
        self.scores[alive] = merged_scores.gather(1, pick)
        pick = pick[:, :, None].expand(-1, -1, width)
        self.tokens[alive] = torch.cat([self.tokens[alive], seqs], dim=1).gather(1, pick)  # of (b, K + n, L + 1)
        if self.links is not None:
            self.links[alive] = torch.cat([self.links[alive], links], dim=1).gather(1, pick)
        self.count[alive] += finishing.sum(1)

    def best(self, nbest: int, eos: int) -> list[list[Hypothesis]]:
        result: list[list[Hypothesis]] = []
        links = self.links[:, :nbest].tolist() if self.links is not None else [[None] * nbest] * self.scores.size(0)
        for sent_scores, sent_tokens, sent_links in zip(self.scores[:, :nbest].tolist(), self.tokens[:, :nbest].tolist(), links):
            hyps = []
            for s, seq, aligned in zip(sent_scores, sent_tokens, sent_links):
                if s == NEG_INF:
                    continue
                end = seq.index(eos, 1)
                hyps.append(Hypothesis(seq[1:end], s, _cut(aligned, end - 1)))
            result.append(hyps)
        return result


@torch.no_grad()
def beam_search(model, src: Tensor, beam: int = 5, max_len_a: float = _OPTIONS.max_len_a, max_len_b: int = _OPTIONS.max_len_b,
                lenpen: float = 1.0, nbest: int = 1, min_len: int = 1, prefix: Optional[Tensor] = None,
                constraints: Optional[ConstraintState] = None, wanted: Optional[Wanted] = None,
                max_len: int = 0, no_repeat_ngram_size: int = 0, loop_guard: int = 0,
                align_layer: Optional[int] = None) -> list[list[Hypothesis]]:
    """The `nbest` best hypotheses per sentence, best first. prefix (B, P): every hypothesis starts
    with these P tokens (decoded in one pass, their log-probabilities part of the score and the
    length part of the normalisation); the search starts after them. constraints: phrases every
    hypothesis must contain (constraints.py: dynamic beam allocation; EOS waits for them).
    no_repeat_ngram_size, loop_guard: RepeatBans (0: off). align_layer: alignments (the module's
    docstring), carried as the tokens are: `links` (b*rows, t) holds each row's so far."""
    c = model.config
    B, K = src.size(0), beam
    device = src.device
    choice = Candidates() if constraints is None else ConstrainedCandidates(constraints, c.eos_id, nbest)
    repeats = RepeatBans.of(src, no_repeat_ngram_size, loop_guard, c)
    memory, src_pad = model.encode(src)
    max_len0 = _max_lengths(src_pad, max_len_a, max_len_b, c.max_positions, max_len)  # (B,)
    P = 0 if prefix is None else prefix.size(1)
    L = max(int(max_len0.max()), P) + 1  # output tokens incl. the prefix and EOS
    # Every beam starts from the same BOS: step 0 decodes one row per sentence (rows = 1), whose
    # best candidates then become the K beams (rows = K, adjacent; cross-attention K/V kept once
    # per sentence).
    cache = model.new_cache(memory, src_pad, group=1)
    recording = _recording(cache, align_layer)
    links = torch.zeros((B, 0), dtype=torch.long, device=device) if recording else None  # (b*rows, t)
    rows = 1
    alive = torch.arange(B, device=device)  # (b,) original index of each active sentence
    tokens = torch.full((B, 1), c.bos_id, dtype=torch.long, device=device)  # (b*rows, 1+t) BOS and the output so far
    scores = torch.zeros(B, 1, device=device)  # (b, rows)
    first = None
    if P:  # the prefix in one decoder call; the search goes on from step P
        tokens = torch.cat([tokens, prefix], dim=1)  # (B, 1 + P)
        prefix_lp, first = _prefix_pass(model, tokens, cache, max_len0, min_len)
        scores = prefix_lp[:, None]
        choice.start(prefix)
        if links is not None:
            links = cache.attended  # (B, P + 1): the prefix's and the next token's
    finished = _Finished(B, K, L, c.pad_id, device, links is not None)
    for step in range(P, L):
        b = alive.numel()
        limit = max_len0[alive].repeat_interleave(rows)  # (b*rows,)
        if step == P and first is not None:
            lprobs = first
        else:
            lprobs = _step_lprobs(model, tokens[:, -1:], cache, step, limit, min_len)  # (b*rows, V)
            if links is not None:  # the source position each row attends to most as it chooses this step's token
                links = torch.cat([links, cache.attended], dim=1)
        if repeats is not None:
            repeats.ban(lprobs, tokens[:, 1:], alive.repeat_interleave(rows), choice.exempt)
        choice.restrict(lprobs, step, limit <= step)
        # Each row's best 2K tokens hold the sentence's best 2K candidates (no row gives more), so
        # the sentence ranks rows x 2K candidates, not rows x V.
        full = lprobs  # (b*rows, V)
        lprobs, row_token = top_k(full, min(2 * K, full.size(1)))  # (b*rows, 2K)
        lprobs, row_token = choice.widen(full, lprobs, row_token)  # (b*rows, W) constrained: and what the constraints want
        W = lprobs.size(1)
        cand = (scores[:, :, None] + lprobs.view(b, rows, W)).view(b, rows * W)
        n_cand = min(2 * K, rows * W)
        top_scores, top_index = choice.rank(cand, row_token, alive, n_cand)  # (b, n_cand) in the order taken
        # which continue: the first K that are not EOS, in this order
        priority = torch.where(torch.isfinite(top_scores), -torch.arange(n_cand, device=device, dtype=top_scores.dtype),
                               torch.full_like(top_scores, NEG_INF))
        if n_cand < K:  # a vocabulary smaller than the beam: the missing candidates are impossible ones
            top_scores = torch.cat([top_scores, top_scores.new_full((b, K - n_cand), NEG_INF)], dim=1)
            priority = torch.cat([priority, priority.new_full((b, K - n_cand), NEG_INF)], dim=1)
            top_index = torch.cat([top_index, top_index.new_zeros(b, K - n_cand)], dim=1)
            n_cand = K
        parent = top_index // W  # (b, n_cand) row within the sentence
        token = row_token.view(b, rows * W).gather(1, top_index)  # (b, n_cand)
        eos = token.eq(c.eos_id)

        # 1. EOS among the first K candidates: finished, merged into the sentence's best K.
        finishing = eos & torch.isfinite(top_scores)
        finishing[:, K:] = False
        if bool(finishing.any()):
            norm = torch.where(finishing, top_scores / float(step + 1) ** lenpen, torch.full_like(top_scores, NEG_INF))
            src_rows = (torch.arange(b, device=device)[:, None] * rows + parent).view(-1)  # (b*n_cand,)
            seqs = torch.full((b, n_cand, L + 1), c.pad_id, dtype=torch.long, device=device)
            seqs[:, :, : step + 1] = tokens[src_rows].view(b, n_cand, step + 1)
            seqs[:, :, step + 1] = c.eos_id
            seq_links = None
            if links is not None:  # (the EOS's own is not kept)
                seq_links = torch.zeros((b, n_cand, L + 1), dtype=torch.long, device=device)
                seq_links[:, :, :step] = links[src_rows, :step].view(b, n_cand, step)
            finished.merge(alive, norm, choice.finish(norm, top_index, finishing, alive), seqs, finishing, seq_links)

        # 2. The first K candidates that are not EOS continue.
        _, pick = torch.where(eos, torch.full_like(priority, NEG_INF), priority).topk(K, dim=1)  # (b, K)
        scores = torch.where(eos, torch.full_like(top_scores, NEG_INF), top_scores).gather(1, pick)  # (b, K)
        parent_rows = (torch.arange(b, device=device)[:, None] * rows + parent.gather(1, pick)).view(-1)  # (b*K,)
        next_token = token.gather(1, pick).view(-1, 1)  # (b*K, 1)

        # 3. Sentences with K finished hypotheses (or at their length limit) leave the batch.
        done = (finished.count[alive] >= K) | (max_len0[alive] <= step) | ~torch.isfinite(scores).any(1)  # (b,)
        done = choice.done(done, alive)
        if wanted is not None and (w := wanted()) is not None:  # abandoned sentences leave with what they have
            done |= ~w.to(device)[alive]
        if bool(done.all()):
            break
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(1)
            alive = alive[keep]
            scores = scores[keep]
            parent_rows = parent_rows.view(b, K)[keep].view(-1)
            next_token = next_token.view(b, K)[keep].view(-1, 1)
            cache.reorder(parent_rows, cross=True, group=K)
        else:  # cross K/V are equal across a sentence's beams: only the first step regroups them
            cache.reorder(parent_rows, cross=rows != K, group=K)
        tokens = torch.cat([tokens[parent_rows], next_token], dim=1)  # (b*K, 2+t)
        if links is not None:
            links = links[parent_rows]  # (b*K, 1+t): the parent's, and the parent's choice of this step
        choice.follow(parent_rows, next_token.view(-1))
        rows = K
    return finished.best(nbest, c.eos_id)


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
