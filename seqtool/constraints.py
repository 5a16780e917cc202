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
any other token restarts it (at 1 if the token is its first, else at 0); a complete alternative
is met at the next word boundary (WordPieces). Like fairseq, this does not backtrack into
overlapping partial matches (a phrase "a a b" after "a a a b" is missed while in progress, and
found if the search places it again).

Rows follow the cache's contract: `select(index)` keeps row index[i] as row i (beam search calls
it with each survivor's parent, and with fewer rows when sentences finish).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor

# per sentence: groups, each a list of alternatives, each a list of token ids
SentenceConstraints = Sequence[Sequence[Sequence[int]]]


@dataclass(frozen=True)
class WordPieces:
    """What the vocabulary's pieces say about word boundaries (from the tokenizer; None in search:
    every token is a boundary). continues (V,): the piece goes on the word before it (no leading
    "▁", a letter, digit or "_" first, as a regular expression's word character); opens (V,): the piece ends with none of these, so a piece that
    continues may follow it without gluing words together ("(" then "he av ens")."""

    continues: Tensor
    opens: Tensor

    @classmethod
    def of(cls, pieces: Sequence[str], device: torch.device) -> "WordPieces":
        def word(ch: str) -> bool:  # a regular expression's \w: letters, digits and "_"
            return ch.isalnum() or ch == "_"

        cont = [not p.startswith("\u2581") and word(p[:1]) and not p.startswith("<") for p in pieces]
        opens = [bool(p) and not word(p[-1]) and not p.startswith("<") for p in pieces]
        return cls(torch.tensor(cont, device=device), torch.tensor(opens, device=device))


class ConstraintState:
    """The batch's constraints (B sentences) and, per decoder row, each alternative's progress,
    how often each group has been met, and the row's last token.

    An alternative of L tokens has progress 0..L; at L it waits for a word boundary: the next
    token must not continue the word (else "understand" would be met by "understands"), EOS
    included. It counts L + 1 tokens of progress, so placing its boundary is progress too. An
    alternative whose first piece continues a word (a phrase as written after a bracket) may only
    start after a piece that opens (else it would glue onto the word before).

    A constraint appears exactly once: once its group is met, the token that would complete one of
    its alternatives again is banned (unless an unmet constraint wants it). A constraint given n
    times is one group needed n times."""

    def __init__(self, constraints: Sequence[SentenceConstraints], device: torch.device, pieces: Optional[WordPieces] = None,
                 bos: int = 0):
        B = len(constraints)
        merged = [_merge(groups) for groups in constraints]  # per sentence: [(alternatives, times needed)]
        flat = [[(g, alt) for g, (group, _) in enumerate(groups) for alt in group] for groups in merged]
        A = max([len(f) for f in flat] + [1])
        G = max([len(groups) for groups in merged] + [1])
        T = max([len(alt) for f in flat for _, alt in f] + [1])
        self.tokens = torch.full((B, A, T), -1, dtype=torch.long)  # alternative a's tokens, -1 after its end
        self.lengths = torch.zeros(B, A, dtype=torch.long)  # 0: no alternative there
        self.group = torch.zeros(B, A, dtype=torch.long)  # the group of each alternative
        self.group_size = torch.zeros(B, G, dtype=torch.long)  # progress one occurrence counts: its longest alternative + 1
        self.need = torch.zeros(B, G, dtype=torch.long)  # occurrences a group needs (0: no group there)
        for b, f in enumerate(flat):
            for a, (g, alt) in enumerate(f):
                self.tokens[b, a, : len(alt)] = torch.tensor(alt)
                self.lengths[b, a] = len(alt)
                self.group[b, a] = g
                self.group_size[b, g] = max(int(self.group_size[b, g]), len(alt) + 1)
            for g, (_, times) in enumerate(merged[b]):
                self.need[b, g] = times
        self.tokens, self.lengths, self.group, self.group_size, self.need = (
            t.to(device) for t in (self.tokens, self.lengths, self.group, self.group_size, self.need))
        self.pieces = pieces
        if pieces is not None:  # alternatives that must start after an opening piece
            self.glued = pieces.continues[self.tokens[:, :, 0].clamp(min=0)] & (self.lengths > 0)
        else:
            self.glued = torch.zeros_like(self.lengths, dtype=torch.bool)
        self.total = (self.group_size * self.need).sum(1)  # (B,) progress when every group is met
        self.sent = torch.arange(B, device=device)  # (rows,) each row's sentence
        self.progress_of = torch.zeros(B, A, dtype=torch.long, device=device)  # (rows, A), met groups' too
        self.count = torch.zeros(B, G, dtype=torch.long, device=device)  # (rows, G) occurrences so far
        self.last = torch.full((B,), bos, dtype=torch.long, device=device)  # (rows,) each row's last token

    # ---- rows ----------------------------------------------------------------------------------
    def select(self, index: Tensor) -> None:
        """Row index[i] becomes row i (the cache's reorder contract)."""
        self.sent, self.progress_of, self.count, self.last = (self.sent[index], self.progress_of[index], self.count[index],
                                                              self.last[index])

    @property
    def met(self) -> Tensor:
        """(rows, G) groups met as often as needed (a group that does not exist needs 0)."""
        return self.count >= self.need[self.sent]

    def ready(self) -> Tensor:
        """(rows,) every group met, or short of one last occurrence that waits only for a word
        boundary (which EOS gives)."""
        lengths = self.lengths[self.sent]
        pending = self._active() & (self.progress_of == lengths)  # (rows, A)
        waiting = torch.zeros_like(self.count, dtype=torch.bool).scatter_reduce_(1, self.group[self.sent], pending, "amax")
        return (self.met | (waiting & (self.need[self.sent] - self.count == 1))).all(1)

    # ---- what the next token does ------------------------------------------------------------------
    def _active(self) -> Tensor:
        """(rows, A) alternatives that exist and whose group is not yet met."""
        return (self.lengths[self.sent] > 0) & ~self.met.gather(1, self.group[self.sent])

    def _may_start(self) -> Tensor:
        """(rows, A) an alternative may start with the next token (a glued one only after an opening piece)."""
        if self.pieces is None:
            return torch.ones_like(self.glued[self.sent])
        return ~self.glued[self.sent] | self.pieces.opens[self.last][:, None]

    def _next(self) -> Tensor:
        """(rows, A) each alternative's next token at its progress (its last one when complete)."""
        toks = self.tokens[self.sent]
        return toks.gather(2, self.progress_of.clamp(max=toks.size(2) - 1)[:, :, None]).squeeze(2)

    def wanted(self) -> Tensor:
        """(rows, A) the token that advances each active alternative (its next one), else -1 (none,
        or it waits for a boundary)."""
        p = self.progress_of
        ok = self._active() & (p < self.lengths[self.sent]) & ((p > 0) | self._may_start())
        return torch.where(ok, self._next(), torch.full_like(p, -1))

    def banned(self) -> Tensor:
        """(rows, A) the token that would complete an alternative of a met group once more, else -1;
        never one that an unmet constraint wants next. A group whose last needed occurrence only
        waits for its word boundary counts as met here: the token after it must not start a repeat."""
        p, lengths = self.progress_of, self.lengths[self.sent]
        group = self.group[self.sent]
        pending = self._active() & (p == lengths)
        waiting = torch.zeros_like(self.count).scatter_reduce_(1, group, pending.long(), "amax")
        done = (self.count + waiting >= self.need[self.sent]).gather(1, group) & (lengths > 0)
        last = self.tokens[self.sent].gather(2, (lengths - 1).clamp(min=0)[:, :, None]).squeeze(2)
        again = done & (((lengths == 1) & self._may_start()) | ((lengths > 1) & (p == lengths - 1)))
        ban = torch.where(again, last, torch.full_like(p, -1))
        needed = (ban[:, :, None] == self.wanted()[:, None, :]).any(2)
        return torch.where(needed, torch.full_like(ban, -1), ban)

    def _after(self, token: Tensor) -> tuple[Tensor, Tensor]:
        """Progress (rows, W, A) and occurrences (rows, W, G) after each of W candidate tokens (rows, W)."""
        toks = self.tokens[self.sent]  # (rows, A, T)
        lengths = self.lengths[self.sent][:, None, :]  # (rows, 1, A)
        p = self.progress_of[:, None, :]
        t = token[:, :, None]  # (rows, W, 1)
        boundary = ~self.pieces.continues[token][:, :, None] if self.pieces is not None else torch.ones_like(t, dtype=torch.bool)
        complete = self._active()[:, None, :] & (p == lengths) & boundary  # (rows, W, A)
        may_start = self._may_start()[:, None, :]
        advance = (p < lengths) & (t == self._next()[:, None, :]) & ((p > 0) | may_start)
        start = (t == toks[:, None, :, 0]) & may_start  # a restart at this token
        new = torch.where(advance, p + 1, start.long()) * (lengths > 0)
        group = self.group[self.sent][:, None, :].expand_as(new)
        once = torch.zeros(*new.shape[:2], self.count.size(1), dtype=torch.long, device=new.device)
        once.scatter_reduce_(2, group, complete.long(), "amax")  # one occurrence per group and token
        return new, self.count[:, None, :] + once

    def progress(self, token: Tensor) -> Tensor:
        """(rows, W) the level of progress after each candidate token (rows, W): the occurrences met
        (each its group's size) plus the furthest any alternative of an unmet group has come. (Not a
        sum over unmet ones: a token that advances one alternative may restart another, and the
        level must rise whenever the furthest one advances, or the search could circle.)"""
        new, count = self._after(token)
        need = self.need[self.sent][:, None, :]
        size = self.group_size[self.sent][:, None, :]
        unmet = (count < need).gather(2, self.group[self.sent][:, None, :].expand_as(new))
        return (torch.minimum(count, need) * size).sum(2) + (new * unmet).amax(2)

    def advance(self, token: Tensor) -> None:
        """Rows take their next token (rows,)."""
        new, count = self._after(token[:, None])
        self.progress_of, self.count, self.last = new[:, 0], count[:, 0], token


def _merge(groups: SentenceConstraints) -> list[tuple[list[list[int]], int]]:
    """A sentence's groups with identical ones merged: (alternatives, times needed)."""
    out: list[tuple[list[list[int]], int]] = []
    keys: list[tuple] = []
    for group in groups:
        alternatives = [list(a) for a in group if a]
        if not alternatives:
            continue
        key = tuple(sorted({tuple(a) for a in alternatives}))
        if key in keys:
            i = keys.index(key)
            out[i] = (out[i][0], out[i][1] + 1)
        else:
            keys.append(key)
            out.append((alternatives, 1))
    return out


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
