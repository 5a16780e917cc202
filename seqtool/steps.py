"""What every search shares, one decoder step at a time: the hypothesis record, the output-length
caps, the step's log-probabilities with their bans (padding, BOS, language tags, EOS before min_len,
only EOS at a row's cap), a target prefix in one pass, the bans against repetition (RepeatBans:
no_repeat_ngram_size and the loop guard) and a fast top-k. Tensors only (search.py has the contract)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from .config import SearchOptions
from .kernels import log_softmax_

_OPTIONS = SearchOptions()  # the search functions' defaults (search.py, beam.py) are its own: declared once

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


def _cut(links: Optional[list[int]], n: int) -> Optional[list[int]]:
    return None if links is None else links[:n]
