"""Sampling: what may be drawn (top-k, nucleus, temperature), its limits (greedy), and reproducibility."""

import math

import pytest
import torch

from seqtool.config import model_config_for
from seqtool.model import Transformer
from seqtool.reference_score import reference_logprobs
from seqtool.search import Sampling, SearchOptions, draw, greedy_search, sample, search, uniforms
from test_search import EOS, NO_EOS, PAD, A, B, ScriptedModel

pytestmark = pytest.mark.unit

UNK = 1  # an ordinary token as far as search is concerned


@pytest.fixture(scope="module")
def real_model():
    torch.manual_seed(3)
    model = Transformer(model_config_for("tiny", vocab_size=50, dropout=0.0)).eval()
    with torch.no_grad():
        model.embed.weight.mul_(3.0)  # sharper distributions: hypotheses of different lengths
    return model


def _sources(n, length=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 50, (n, length), generator=g)
    src[:, -1] = EOS
    src[1 % n, 4:] = PAD  # one shorter sentence
    src[1 % n, 3] = EOS
    return src


def _grid(n):
    return (torch.arange(n, dtype=torch.float64) + 0.5) / n  # evenly spaced numbers in (0, 1)


# ---- draw(): exact distributions, by feeding evenly spaced numbers instead of random ones --------

def _frequencies(lprobs_row, **options):
    n = 20000
    tokens = draw(lprobs_row.expand(n, -1), _grid(n), **options)
    return torch.bincount(tokens, minlength=lprobs_row.size(-1)).double() / n


def test_draw_follows_the_tempered_distribution():
    lp = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    for temperature in (1.0, 0.5, 2.0):
        expected = (lp / temperature).softmax(-1)[0].double()
        assert torch.allclose(_frequencies(lp, temperature=temperature), expected, atol=1e-3)


def test_draw_keeps_only_the_top_k_and_the_nucleus():
    lp = torch.tensor([[0.05, 0.5, 0.15, 0.3]]).log()
    top2 = _frequencies(lp, topk=2)
    assert torch.allclose(top2, torch.tensor([0, 0.5 / 0.8, 0, 0.3 / 0.8], dtype=torch.float64), atol=1e-3)
    # nucleus 0.7: 0.5 then 0.3 reaches it; 0.15 and 0.05 are outside
    nucleus = _frequencies(lp, topp=0.7)
    assert torch.allclose(nucleus, torch.tensor([0, 0.5 / 0.8, 0, 0.3 / 0.8], dtype=torch.float64), atol=1e-3)
    assert _frequencies(lp, topp=1e-9).tolist() == [0.0, 1.0, 0.0, 0.0]  # only the best token
    assert _frequencies(lp, topk=1).tolist() == [0.0, 1.0, 0.0, 0.0]


def test_draw_never_picks_a_banned_token_even_at_the_ends_of_the_unit_interval():
    lp = torch.tensor([[float("-inf"), 0.0, float("-inf"), float("-inf")]])  # only token 1 allowed
    u = torch.tensor([0.0, 1e-300, 0.5, 1 - 2 ** -53], dtype=torch.float64)
    assert draw(lp.expand(4, -1), u).tolist() == [1, 1, 1, 1]
    lp = torch.tensor([[0.0, float("-inf"), math.log(1e-30), float("-inf")]])
    assert set(draw(lp.expand(4, -1), u).tolist()) <= {0, 2}


def test_uniform_numbers_depend_on_their_coordinates_only():
    keys = torch.tensor([5, 6, 5, 2 ** 40])
    copies = torch.tensor([0, 0, 1, 0])
    u = uniforms(7, keys, copies, 3)
    assert ((u >= 0) & (u < 1)).all()
    assert len(set(u.tolist())) == 4  # different key, copy: different number
    assert uniforms(7, keys[2:3], copies[2:3], 3).item() == u[2].item()  # alone or in a batch
    assert uniforms(8, keys, copies, 3).tolist() != u.tolist()
    assert uniforms(7, keys, copies, 4).tolist() != u.tolist()
    many = uniforms(1, torch.arange(20000), torch.zeros(20000, dtype=torch.long), 0)
    assert abs(many.mean().item() - 0.5) < 0.01 and many.min() < 0.001 and many.max() > 0.999


# ---- sampling with a scripted model: what can come out ----------------------------------------

FLAT = {UNK: 0.1, EOS: 0.2, A: 0.4, B: 0.3}


def _all_tokens(hyps):
    return {t for sent in hyps for h in sent for t in h.tokens}


def test_tokens_outside_the_top_k_are_never_drawn():
    model = ScriptedModel([{}] * 4, FLAT)
    hyps = sample(model, torch.tensor([[7, EOS]] * 4), nbest=50, sampling=Sampling(topk=2), max_len_a=0.0, max_len_b=6)
    assert _all_tokens(hyps) == {A, B}  # EOS is third: sentences run to the length limit (EOS forced)
    assert all(len(h.tokens) == 6 for sent in hyps for h in sent)
    everything = sample(model, torch.tensor([[7, EOS]] * 4), nbest=50, sampling=Sampling(), max_len_a=0.0, max_len_b=6)
    assert _all_tokens(everything) == {UNK, A, B}  # without top-k, the rare token does appear


def test_tokens_outside_the_nucleus_are_never_drawn():
    model = ScriptedModel([{}] * 4, FLAT)
    # 0.4 + 0.3 + 0.2 reach 0.85: UNK (0.1) is outside. At the first step EOS is banned, so the
    # nucleus of (A 0.5, B 0.375, UNK 0.125) is A and B.
    hyps = sample(model, torch.tensor([[7, EOS]] * 4), nbest=50, sampling=Sampling(topp=0.85), max_len_a=0.0, max_len_b=8)
    assert _all_tokens(hyps) == {A, B}
    ends = {len(h.tokens) for sent in hyps for h in sent}
    assert min(ends) < 8  # EOS was in the nucleus from the second step on


def test_nbest_samples_per_sentence_best_first_with_model_scores():
    table = {(): {A: 0.5, B: 0.5}, (A,): {EOS: 0.9, A: 0.1}, (B,): {EOS: 0.6, B: 0.4}}
    model = ScriptedModel([table], NO_EOS)
    hyps = sample(model, torch.tensor([[7, EOS]]), nbest=40, sampling=Sampling(temperature=3.0), lenpen=0.0, max_len_a=0.0, max_len_b=5)[0]
    assert len(hyps) == 40
    scores = [h.score for h in hyps]
    assert scores == sorted(scores, reverse=True)
    # temperature shapes the draw, never the score: a score is the model's own log-probability
    known = {(A,): math.log(0.5 * 0.9), (B,): math.log(0.5 * 0.6)}
    assert {tuple(h.tokens) for h in hyps} >= set(known)
    for h in hyps:
        if tuple(h.tokens) in known:
            assert h.score == pytest.approx(known[tuple(h.tokens)])


# ---- sampling with a real model: limits and reproducibility -----------------------------------

def _tokens(hyps):
    return [[h.tokens for h in sent] for sent in hyps]


@pytest.mark.parametrize("sampling", [Sampling(topk=1), Sampling(topp=1e-6), Sampling(temperature=1e-6)],
                         ids=["topk=1", "topp-tiny", "temperature-to-0"])
def test_sampling_limits_equal_greedy(real_model, sampling):
    src = _sources(6)
    greedy = greedy_search(real_model, src, max_len_a=0.0, max_len_b=12)
    samples = sample(real_model, src, nbest=3, sampling=sampling, max_len_a=0.0, max_len_b=12)
    for g, s in zip(greedy, samples):
        assert [h.tokens for h in s] == [g[0].tokens] * 3
        assert all(h.score == pytest.approx(g[0].score, abs=1e-5) for h in s)


def test_sampling_away_from_the_limits_differs_from_greedy(real_model):
    src = _sources(6)
    greedy = _tokens(greedy_search(real_model, src, max_len_a=0.0, max_len_b=12))
    assert _tokens(sample(real_model, src, nbest=1, sampling=Sampling(), max_len_a=0.0, max_len_b=12)) != greedy


def test_same_seed_same_samples_whatever_the_batch(real_model):
    src = _sources(5)
    keys = torch.tensor([10, 11, 12, 13, 14])
    options = dict(nbest=4, sampling=Sampling(topk=20, topp=0.95, temperature=1.3, seed=42), max_len_a=0.0, max_len_b=12)
    first = sample(real_model, src, keys=keys, **options)
    assert _tokens(sample(real_model, src, keys=keys, **options)) == _tokens(first)
    # each sentence alone, in another order: the same samples (the key, not the row, seeds them)
    for i in (3, 0, 4):
        assert _tokens(sample(real_model, src[i : i + 1], keys=keys[i : i + 1], **options)) == _tokens(first[i : i + 1])
    other = dict(options, sampling=Sampling(topk=20, topp=0.95, temperature=1.3, seed=43))
    assert _tokens(sample(real_model, src, keys=keys, **other)) != _tokens(first)


def test_sample_scores_are_the_models_log_probabilities(real_model):
    src = _sources(4)
    hyps = search(real_model, src, SearchOptions(beam=5, max_len_a=0, max_len_b=10, lenpen=1.0, nbest=3, sampling=Sampling(seed=5)))
    for b, sent in enumerate(hyps):
        assert len(sent) == 3
        rows = src[b : b + 1].expand(len(sent), -1)
        totals = reference_logprobs(real_model, rows, [h.tokens for h in sent])
        for h, total in zip(sent, totals):
            assert h.score == pytest.approx(total / (len(h.tokens) + 1), abs=1e-4)
