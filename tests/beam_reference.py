"""The reference for beam search's candidate choice: beam_search as it was before candidate choice
moved behind an object (Candidates, ConstrainedCandidates), kept verbatim (seqtool/search.py at
f56b95d, lines 252-420) so that tests compare today's search with it on random inputs, bit for bit;
with its helpers of its own, so that it checks them too rather than reusing them."""

from typing import Callable, Optional

import torch
from torch import Tensor

from seqtool.constraints import ConstraintState, WordPieces, stripes
from seqtool.steps import Hypothesis  # (the result record; every helper the search uses is written out below)

# The reference's own helpers, written plainly, not imported from the search they check: the output
# cap, the bans of a step, the prefix pass and torch.topk in place of search.top_k's two-pass selection.
NEG_INF = float("-inf")
UNMET = 1e6  # subtracted from the rank of a finished output that lacks a constraint
Wanted = Callable[[], Optional[Tensor]]


def _max_lengths(src_pad: Tensor, max_len_a: float, max_len_b: int, max_positions: int, max_len: int = 0) -> Tensor:
    limit = (max_len_a * (~src_pad).sum(1).double() + max_len_b).long()  # (B,) a * length incl. EOS + b
    return limit.clamp(min=1, max=min(max_positions - 1, max_len or max_positions))  # the BOS takes one position


def _banned(c, lprobs: Tensor, step: int, max_len: Tensor, min_len: int) -> Tensor:
    lprobs[:, [c.pad_id, c.bos_id]] = NEG_INF
    if c.language_tags:
        lprobs[:, c.vocab_size - c.language_tags:] = NEG_INF
    if step < min_len:
        lprobs[:, c.eos_id] = NEG_INF
    for row in (max_len <= step).nonzero().flatten().tolist():  # at its cap a row may only end
        eos = lprobs[row, c.eos_id].item()
        lprobs[row] = NEG_INF
        lprobs[row, c.eos_id] = eos if eos != NEG_INF else 0.0
    return lprobs


def _step_lprobs(model, tokens: Tensor, cache, step: int, max_len: Tensor, min_len: int) -> Tensor:
    return _banned(model.config, model.decode(tokens, None, None, cache)[:, -1].float().log_softmax(-1), step, max_len, min_len)


def _prefix_pass(model, tokens: Tensor, cache, max_len: Tensor, min_len: int) -> tuple[Tensor, Tensor]:
    P = tokens.size(1) - 1
    lprobs = model.decode(tokens, None, None, cache).float().log_softmax(dim=-1)  # (rows, 1 + P, V)
    prefix_lp = lprobs[:, :P].gather(2, tokens[:, 1:, None]).squeeze(2).sum(1)  # (rows,)
    return prefix_lp, _banned(model.config, lprobs[:, P], P, max_len, min_len)


def top_k(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    return x.topk(k, dim=1)


@torch.no_grad()
def beam_search(model, src: Tensor, beam: int = 5, max_len_a: float = 0.0, max_len_b: int = 200,
                lenpen: float = 1.0, nbest: int = 1, min_len: int = 1, prefix: Optional[Tensor] = None,
                constraints: Optional[ConstraintState] = None, wanted: Optional[Wanted] = None,
                max_len: int = 0) -> list[list[Hypothesis]]:
    """The `nbest` best hypotheses per sentence, best first. prefix (B, P): every hypothesis starts
    with these P tokens (decoded in one pass, their log-probabilities part of the score and the
    length part of the normalisation); the search starts after them. constraints: phrases every
    hypothesis must contain (constraints.py: dynamic beam allocation; EOS waits for them)."""
    c = model.config
    B, K = src.size(0), beam
    device = src.device
    memory, src_pad = model.encode(src)
    max_len0 = _max_lengths(src_pad, max_len_a, max_len_b, c.max_positions, max_len)  # (B,)
    P = 0 if prefix is None else prefix.size(1)
    L = max(int(max_len0.max()), P) + 1  # output tokens incl. the prefix and EOS
    # Every beam starts from the same BOS: step 0 decodes one row per sentence (rows = 1), whose
    # best candidates then become the K beams (rows = K, adjacent; cross-attention K/V kept once
    # per sentence).
    cache = model.new_cache(memory, src_pad, group=1)
    rows = 1
    alive = torch.arange(B, device=device)  # original index of each active sentence
    tokens = torch.full((B, 1), c.bos_id, dtype=torch.long, device=device)  # (b*rows, 1+t)
    scores = torch.zeros(B, 1, device=device)  # (b, rows)
    first = None
    if P:  # the prefix in one decoder call; the search goes on from step P
        tokens = torch.cat([tokens, prefix], dim=1)  # (B, 1 + P)
        prefix_lp, first = _prefix_pass(model, tokens, cache, max_len0, min_len)
        scores = prefix_lp[:, None]
        if constraints is not None:  # the prefix may already place constraint tokens
            for j in range(P):
                constraints.advance(prefix[:, j])
    # Finished hypotheses per original sentence: normalised score and tokens (BOS ... EOS, padded).
    fin_scores = torch.full((B, K), NEG_INF, device=device)
    fin_rank = torch.full((B, K), NEG_INF, device=device)  # what ranks them: the score, less UNMET if a constraint is missing
    fin_tokens = torch.full((B, K, L + 1), c.pad_id, dtype=torch.long, device=device)
    fin_count = torch.zeros(B, dtype=torch.long, device=device)
    met_finished = torch.zeros(B, dtype=torch.long, device=device)  # constrained: outputs with every constraint finished
    for step in range(P, L):
        b = alive.numel()
        if step == P and first is not None:
            lprobs = first
        else:
            lprobs = _step_lprobs(model, tokens[:, -1:], cache, step, max_len0[alive].repeat_interleave(rows), min_len)
        if constraints is not None:  # no EOS before every constraint is met (unless at the limit)
            waiting = ~constraints.ready() & (max_len0[alive].repeat_interleave(rows) > step)
            lprobs[:, c.eos_id] = torch.where(waiting, torch.full_like(lprobs[:, c.eos_id], NEG_INF), lprobs[:, c.eos_id])
            ban = constraints.banned()  # (rows, A) what would repeat a met constraint
            hit = ban >= 0
            if bool(hit.any()):
                lprobs[torch.arange(ban.size(0), device=device)[:, None].expand_as(ban)[hit], ban[hit]] = NEG_INF
        full = lprobs
        # Each row's best 2K tokens hold the sentence's best 2K candidates (no row gives more), so
        # the sentence ranks rows x 2K candidates, not rows x V.
        lprobs, row_token = top_k(lprobs, min(2 * K, lprobs.size(1)))  # (b*rows, W)
        if constraints is not None:  # ... and each row may also take the next token of each unmet constraint
            lprobs, row_token = _with_wanted(full, lprobs, row_token, constraints.wanted(), constraints.pieces, c.eos_id)
        W = lprobs.size(1)
        cand = scores[:, :, None] + lprobs.view(b, rows, W)  # (b, rows, W)
        n_cand = min(2 * K, rows * W)
        if constraints is None:  # the best 2K; equal scores in candidate order (as constrained search breaks ties)
            top_index = cand.view(b, -1).argsort(dim=1, descending=True, stable=True)[:, :n_cand]  # (b, 2K) best first
        else:  # dynamic beam allocation: the first 2K in stripes over the levels of progress
            banks = constraints.progress(row_token).view(b, rows * W)
            full_met = banks == constraints.total[alive][:, None]  # (b, rows*W)
            # once an output with every constraint has finished, only such outputs go on: the search
            # is then plain beam search among them and ends as it does (else the levels below keep
            # the sentence going, and at the length limit long repetitive outputs win on their average)
            cand = torch.where((met_finished[alive] > 0)[:, None] & ~full_met, torch.full_like(cand.view(b, -1), NEG_INF),
                               cand.view(b, -1)).view(b, rows, W)
            top_index = stripes(cand.view(b, -1), banks, constraints.total[alive]).topk(n_cand, dim=1, largest=False).indices
        top_scores = cand.view(b, -1).gather(1, top_index)
        # which continue: the first K that are not EOS, in this order
        priority = torch.where(torch.isfinite(top_scores), -torch.arange(n_cand, device=device, dtype=top_scores.dtype),
                               torch.full_like(top_scores, NEG_INF))
        if n_cand < K:  # a vocabulary smaller than the beam: the missing candidates are impossible ones
            top_scores = torch.cat([top_scores, top_scores.new_full((b, K - n_cand), NEG_INF)], dim=1)
            priority = torch.cat([priority, priority.new_full((b, K - n_cand), NEG_INF)], dim=1)
            top_index = torch.cat([top_index, top_index.new_zeros(b, K - n_cand)], dim=1)
            n_cand = K
        parent = top_index // W  # (b, 2K) row within the sentence
        token = row_token.view(b, rows * W).gather(1, top_index)
        is_eos = token.eq(c.eos_id) & torch.isfinite(top_scores)

        # 1. EOS among the best K candidates: finished, merged into the sentence's best K.
        finishing = is_eos.clone()
        finishing[:, K:] = False
        if bool(finishing.any()):
            norm = torch.where(finishing, top_scores / float(step + 1) ** lenpen, torch.full_like(top_scores, NEG_INF))
            src_rows = (torch.arange(b, device=device)[:, None] * rows + parent).view(-1)  # (b*2K,)
            seqs = torch.full((b, n_cand, L + 1), c.pad_id, dtype=torch.long, device=device)
            seqs[:, :, : step + 1] = tokens[src_rows].view(b, n_cand, step + 1)
            seqs[:, :, step + 1] = c.eos_id
            rank = norm
            if constraints is not None:  # at the length limit an output may lack a constraint: it ranks below all that have them
                missing = ~full_met.gather(1, top_index)
                met_finished[alive] += (finishing & ~missing).sum(1)
                rank = torch.where(missing, norm - UNMET, norm)
            merged_scores = torch.cat([fin_scores[alive], norm], dim=1)  # (b, K + 2K)
            merged_tokens = torch.cat([fin_tokens[alive], seqs], dim=1)
            best, pick = torch.cat([fin_rank[alive], rank], dim=1).topk(K, dim=1)
            fin_rank[alive] = best
            fin_scores[alive] = merged_scores.gather(1, pick)
            fin_tokens[alive] = merged_tokens.gather(1, pick[:, :, None].expand(-1, -1, L + 1))
            fin_count[alive] += finishing.sum(1)

        # 2. The best K candidates that are not EOS continue (constrained: the first K in stripe order).
        eos = token.eq(c.eos_id)
        _, pick = torch.where(eos, torch.full_like(priority, NEG_INF), priority).topk(K, dim=1)  # (b, K)
        scores = torch.where(eos, torch.full_like(top_scores, NEG_INF), top_scores).gather(1, pick)
        parent_rows = (torch.arange(b, device=device)[:, None] * rows + parent.gather(1, pick)).view(-1)  # (b*K,)
        next_token = token.gather(1, pick).view(-1, 1)

        # 3. Sentences with K finished hypotheses (or at their length limit) leave the batch
        # (constrained: once the n-best outputs with every constraint have finished. Longer searches
        # only find longer outputs that win on their average: 600 bible lines, beam 5, BLEU 20.10
        # stopping at the first, 19.21 at the second, 18.05 after beam-many; unconstrained 18.67)
        done = (fin_count[alive] >= K) | (max_len0[alive] <= step) | ~torch.isfinite(scores).any(1)
        if constraints is not None:
            done |= met_finished[alive] >= nbest
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
        tokens = torch.cat([tokens[parent_rows], next_token], dim=1)
        if constraints is not None:
            constraints.select(parent_rows)
            constraints.advance(next_token.view(-1))
        rows = K

    out_scores = fin_scores[:, :nbest].tolist()
    out_tokens = fin_tokens[:, :nbest].tolist()
    result: list[list[Hypothesis]] = []
    for sent_scores, sent_tokens in zip(out_scores, out_tokens):
        hyps = []
        for s, seq in zip(sent_scores, sent_tokens):
            if s == NEG_INF:
                continue
            end = seq.index(c.eos_id, 1)
            hyps.append(Hypothesis(seq[1:end], s))
        result.append(hyps)
    return result


def _with_wanted(full: Tensor, lprobs: Tensor, row_token: Tensor, wanted: Tensor, pieces: Optional[WordPieces],
                 eos: int) -> tuple[Tensor, Tensor]:
    """Each row's candidates (rows, W) extended by the tokens its constraints want next (rows, A; -1
    none) and, with word pieces, by its best token that ends a word (not EOS), so a complete
    constraint always has a boundary to take; log-probabilities from `full` (rows, V). One already
    among the row's candidates, or there twice, is an impossible (-inf) extra."""
    extra = wanted
    if pieces is not None:
        free = full.masked_fill(pieces.continues, NEG_INF)
        free[:, eos] = NEG_INF
        extra = torch.cat([wanted, free.argmax(dim=1, keepdim=True)], dim=1)  # (rows, A + 1)
    repeat = (extra[:, :, None] == extra[:, None, :]).tril(-1).any(2)  # an earlier one is the same
    dup = (extra[:, :, None] == row_token[:, None, :]).any(2) | repeat | (extra < 0)
    ids = extra.clamp(min=0)
    add = full.gather(1, ids).masked_fill(dup, NEG_INF)
    return torch.cat([lprobs, add], dim=1), torch.cat([row_token, ids], dim=1)
