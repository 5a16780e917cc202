"""Repetition controls of search: no_repeat_ngram_size and the loop guard, in greedy search, beam
search and sampling: exact outcomes with scripted models, properties on a real model, and the
vectorised bans against a plain Python reading of their rules."""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seqtool.config import Sampling, SearchOptions, model_config_for
from seqtool.errors import FieldError
from seqtool.model import Transformer
from seqtool.search import search
from seqtool.steps import GUARD_LONGEST, RepeatBans, has_loop
from test_search import BOS, EOS, PAD, FakeCache, FakeConfig

pytestmark = pytest.mark.unit

A, B, C = 4, 5, 6
V = 10


class LastToken:
    """P(next | last token) from a table (`default` for tokens it lacks): loops of any period,
    scripted. Takes a target prefix in one pass as the real model does."""

    def __init__(self, table, default):
        self.table, self.default = table, default
        self.config = FakeConfig()

    def encode(self, src):
        return torch.zeros(src.size(0), src.size(1), 1), src.eq(PAD)

    def new_cache(self, memory, src_pad, group=1):
        return FakeCache(torch.arange(memory.size(0)).repeat_interleave(group))

    def decode(self, tokens, memory, src_pad, cache):
        probs = torch.zeros(*tokens.shape, V)  # (rows, T, V)
        for (r, i), last in zip(torch.cartesian_prod(torch.arange(tokens.size(0)), torch.arange(tokens.size(1))).tolist(),
                                tokens.view(-1).tolist()):
            for token, p in self.table.get(last, self.default).items():
                probs[r, i, token] = p
        return probs.log()


def copies_in_a_row(tokens, longest=GUARD_LONGEST):
    """The most copies of one phrase (1 to `longest` tokens) that follow each other in tokens."""
    best = 1 if tokens else 0
    for m in range(1, longest + 1):
        for start in range(len(tokens)):
            n = 1
            while tokens[start + n * m: start + (n + 1) * m] == tokens[start: start + m] and start + (n + 1) * m <= len(tokens):
                n += 1
            best = max(best, n)
    return best


def repeated_ngrams(tokens, n):
    grams = [tuple(tokens[i: i + n]) for i in range(len(tokens) - n + 1)]
    return len(grams) - len(set(grams))


def _src(*rows):
    width = max(len(r) for r in rows) + 1
    return torch.tensor([list(r) + [EOS] + [PAD] * (width - len(r) - 1) for r in rows])


WANTS_A = LastToken({}, {A: 0.6, B: 0.4})  # "A A A A ...", never an end
PERIOD_2 = LastToken({BOS: {A: 1.0}, A: {B: 0.9, C: 0.1}, B: {A: 0.9, C: 0.1}, C: {A: 0.5, B: 0.5}}, {A: 1.0})  # "A B A B ..."

MODES = {"greedy": SearchOptions(beam=1, max_len_a=0.0, max_len_b=12), "beam": SearchOptions(beam=3, nbest=3, max_len_a=0.0, max_len_b=12),
         "sampling": SearchOptions(nbest=8, max_len_a=0.0, max_len_b=12, sampling=Sampling(seed=3))}  # flat caps


def _outputs(model, src, options, **kw):
    return [[h.tokens for h in hyps] for hyps in search(model, src, options, **kw)]


# ---- the loop guard, exactly -------------------------------------------------------------------
def test_the_guard_keeps_a_token_to_three_in_a_row_and_off_lets_it_run():
    assert _outputs(WANTS_A, _src([8]), MODES["greedy"]) == [[[A, A, A, B] * 3]]
    assert _outputs(WANTS_A, _src([8]), MODES["greedy"].replace(loop_guard=0)) == [[[A] * 12]]
    for mode, options in MODES.items():
        guarded = _outputs(WANTS_A, _src([8]), options)[0]
        assert max(copies_in_a_row(t) for t in guarded) == 3, mode
        free = _outputs(WANTS_A, _src([8]), options.replace(loop_guard=0))[0]
        assert max(copies_in_a_row(t) for t in free) >= 4, mode


def test_a_period_two_loop_is_broken_at_its_fourth_copy():
    """'cada vez cada vez cada vez cada' may not go on with 'vez'; the next best token comes."""
    assert _outputs(PERIOD_2, _src([8]), MODES["greedy"].replace(max_len_a=0.0, max_len_b=16, loop_guard=0)) == [[[A, B] * 8]]
    assert _outputs(PERIOD_2, _src([8]), MODES["greedy"].replace(max_len_a=0.0, max_len_b=16)) == [[[A, B, A, B, A, B, A, C] * 2]]
    for mode, options in MODES.items():
        for t in _outputs(PERIOD_2, _src([8]), options.replace(max_len_a=0.0, max_len_b=16))[0]:
            assert copies_in_a_row(t) <= 3, (mode, t)
    for t in _outputs(PERIOD_2, _src([8]), MODES["beam"].replace(max_len_a=0.0, max_len_b=16, loop_guard=2))[0]:  # not even twice
        assert copies_in_a_row(t) == 1, t


def test_a_source_with_such_a_run_turns_the_guard_off_for_its_sentence_only():
    src = _src([A, A, A, A], [8, B, 9, B, 9, B, 9, B, 9], [A, A, A], [8])  # runs of 4, 4 (period 2), 3 and none
    assert has_loop(src, 4, (PAD, BOS, EOS)).tolist() == [True, True, False, False]
    assert has_loop(src, 3, (PAD, BOS, EOS)).tolist() == [True, True, True, False]
    assert has_loop(_src([8], [8, 9, 8, 10]), 2, (PAD, BOS, EOS)).tolist() == [False, False]  # padding is no phrase
    out = _outputs(WANTS_A, src, MODES["greedy"])
    assert out == [[[A] * 12], [[A] * 12], [[A, A, A, B] * 3], [[A, A, A, B] * 3]]
    for mode, options in MODES.items():
        batch = _outputs(WANTS_A, src, options, keys=torch.arange(4))
        assert batch == [_outputs(WANTS_A, src[i: i + 1], options, keys=torch.tensor([i]))[0] for i in range(4)], mode


def test_the_guard_counts_a_target_prefix_as_output():
    prefix = torch.tensor([[A, A, A]])
    for mode, options in MODES.items():
        for t in _outputs(WANTS_A, _src([8]), options, prefix=prefix)[0]:
            assert t[:4] == [A, A, A, B], (mode, t)
    # the prefix itself is given, never banned: a prefix with a run goes on with the next best token
    assert _outputs(WANTS_A, _src([8]), MODES["greedy"].replace(max_len_a=0.0, max_len_b=6), prefix=torch.tensor([[A] * 5]))[0][0][:6] == [A] * 5 + [B]


def test_a_row_whose_every_token_is_banned_ends_with_a_finite_score():
    only_a = LastToken({}, {A: 1.0})  # the model allows nothing but A; EOS is banned before min_len
    for mode, options in MODES.items():
        for opts in (options, options.replace(min_len=8)):
            hyps = search(only_a, _src([8]), opts)[0]
            assert hyps and all(h.tokens == [A, A, A] and math.isfinite(h.score) for h in hyps), (mode, hyps)
    for mode, options in MODES.items():  # and the same by no_repeat_ngram_size 1 alone
        hyps = search(only_a, _src([8]), options.replace(loop_guard=0, no_repeat_ngram_size=1))[0]
        assert hyps and all(h.tokens == [A] and h.score == 0.0 for h in hyps), (mode, hyps)


# ---- with constraints: a constraint wins over the bans --------------------------------------------
def test_a_constraint_that_needs_a_run_gets_it_and_the_guard_still_holds_elsewhere():
    wants_b = LastToken({}, {B: 0.6, A: 0.4})
    options = SearchOptions(beam=3, nbest=3, lenpen=0.0, max_len_a=0.0, max_len_b=10)
    for beam in (1, 3):
        hyps = search(wants_b, _src([8]), options.replace(beam=beam, nbest=beam), constraints=[[[[A] * 5]]])[0]
        best = hyps[0].tokens
        assert any(best[i: i + 5] == [A] * 5 for i in range(len(best))), best
        assert all(best[i: i + 4] != [B] * 4 for i in range(len(best))), best
    # a constraint given twice: its bigram twice, whatever no_repeat_ngram_size says
    twice = search(wants_b, _src([8]), options.replace(no_repeat_ngram_size=2), constraints=[[[[A, B]], [[A, B]]]])[0][0]
    assert sum(twice.tokens[i: i + 2] == [A, B] for i in range(len(twice.tokens))) == 2, twice.tokens


# ---- the options --------------------------------------------------------------------------------
def test_the_options_are_declared_with_their_bounds():
    assert SearchOptions().loop_guard == 4 and SearchOptions().no_repeat_ngram_size == 0
    with pytest.raises(FieldError, match="loop-guard counts copies of a phrase in a row: 0 .off. or at least 2, got 1"):
        SearchOptions(loop_guard=1)
    with pytest.raises(FieldError, match="no-repeat-ngram-size must be in"):
        SearchOptions(no_repeat_ngram_size=-1)
    assert SearchOptions.from_dict({"loop_guard": 0, "no_repeat_ngram_size": 3}) == SearchOptions(loop_guard=0, no_repeat_ngram_size=3)


# ---- the bans, against a plain reading of their rules -------------------------------------------------
def _plain_bans(history, copies, ngram, guarded):
    """The tokens a row may not take next, computed as the rules say it."""
    t, out = len(history), set()
    for m in range(1, GUARD_LONGEST + 1) if copies and guarded else ():
        if t >= copies * m - 1 and all(history[t - 1 - j] == history[t - 1 - j - m] for j in range((copies - 1) * m - 1)):
            out.add(history[t - m])
    for i in range(t - ngram + 1) if ngram and t >= ngram else ():
        if history[i: i + ngram - 1] == history[t - ngram + 1:]:
            out.add(history[i + ngram - 1])
    return out - {EOS}


@settings(max_examples=300, deadline=None)
@given(copies=st.sampled_from([0, 2, 3, 4, 5]), ngram=st.integers(0, 4), alphabet=st.integers(1, 4), data=st.data())
def test_the_vectorised_bans_equal_their_plain_reading(copies, ngram, alphabet, data):
    if not (copies or ngram):
        return
    width = data.draw(st.integers(0, 40))
    tokens = st.integers(EOS, A + alphabet - 1)  # EOS too (a given prefix might hold it): never banned
    rows = data.draw(st.lists(st.lists(tokens, min_size=width, max_size=width), min_size=1, max_size=5))
    history = torch.tensor(rows, dtype=torch.long).view(len(rows), width)
    src = _src([8], [9] * max(copies, 1))  # sentence 1's source has a run: unguarded
    sentence = torch.tensor(data.draw(st.lists(st.integers(0, 1), min_size=len(rows), max_size=len(rows))))
    lprobs = torch.randn(len(rows), V).log_softmax(-1)
    lprobs[:, [PAD, BOS]] = float("-inf")
    before = lprobs.clone()
    RepeatBans(src, ngram, copies, FakeConfig()).ban(lprobs, history, sentence)
    for r in range(len(rows)):
        banned = {i for i in range(V) if lprobs[r, i] == float("-inf") and before[r, i] != float("-inf")}
        assert banned == _plain_bans(history[r].tolist(), copies, ngram, sentence[r] == 0), history[r].tolist()


# ---- properties on a real model -------------------------------------------------------------------
@pytest.fixture(scope="module")
def looping_model():
    """A tiny random model with sharpened outputs: left alone it repeats itself."""
    torch.manual_seed(3)
    model = Transformer(model_config_for("tiny", vocab_size=40, dropout=0.0, max_positions=96)).eval()
    with torch.no_grad():
        model.embed.weight.mul_(3.0)
    return model


def _sources(g, n, vocab=40):
    src = torch.randint(4, vocab, (n, 7), generator=g)
    src[:, -1] = EOS
    return src


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mode=st.sampled_from(sorted(MODES)), ngram=st.integers(1, 4), seed=st.integers(0, 1000), prefix=st.booleans())
def test_no_ngram_appears_twice(looping_model, mode, ngram, seed, prefix):
    g = torch.Generator().manual_seed(seed)
    src = _sources(g, 3)
    given_prefix = torch.randint(4, 40, (3, 2), generator=g) if prefix else None
    if given_prefix is not None and ngram == 1:
        given_prefix[:, 1] = (given_prefix[:, 0] - 3) % 36 + 4  # a prefix that repeats no token itself
    options = MODES[mode].replace(max_len_a=0.0, max_len_b=20, no_repeat_ngram_size=ngram, loop_guard=0)
    for sentence in _outputs(looping_model, src, options, prefix=given_prefix):
        assert sentence and all(repeated_ngrams(t, ngram) == 0 for t in sentence)
    if ngram <= 2:  # the bans did something
        free = _outputs(looping_model, src, options.replace(no_repeat_ngram_size=0), prefix=given_prefix)
        assert any(repeated_ngrams(t, ngram) for sentence in free for t in sentence)


def test_every_token_banned_ends_the_output_not_the_search(looping_model):
    """no_repeat_ngram_size 1 over a 40-token vocabulary with EOS banned for 60 tokens: each output
    takes distinct tokens until none is left, then ends."""
    src = _sources(torch.Generator().manual_seed(0), 2)
    for mode, options in MODES.items():
        hyps = search(looping_model, src, options.replace(max_len_a=0.0, max_len_b=80, min_len=60, no_repeat_ngram_size=1))
        for sentence in hyps:
            assert sentence, mode
            for h in sentence:
                assert len(set(h.tokens)) == len(h.tokens) <= 37 and math.isfinite(h.score), (mode, h)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mode=st.sampled_from(sorted(MODES)), seed=st.integers(0, 1000), ngram=st.sampled_from([0, 3]))
def test_the_default_guard_holds_and_a_sentence_does_not_depend_on_its_batch_mates(looping_model, mode, seed, ngram):
    g = torch.Generator().manual_seed(seed)
    src = _sources(g, 4)
    src[1, 1:5] = src[1, 0]  # a source with a run: its output is not guarded
    options = MODES[mode].replace(max_len_a=0.0, max_len_b=24, no_repeat_ngram_size=ngram)
    keys = torch.arange(10, 14)
    with torch.no_grad():
        batch = search(looping_model, src, options, keys=keys)
        alone = [search(looping_model, src[i: i + 1], options, keys=keys[i: i + 1])[0] for i in range(4)]
    assert [[h.tokens for h in hyps] for hyps in batch] == [[h.tokens for h in hyps] for hyps in alone]
    for a, b in zip(batch, alone):
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)
    for i, hyps in enumerate(batch):
        if i != 1:
            assert all(copies_in_a_row(h.tokens) <= 3 for h in hyps), hyps
