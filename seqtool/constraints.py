"""Lexical constraints for beam search: target phrases every output must contain, on tensors only.

Lives beside search.py (which calls it when constraints are given) and knows no text: turning
phrases into token ids is the translator's (translate.py, constraint_ids). A sentence has groups
of alternatives: a group is met when any one of its alternatives (token sequences) has appeared
in the output; "one of these forms" (inflections of a term) is a group of several alternatives, a
plain constraint a group of one.

The search is dynamic beam allocation (Post & Vilar, NAACL 2018) in the vectorized form of Hu et
al. (NAACL 2019): every step each hypothesis may also continue with the next token of each of its
unmet alternatives (beside its best tokens), every candidate's progress (constraint tokens met so
far) is computed for the whole batch at once, and the beam is filled stripe by stripe: the best
candidate of every progress level, then the second best of every level, and so on, highest
progress first, so hypotheses that have placed constraint tokens are not pushed out by ones that
score better because they have not. EOS is banned until every group is met, except at the length
limit, where the search must end (a constraint that does not fit is then missing: the translator
warns). Nothing loops over hypotheses or constraints in Python.

Matching follows each alternative's progress p: a token equal to its (p+1)th token advances it,
any other token restarts it (at 1 if the token is its first, else at 0). Like fairseq, this does
not backtrack into overlapping partial matches (a phrase "a a b" after "a a a b" is missed while
in progress, and found if the search places it again).

Rows follow the cache's contract: `select(index)` keeps row index[i] as row i (beam search calls
it with each survivor's parent, and with fewer rows when sentences finish).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

# per sentence: groups, each a list of alternatives, each a list of token ids
SentenceConstraints = Sequence[Sequence[Sequence[int]]]


class ConstraintState:
    """The batch's constraints (B sentences) and, per decoder row, each alternative's progress and
    each group's met flag."""

    def __init__(self, constraints: Sequence[SentenceConstraints], device: torch.device):
        B = len(constraints)
        flat = [[(g, alt) for g, group in enumerate(groups) for alt in group if alt] for groups in constraints]
        A = max([len(f) for f in flat] + [1])
        G = max([len(groups) for groups in constraints] + [1])
        T = max([len(alt) for f in flat for _, alt in f] + [1])
        self.tokens = torch.full((B, A, T), -1, dtype=torch.long)  # alternative a's tokens, -1 after its end
        self.lengths = torch.zeros(B, A, dtype=torch.long)  # 0: no alternative there
        self.group = torch.zeros(B, A, dtype=torch.long)  # the group of each alternative
        self.group_size = torch.zeros(B, G, dtype=torch.long)  # tokens a met group counts (its longest alternative)
        self.exists = torch.zeros(B, G, dtype=torch.bool)
        for b, f in enumerate(flat):
            for a, (g, alt) in enumerate(f):
                self.tokens[b, a, : len(alt)] = torch.tensor(alt)
                self.lengths[b, a] = len(alt)
                self.group[b, a] = g
                self.group_size[b, g] = max(int(self.group_size[b, g]), len(alt))
                self.exists[b, g] = True
        self.tokens, self.lengths, self.group, self.group_size, self.exists = (
            t.to(device) for t in (self.tokens, self.lengths, self.group, self.group_size, self.exists))
        self.total = self.group_size.sum(1)  # (B,) progress when every group is met
        self.sent = torch.arange(B, device=device)  # (rows,) each row's sentence
        self.progress_of = torch.zeros(B, A, dtype=torch.long, device=device)  # (rows, A)
        self.met = ~self.exists.clone()  # (rows, G) a group that does not exist counts as met

    # ---- rows ----------------------------------------------------------------------------------
    def select(self, index: Tensor) -> None:
        """Row index[i] becomes row i (the cache's reorder contract)."""
        self.sent, self.progress_of, self.met = self.sent[index], self.progress_of[index], self.met[index]

    def all_met(self) -> Tensor:
        """(rows,) every group met."""
        return self.met.all(1)

    def row_total(self) -> Tensor:
        return self.total[self.sent]

    # ---- what the next token does ------------------------------------------------------------------
    def _active(self) -> Tensor:
        """(rows, A) alternatives that exist and whose group is unmet."""
        group = self.group[self.sent]
        return (self.lengths[self.sent] > 0) & ~self.met.gather(1, group)

    def wanted(self) -> Tensor:
        """(rows, A) the token that advances each active alternative (its next one), else -1."""
        toks = self.tokens[self.sent]  # (rows, A, T)
        at = self.progress_of.clamp(max=toks.size(2) - 1)
        nxt = toks.gather(2, at[:, :, None]).squeeze(2)
        return torch.where(self._active(), nxt, torch.full_like(nxt, -1))

    def _after(self, token: Tensor) -> tuple[Tensor, Tensor]:
        """Progress (rows, W, A) and met groups (rows, W, G) after each of W candidate tokens (rows, W)."""
        toks = self.tokens[self.sent]  # (rows, A, T)
        active = self._active()[:, None, :]  # (rows, 1, A)
        nxt = self.wanted()[:, None, :]  # (rows, 1, A)
        first = toks[:, None, :, 0]  # (rows, 1, A)
        t = token[:, :, None]  # (rows, W, 1)
        prog = self.progress_of[:, None, :]
        new = torch.where(t == nxt, prog + 1, (t == first).long())  # (rows, W, A)
        new = torch.where(active, new, torch.zeros_like(new))
        complete = active & (new >= self.lengths[self.sent][:, None, :])  # (rows, W, A)
        met = self.met[:, None, :].expand(-1, token.size(1), -1).clone()  # (rows, W, G)
        group = self.group[self.sent][:, None, :].expand_as(new)
        met.scatter_reduce_(2, group, complete.to(met.dtype), "amax")
        new = torch.where(met.gather(2, group), torch.zeros_like(new), new)  # a met group's alternatives stop counting
        return new, met

    def progress(self, token: Tensor) -> Tensor:
        """(rows, W) the level of progress after each candidate token (rows, W): the tokens of the
        met groups (each its longest form) plus the furthest any unmet alternative has come. (Not
        the sum over unmet ones: a token that advances one alternative may restart another, and
        the level must rise whenever the furthest one advances, or the search can circle.)"""
        new, met = self._after(token)
        size = self.group_size[self.sent][:, None, :]  # (rows, 1, G)
        return torch.where(met & self.exists[self.sent][:, None, :], size, torch.zeros_like(size)).sum(2) + new.amax(2)

    def advance(self, token: Tensor) -> None:
        """Rows take their next token (rows,)."""
        new, met = self._after(token[:, None])
        self.progress_of, self.met = new[:, 0], met[:, 0]


def stripes(scores: Tensor, banks: Tensor, totals: Tensor) -> Tensor:
    """Dynamic beam allocation's order of candidates: (b, N) scores, their progress (b, N) and each
    sentence's full progress (b,) -> an order key (b, N), lower first: the best candidate of every
    progress level (highest level first), then the second best of every level, ... Impossible
    candidates (score -inf) come last."""
    levels = int(totals.max()) + 1
    order = scores.argsort(dim=1, descending=True, stable=True)  # (b, N)
    sorted_banks = banks.gather(1, order)
    onehot = torch.nn.functional.one_hot(sorted_banks, levels)  # (b, N, levels)
    rank_sorted = (onehot.cumsum(1) * onehot).sum(2) - 1  # rank of each candidate within its level
    rank = torch.empty_like(rank_sorted).scatter_(1, order, rank_sorted)
    key = rank * (totals[:, None] + 1) + (totals[:, None] - banks)
    return torch.where(torch.isfinite(scores), key, torch.full_like(key, torch.iinfo(torch.long).max))


def satisfied(tokens: Sequence[int], groups: SentenceConstraints) -> bool:
    """Does a finished output contain one alternative of every group (as a contiguous run)?"""
    def contains(seq: Sequence[int], part: Sequence[int]) -> bool:
        n = len(part)
        return any(list(seq[i: i + n]) == list(part) for i in range(len(seq) - n + 1))

    return all(any(contains(tokens, alt) for alt in group if alt) for group in groups if any(group))
