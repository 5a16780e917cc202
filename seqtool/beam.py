"""Beam search (fairseq's rules; search.py says them), its candidate choice behind an object as
fairseq's Search is: Candidates ranks a step's candidates by score, ConstrainedCandidates runs
lexical constraints (constraints.py: dynamic beam allocation), and the loop calls either the same way."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .constraints import ConstraintState, stripes
from .steps import (_OPTIONS, NEG_INF, UNMET, Hypothesis, RepeatBans, Wanted, _cut, _max_lengths, _prefix_pass, _recording,
                    _step_lprobs, top_k)

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
def beam_search(model, src: Tensor, beam: int = _OPTIONS.beam, max_len_a: float = _OPTIONS.max_len_a, max_len_b: int = _OPTIONS.max_len_b,
                lenpen: float = _OPTIONS.lenpen, nbest: int = _OPTIONS.nbest, min_len: int = _OPTIONS.min_len, prefix: Optional[Tensor] = None,
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
