"""Beam and greedy search, exactly: a fake model with scripted probabilities, and a real model."""

import math
from dataclasses import dataclass

import pytest
import torch

from seqtool.config import model_config_for
from seqtool.model import Transformer
from seqtool.search import SearchOptions, beam_search, greedy_search, search

pytestmark = pytest.mark.unit

PAD, BOS, EOS, A, B = 0, 2, 3, 4, 5
V = 6


@dataclass
class FakeConfig:
    pad_id: int = PAD
    bos_id: int = BOS
    eos_id: int = EOS
    max_positions: int = 64
    language_tags: int = 0  # (a one-pair model: no target-language tags to ban)


class FakeCache:
    def __init__(self, src_ids):
        self.src_ids = src_ids  # (rows,) which scripted table each row uses
        self.prefix = torch.zeros(len(src_ids), 0, dtype=torch.long)
        self.steps = 0

    def reorder(self, index, cross=True, group=None):
        self.prefix = self.prefix[index]
        self.src_ids = self.src_ids[index]


class ScriptedModel:
    """P(next | prefix) from a table; the source sentence's first token picks the table."""

    def __init__(self, tables, default):
        self.tables, self.default = tables, default
        self.config = FakeConfig()
        self.calls = []

    def encode(self, src):
        return torch.zeros(src.size(0), src.size(1), 1), src.eq(PAD)

    def new_cache(self, memory, src_pad, group=1):
        return FakeCache(torch.arange(memory.size(0)).repeat_interleave(group))

    def decode(self, tokens, memory, src_pad, cache):
        cache.prefix = torch.cat([cache.prefix, tokens], dim=1)
        self.calls.append(tokens.size(0))
        rows = []
        for sid, prefix in zip(cache.src_ids.tolist(), cache.prefix.tolist()):
            probs = self.tables[sid].get(tuple(prefix[1:]), self.default)
            p = torch.zeros(V)
            for tok, value in probs.items():
                p[tok] = value
            rows.append(p.log())
        return torch.stack(rows)[:, None, :]


# "a" first is most likely, but "b" then EOS is the best complete sentence; long "a a a" wins
# once scores are divided by length.
TABLE = {
    (): {A: 0.5, B: 0.5},
    (A,): {A: 0.8, EOS: 0.1, B: 0.1},
    (A, A): {A: 0.8, EOS: 0.1, B: 0.1},
    (A, A, A): {EOS: 0.8, A: 0.1, B: 0.1},
    (B,): {EOS: 0.6, A: 0.2, B: 0.2},
}
NO_EOS = {A: 0.5, B: 0.5}


def _src(n=1):
    return torch.tensor([[7, EOS]] * n)


def test_beam_finds_the_known_best_hypothesis_without_length_penalty():
    model = ScriptedModel([TABLE], NO_EOS)
    hyps = beam_search(model, _src(), beam=2, lenpen=0.0, nbest=2)[0]
    assert [h.tokens for h in hyps] == [[B], [A, A, A]]
    assert hyps[0].score == pytest.approx(math.log(0.5 * 0.6))
    assert hyps[1].score == pytest.approx(math.log(0.5 * 0.8 * 0.8 * 0.8))


def test_length_penalty_divides_by_length_including_eos():
    model = ScriptedModel([TABLE], NO_EOS)
    hyps = beam_search(model, _src(), beam=2, lenpen=1.0, nbest=2)[0]
    assert [h.tokens for h in hyps] == [[A, A, A], [B]]
    assert hyps[0].score == pytest.approx(math.log(0.5 * 0.8 ** 3) / 4)
    assert hyps[1].score == pytest.approx(math.log(0.5 * 0.6) / 2)


def test_greedy_takes_the_locally_best_token():
    table = {(): {A: 0.6, B: 0.4}, (A,): {EOS: 0.4, A: 0.3, B: 0.3}, (B,): {EOS: 0.9, A: 0.05, B: 0.05}}
    model = ScriptedModel([table], NO_EOS)
    assert greedy_search(model, _src(), lenpen=0.0)[0][0].tokens == [A]
    assert beam_search(model, _src(), beam=2, lenpen=0.0)[0][0].tokens == [B]  # 0.36 > 0.24


def test_eos_is_not_allowed_first_and_is_forced_at_the_length_limit():
    table = {(): {EOS: 0.9, A: 0.1}}
    model = ScriptedModel([table], NO_EOS)
    for hyps in (greedy_search(model, _src(), max_len_a=0.0, max_len_b=3), beam_search(model, _src(), beam=3, max_len_a=0.0, max_len_b=3, nbest=3)):
        for h in hyps[0]:
            assert 1 <= len(h.tokens) <= 3  # never empty, EOS forced after 3 tokens
    assert len(greedy_search(model, _src(), max_len_a=0.0, max_len_b=3)[0][0].tokens) == 3


def test_max_len_a_scales_with_source_length():
    model = ScriptedModel([{}, {}], NO_EOS)
    src = torch.tensor([[7, 7, 7, EOS], [7, EOS, PAD, PAD]])
    out = beam_search(model, src, beam=2, max_len_a=1.0, max_len_b=1)
    assert [len(h[0].tokens) for h in out] == [5, 3]  # 1 * (source incl. EOS) + 1


def test_the_default_cap_leaves_a_long_source_room_and_an_explicit_one_is_kept():
    """The default cap is the source's length + 200 (a = 1): a 300-token source's output may run past the
    flat 200 of fairseq and CTranslate2 (#42: a long line with --split-sentences never was cropped);
    an explicit a = 0 keeps their rule, and the model's positions bound both."""
    model = ScriptedModel([{}, {}], NO_EOS)
    model.config.max_positions = 1024
    src = torch.tensor([[7] * 300 + [EOS], [7, EOS] + [PAD] * 299])
    lengths = lambda **o: [len(h[0].tokens) for h in search(model, src, SearchOptions(beam=1, loop_guard=0, **o))]
    assert lengths() == [301 + 200, 2 + 200]
    assert lengths(max_len_a=0.0) == [200, 200]
    model.config.max_positions = 400
    assert lengths() == [399, 202]  # the BOS takes one position


def test_sentences_in_a_batch_are_decoded_independently_and_finished_ones_leave():
    short = {(): {A: 0.9, B: 0.1}, (A,): {EOS: 0.95, A: 0.05}}
    model = ScriptedModel([TABLE, short, TABLE], NO_EOS)
    batch = beam_search(model, _src(3), beam=2, lenpen=1.0, nbest=2)
    alone = [beam_search(ScriptedModel([t], NO_EOS), _src(), beam=2, lenpen=1.0, nbest=2)[0] for t in (TABLE, short, TABLE)]
    assert [[(h.tokens, round(h.score, 6)) for h in hs] for hs in batch] == [[(h.tokens, round(h.score, 6)) for h in hs] for hs in alone]
    assert model.calls[:2] == [3, 6]  # step 0: one row per sentence (all beams are BOS), then beam rows
    assert min(model.calls[1:]) < max(model.calls[1:])  # rows dropped once sentences finished


def test_a_beam_wider_than_the_vocabulary_keeps_only_possible_hypotheses():
    model = ScriptedModel([TABLE], NO_EOS)
    hyps = beam_search(model, _src(), beam=8, lenpen=1.0, nbest=8, max_len_a=0.0, max_len_b=4)[0]  # V = 6 < 8 candidates
    assert hyps and all(math.isfinite(h.score) for h in hyps)
    assert len({tuple(h.tokens) for h in hyps}) == len(hyps)  # no hypothesis twice
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    assert hyps[0].tokens == beam_search(model, _src(), beam=6, lenpen=1.0, max_len_a=0.0, max_len_b=4)[0][0].tokens


def test_nbest_is_sorted_and_distinct():
    model = ScriptedModel([TABLE], NO_EOS)
    hyps = beam_search(model, _src(), beam=4, lenpen=1.0, nbest=4)[0]
    scores = [h.score for h in hyps]
    assert scores == sorted(scores, reverse=True)
    assert len({tuple(h.tokens) for h in hyps}) == len(hyps)


@pytest.fixture(scope="module")
def real_model():
    torch.manual_seed(3)
    model = Transformer(model_config_for("tiny", vocab_size=50, dropout=0.0)).eval()
    # sharpen the output distribution so hypotheses end at different lengths
    with torch.no_grad():
        model.embed.weight.mul_(3.0)
    return model


def test_beam_size_one_equals_greedy(real_model):
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, 50, (8, 9), generator=g)
    src[:, -1] = EOS
    src[2, 5:] = PAD
    src[2, 4] = EOS
    greedy = greedy_search(real_model, src, max_len_a=0.0, max_len_b=20)
    beam1 = beam_search(real_model, src, beam=1, max_len_a=0.0, max_len_b=20)
    assert [h[0].tokens for h in greedy] == [h[0].tokens for h in beam1]
    for a, b in zip(greedy, beam1):
        assert a[0].score == pytest.approx(b[0].score, abs=1e-5)


def test_beam_score_is_the_models_length_normalised_log_probability(real_model):
    src = torch.tensor([[5, 9, 11, 7, EOS]])
    hyp = search(real_model, src, SearchOptions(beam=4, max_len_a=0, max_len_b=12, lenpen=1.0))[0][0]
    tokens = torch.tensor([[BOS] + hyp.tokens])
    target = torch.tensor(hyp.tokens + [EOS])
    with torch.no_grad():
        lp = real_model(src, tokens).log_softmax(-1)[0]
    total = lp[torch.arange(len(target)), target].sum().item()
    assert hyp.score == pytest.approx(total / len(target), abs=1e-4)


def test_batched_beam_equals_one_at_a_time(real_model):
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 50, (5, 6), generator=g)
    src[:, -1] = EOS
    together = beam_search(real_model, src, beam=3, max_len_a=0.0, max_len_b=15, nbest=2)
    for i in range(5):
        alone = beam_search(real_model, src[i : i + 1], beam=3, max_len_a=0.0, max_len_b=15, nbest=2)[0]
        assert [h.tokens for h in together[i]] == [h.tokens for h in alone]


# ---- the beam's candidate selection: a blockwise top-k ---------------------
@pytest.mark.parametrize("V, k", [(8000, 10), (8000, 1), (8001, 10), (58101, 8), (1000, 2), (4096, 16), (300, 10), (129, 2)])
def test_block_top_k_equals_torch_topk(V, k):
    from seqtool.steps import top_k

    g = torch.Generator().manual_seed(V + k)
    x = torch.randn(37, V, generator=g) * 4
    x[:, ::7] = float("-inf")  # banned tokens
    x[3] = float("-inf")
    x[3, V - 1] = 0.5  # the only possible token sits in the ragged tail (or the last block)
    x[5] = torch.randint(0, 3, (V,), generator=g).float()  # ties everywhere
    values, index = top_k(x, k)
    ref_values, _ = x.topk(k, dim=1)
    assert torch.equal(values, ref_values)  # the same k best values, best first
    assert torch.equal(x.gather(1, index), values)  # and the columns that hold them
    assert all(len(set(row)) == k for row in index.tolist())


# ---- target prefixes ------------------------------------------------------------------------------
class ForcedPrefix:
    """The reference for prefix decoding: the model, with every token but prefix[b][t] banned at
    output position t < P (so the search is forced through the prefix token by token, then free)."""

    def __init__(self, model, prefix):
        self.model, self.prefix, self.config = model, prefix, model.config
        self.rows = None

    def encode(self, src):
        return self.model.encode(src)

    def new_cache(self, memory, src_pad, group=1):
        self.cache = self.model.new_cache(memory, src_pad, group)
        self.rows = torch.arange(memory.size(0)).repeat_interleave(group)  # row -> sentence
        real = self.cache.reorder

        def reorder(index, cross=True, group=None):
            self.rows = self.rows[index]
            real(index, cross=cross, group=group)

        self.cache.reorder = reorder
        return self.cache

    def decode(self, tokens, memory, src_pad, cache):
        t = cache.steps  # the output position of the token predicted next
        logits = self.model.decode(tokens, memory, src_pad, cache).float()
        if t < self.prefix.size(1):
            keep = self.prefix[self.rows, t]  # (rows,)
            banned = torch.full_like(logits, float("-inf"))
            banned[:, -1].scatter_(1, keep[:, None], logits[:, -1].gather(1, keep[:, None]))
            logits = banned
        return logits


@pytest.mark.parametrize("beam", [1, 4])
def test_a_prefix_decoded_in_one_pass_equals_forcing_it_token_by_token(real_model, beam):
    """lenpen 0: the prefix adds the same log-probability to every hypothesis, so the forced search
    (where it adds 0) ranks the continuations the same and must find the same outputs."""
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 50, (5, 7), generator=g)
    src[:, -1] = real_model.config.eos_id
    prefix = torch.randint(4, 50, (5, 3), generator=g)
    opts = SearchOptions(beam=beam, nbest=beam, max_len_a=0.0, max_len_b=9, lenpen=0.0)
    with torch.no_grad():
        got = search(real_model, src, opts, prefix=prefix)
        want = search(ForcedPrefix(real_model, prefix), src, opts)
    assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in want]
    assert all(h.tokens[:3] == prefix[b].tolist() for b, hyps in enumerate(got) for h in hyps)


@pytest.mark.parametrize("beam", [1, 3])
def test_a_prefixed_hypothesis_scores_what_reference_scoring_gives_its_tokens(real_model, beam):
    """The score counts the prefix's log-probabilities and its length: it equals --score-reference
    of the whole output (prefix, continuation, EOS), normalised the same way."""
    from seqtool.reference_score import reference_logprobs

    g = torch.Generator().manual_seed(2)
    src = torch.randint(4, 50, (4, 6), generator=g)
    src[:, -1] = real_model.config.eos_id
    prefix = torch.randint(4, 50, (4, 2), generator=g)
    with torch.no_grad():
        hyps = [h[0] for h in search(real_model, src, SearchOptions(beam=beam, max_len_a=0.0, max_len_b=7, lenpen=1.0), prefix=prefix)]
        ref = reference_logprobs(real_model, src, [h.tokens for h in hyps])
        prefix_only = reference_logprobs(real_model, src, [p.tolist() for p in prefix])
    for h, lp in zip(hyps, ref):
        assert h.score == pytest.approx(lp / (len(h.tokens) + 1), abs=1e-4)
    assert all(math.isfinite(x) for x in prefix_only)


def test_a_prefix_as_long_as_the_limit_ends_right_after_it(real_model):
    src = torch.tensor([[5, 6, 7, real_model.config.eos_id]])
    prefix = torch.tensor([[8, 9, 10, 11]])
    with torch.no_grad():
        for beam in (1, 3):
            hyps = search(real_model, src, SearchOptions(beam=beam, max_len_a=0.0, max_len_b=3), prefix=prefix)[0]
            assert [h.tokens for h in hyps] == [[8, 9, 10, 11]]


# ---- candidate choice behind an object (Candidates): the searches of before, bit for bit ----------
def _random_search(model, seed):
    """A random batch and beam search's arguments: beam, n-best, length penalty and limits, and
    sometimes a prefix, constraints (with or without word pieces) or a sentence abandoned midway."""
    import random

    from seqtool.constraints import ConstraintState, WordPieces

    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    V = model.config.vocab_size
    n = rng.randint(1, 5)
    src = torch.randint(4, V, (n, rng.randint(3, 9)), generator=g)
    src[:, -1] = EOS
    if n > 1:
        src[1, 2:] = PAD
        src[1, 1] = EOS
    beam = rng.choice([1, 2, 3, 5, 8])
    args = dict(beam=beam, nbest=rng.randint(1, beam), lenpen=rng.choice([0.0, 0.6, 1.0, 1.3]), max_len_b=rng.randint(2, 20),
                max_len_a=rng.choice([0.0, 0.5]), min_len=rng.choice([0, 1, 3]), max_len=rng.choice([0, 0, 6]))
    if rng.random() < 0.4:
        args["prefix"] = torch.randint(4, V, (n, rng.randint(1, 3)), generator=g)
    groups = None
    if rng.random() < 0.6:  # per sentence up to 3 groups of 1-2 phrases of 1-2 tokens (a sentence may have none)
        groups = [[[[rng.randrange(4, V) for _ in range(rng.randint(1, 2))] for _ in range(rng.randint(1, 2))]
                   for _ in range(rng.randint(0, 3))] for _ in range(n)]
        if "prefix" in args:  # and one the prefix places
            groups = [gs + [[args["prefix"][b, :2].tolist()]] * (b % 2) for b, gs in enumerate(groups)]
    pieces = None
    if groups is not None and rng.random() < 0.5:  # most pieces go on a word: the best that ends one is often an extra
        pieces = WordPieces(torch.rand(V, generator=g) < 0.8, torch.rand(V, generator=g) < 0.5)
    quit_after = rng.choice([None, None, 3])  # sentence 0 abandoned at the 4th step

    def fresh():  # what a search uses up: the constraints' state, the steps counted by `wanted`
        calls = []

        def wanted():
            calls.append(1)
            return None if len(calls) <= quit_after else torch.arange(n) != 0

        state = None if groups is None else ConstraintState(groups, torch.device("cpu"), pieces, BOS)
        return dict(args, constraints=state, wanted=None if quit_after is None else wanted)

    return src, fresh


class EndsEarly:
    """A model whose EOS is about as likely as its best token less `bias` nats: outputs of many
    lengths, hypotheses finishing (and meeting their constraints) at many steps. With `coarse`, its
    logits rounded to multiples of it: equal scores everywhere."""

    def __init__(self, model, bias, coarse=0.0):
        self.model, self.bias, self.coarse, self.config = model, bias, coarse, model.config

    def encode(self, src):
        return self.model.encode(src)

    def new_cache(self, memory, src_pad, group=1):
        return self.model.new_cache(memory, src_pad, group)

    def decode(self, tokens, memory, src_pad, cache):
        logits = self.model.decode(tokens, memory, src_pad, cache).float().clone()
        logits[..., self.config.eos_id] = logits[..., 4:].amax(-1) - self.bias
        return (logits / self.coarse).round() * self.coarse if self.coarse else logits


@pytest.mark.parametrize("seed", range(16))
def test_beam_search_equals_the_reference_from_before_candidates(real_model, tiny_model, seed):
    """tests/beam_reference.py is beam_search as it was with its seven `constraints is None`
    branches: on random batches, prefixes, constraints and abandoned sentences, today's search
    gives the same tokens and scores (==, not approximately)."""
    from beam_reference import beam_search as reference

    for model in (real_model, tiny_model, EndsEarly(tiny_model, 3.0), EndsEarly(real_model, 2.0), EndsEarly(tiny_model, 2.0, 0.5)):
        src, fresh = _random_search(model, seed)
        got = beam_search(model, src, **fresh())
        want = reference(model, src, **fresh())
        assert [[(h.tokens, h.score) for h in hs] for hs in got] == [[(h.tokens, h.score) for h in hs] for hs in want]


@pytest.mark.parametrize("constraints", [None, [[[[A, B]]]]])
def test_a_beam_wider_than_the_vocabulary_equals_the_reference(constraints):
    from beam_reference import beam_search as reference
    from seqtool.constraints import ConstraintState

    for beam in (6, 8):
        args = dict(beam=beam, nbest=beam, lenpen=1.0, max_len_a=0.0, max_len_b=5)
        got, want = (search_(ScriptedModel([TABLE], NO_EOS), _src(), constraints=None if constraints is None else
                             ConstraintState(constraints, torch.device("cpu")), **args) for search_ in (beam_search, reference))
        assert [(h.tokens, h.score) for h in got[0]] == [(h.tokens, h.score) for h in want[0]]
