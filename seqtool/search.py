"""Greedy and beam search over token ids.

Owns decoding on tensors only (no text, no I/O). Works with any model that offers
``encode(src) -> (memory, src_pad)``, ``new_cache(memory, src_pad)``,
``decode(tokens, memory, src_pad, cache) -> logits`` and a ``config`` with bos/eos/pad ids and
max_positions, so tests can script the probabilities with a fake model.

Beam search follows fairseq's rules: 2 x beam candidates per step so finished hypotheses never
starve the beam; an EOS candidate among the best `beam` is finished with score
sum(log p) / length^lenpen (length counts the EOS); a sentence stops when it has `beam` finished
hypotheses or reaches its maximum length (a*source + b, EOS forced). Every step is batched over
sentences and beams; finished sentences leave the batch so later steps get cheaper.
"""

from __future__ import annotations

from dataclasses import dataclass
import torch
from torch import Tensor

NEG_INF = float("-inf")


@dataclass
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    score: float  # length-normalised log-probability, as used for ranking


def _max_lengths(src_pad: Tensor, max_len_a: float, max_len_b: int, max_positions: int) -> Tensor:
    src_len = (~src_pad).sum(1)  # (B,) incl. EOS
    limit = (max_len_a * src_len.double() + max_len_b).long()
    return limit.clamp(min=1, max=max_positions - 1)  # the BOS takes one position


def _step_lprobs(model, tokens: Tensor, cache, step: int, max_len: Tensor, min_len: int) -> Tensor:
    """Log-probabilities of the next token (rows, V) with bans and forced EOS applied."""
    c = model.config
    logits = model.decode(tokens, None, None, cache)[:, -1]  # (rows, V)
    lprobs = logits.float().log_softmax(dim=-1)
    lprobs[:, c.pad_id] = NEG_INF
    lprobs[:, c.bos_id] = NEG_INF
    if step < min_len:
        lprobs[:, c.eos_id] = NEG_INF
    at_limit = max_len <= step  # (rows,) only EOS may follow
    if bool(at_limit.any()):
        eos = lprobs[:, c.eos_id].clone()
        lprobs[at_limit] = NEG_INF
        lprobs[at_limit, c.eos_id] = torch.where(torch.isfinite(eos[at_limit]), eos[at_limit], torch.zeros_like(eos[at_limit]))
    return lprobs


@torch.no_grad()
def greedy_search(model, src: Tensor, max_len_a: float = 0.0, max_len_b: int = 200, lenpen: float = 1.0,
                  min_len: int = 1) -> list[list[Hypothesis]]:
    """The most probable token at every step; one hypothesis per sentence."""
    c = model.config
    B = src.size(0)
    memory, src_pad = model.encode(src)
    cache = model.new_cache(memory, src_pad)
    max_len = _max_lengths(src_pad, max_len_a, max_len_b, c.max_positions)  # (B,)
    L = int(max_len.max()) + 1
    alive = torch.arange(B, device=src.device)  # original sentence of each row
    last = torch.full((B, 1), c.bos_id, dtype=torch.long, device=src.device)
    out = torch.full((B, L), c.pad_id, dtype=torch.long, device=src.device)
    score = torch.zeros(B, device=src.device)
    lengths = torch.zeros(B, dtype=torch.long, device=src.device)
    for step in range(L):
        lprobs = _step_lprobs(model, last, cache, step, max_len[alive], min_len)
        best, token = lprobs.max(dim=-1)  # (rows,)
        score[alive] += best
        out[alive, step] = token
        ended = token.eq(c.eos_id)
        if bool(ended.any()):
            lengths[alive[ended]] = step + 1
            keep = (~ended).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            alive = alive[keep]
            cache.reorder(keep)
            token = token[keep]
        last = token[:, None]
    result = []
    for b, (row, n, s) in enumerate(zip(out.tolist(), lengths.tolist(), score.tolist())):
        result.append([Hypothesis(row[: n - 1], s / (n ** lenpen))])
    return result


@torch.no_grad()
def beam_search(model, src: Tensor, beam: int = 5, max_len_a: float = 0.0, max_len_b: int = 200,
                lenpen: float = 1.0, nbest: int = 1, min_len: int = 1) -> list[list[Hypothesis]]:
    """The `nbest` best hypotheses per sentence, best first."""
    c = model.config
    B, K = src.size(0), beam
    device = src.device
    memory, src_pad = model.encode(src)
    max_len0 = _max_lengths(src_pad, max_len_a, max_len_b, c.max_positions)  # (B,)
    L = int(max_len0.max()) + 1  # generated tokens incl. EOS
    cache = model.new_cache(memory, src_pad)  # cross-attention K/V projected once per sentence...
    cache.reorder(torch.arange(B, device=device).repeat_interleave(K))  # ...then one row per beam, adjacent
    alive = torch.arange(B, device=device)  # original index of each active sentence
    tokens = torch.full((B * K, 1), c.bos_id, dtype=torch.long, device=device)  # (b*K, 1+t)
    scores = torch.full((B, K), NEG_INF, device=device)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first at step 0
    # Finished hypotheses per original sentence: normalised score and tokens (BOS ... EOS, padded).
    fin_scores = torch.full((B, K), NEG_INF, device=device)
    fin_tokens = torch.full((B, K, L + 1), c.pad_id, dtype=torch.long, device=device)
    fin_count = torch.zeros(B, dtype=torch.long, device=device)
    for step in range(L):
        b = alive.numel()
        lprobs = _step_lprobs(model, tokens[:, -1:], cache, step, max_len0[alive].repeat_interleave(K), min_len)
        V = lprobs.size(1)
        cand = scores[:, :, None] + lprobs.view(b, K, V)  # (b, K, V)
        n_cand = min(2 * K, K * V)
        top_scores, top_index = cand.view(b, -1).topk(n_cand, dim=1)  # (b, 2K) best first
        parent = top_index // V  # (b, 2K) beam within the sentence
        token = top_index % V
        is_eos = token.eq(c.eos_id) & torch.isfinite(top_scores)

        # 1. EOS among the best K candidates: finished, merged into the sentence's best K.
        finishing = is_eos.clone()
        finishing[:, K:] = False
        if bool(finishing.any()):
            norm = torch.where(finishing, top_scores / float(step + 1) ** lenpen, torch.full_like(top_scores, NEG_INF))
            src_rows = (torch.arange(b, device=device)[:, None] * K + parent).view(-1)  # (b*2K,)
            seqs = torch.full((b, n_cand, L + 1), c.pad_id, dtype=torch.long, device=device)
            seqs[:, :, : step + 1] = tokens[src_rows].view(b, n_cand, step + 1)
            seqs[:, :, step + 1] = c.eos_id
            merged_scores = torch.cat([fin_scores[alive], norm], dim=1)  # (b, K + 2K)
            merged_tokens = torch.cat([fin_tokens[alive], seqs], dim=1)
            best, pick = merged_scores.topk(K, dim=1)
            fin_scores[alive] = best
            fin_tokens[alive] = merged_tokens.gather(1, pick[:, :, None].expand(-1, -1, L + 1))
            fin_count[alive] += finishing.sum(1)

        # 2. The best K candidates that are not EOS continue.
        cont = torch.where(token.eq(c.eos_id), torch.full_like(top_scores, NEG_INF), top_scores)
        scores, pick = cont.topk(K, dim=1)  # (b, K)
        parent_rows = (torch.arange(b, device=device)[:, None] * K + parent.gather(1, pick)).view(-1)  # (b*K,)
        next_token = token.gather(1, pick).view(-1, 1)

        # 3. Sentences with K finished hypotheses (or at their length limit) leave the batch.
        done = (fin_count[alive] >= K) | (max_len0[alive] <= step)
        if bool(done.all()):
            break
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(1)
            alive = alive[keep]
            scores = scores[keep]
            parent_rows = parent_rows.view(b, K)[keep].view(-1)
            next_token = next_token.view(b, K)[keep].view(-1, 1)
            cache.reorder(parent_rows, cross=True)
        else:
            cache.reorder(parent_rows, cross=False)  # cross K/V are equal across a sentence's beams
        tokens = torch.cat([tokens[parent_rows], next_token], dim=1)

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


def search(model, src: Tensor, beam: int, max_len_a: float, max_len_b: int, lenpen: float, nbest: int = 1,
           min_len: int = 1) -> list[list[Hypothesis]]:
    if beam == 1:
        return greedy_search(model, src, max_len_a, max_len_b, lenpen, min_len)
    return beam_search(model, src, beam, max_len_a, max_len_b, lenpen, nbest, min_len)

