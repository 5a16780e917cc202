"""Lexical constraints: exact tests with scripted probabilities, properties on a real model, the
glossary's word boundaries, and the CLI, the Python API and the server taking the same."""

import codecs
import json
import math
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seqtool.config import SearchOptions, model_config_for
from seqtool.constraints import ConstraintState, WordPieces, satisfied, stripes
from seqtool.errors import InputError
from seqtool.model import Transformer
from seqtool.search import beam_search, search
from seqtool.terms import Glossary, parse_constraints_line
from seqtool.textio import LockstepLines
from test_search import EOS, NO_EOS, TABLE, A, B, ScriptedModel, _src, real_model  # noqa: F401 (a fixture)



def _contains(tokens, part):
    return any(tokens[i:i + len(part)] == part for i in range(len(tokens) - len(part) + 1))


# ---- the search, exactly ------------------------------------------------------------------------
@pytest.mark.unit
def test_a_constraint_is_met_by_the_best_scoring_hypothesis_that_has_it():
    """TABLE's best output is [B]; with A required exactly once, the best hypothesis is [A] (0.5 *
    0.1; [A, A, A], 0.5 * 0.8^3, repeats it; [B, A, B, B, B] has 0.5 * 0.2 * 0.5^3): among those
    that meet the constraint the higher score wins, and its score is the model's own log-probability."""
    model = ScriptedModel([TABLE], NO_EOS)
    free = beam_search(model, _src(), beam=3, lenpen=0.0, max_len_a=0.0, max_len_b=5)[0][0]
    assert free.tokens == [B]
    for beam in (1, 3):
        best = search(ScriptedModel([TABLE], NO_EOS), _src(), SearchOptions(beam=beam, lenpen=0.0, max_len_a=0.0, max_len_b=5), constraints=[[[[A]]]])[0][0]
        assert A in best.tokens
        if beam == 3:
            assert best.tokens == [A] and best.score == pytest.approx(math.log(0.5 * 0.1))
    # a constraint the free output meets changes nothing
    kept = search(ScriptedModel([TABLE], NO_EOS), _src(), SearchOptions(beam=3, lenpen=0.0, max_len_a=0.0, max_len_b=5), constraints=[[[[B]]]])[0][0]
    assert (kept.tokens, kept.score) == (free.tokens, free.score)


@pytest.mark.unit
def test_phrases_and_one_of_several_forms():
    model = ScriptedModel([TABLE], NO_EOS)
    opts = SearchOptions(beam=3, nbest=3, lenpen=0.0, max_len_a=0.0, max_len_b=6)
    hyps = search(model, _src(), opts, constraints=[[[[A, B]]]])[0]
    assert _contains(hyps[0].tokens, [A, B])
    # the beam is shared among levels of progress, so at the length limit fewer than 3 may have met
    # it: those that have not rank after those that have, whatever their scores
    met = [_contains(h.tokens, [A, B]) for h in hyps]
    assert met == sorted(met, reverse=True)
    # "A A A" or "B A": the better of the two forms that fits wins
    best = search(model, _src(), SearchOptions(beam=3, lenpen=0.0, max_len_a=0.0, max_len_b=6), constraints=[[[[A, A, A], [B, A]]]])[0][0]
    assert best.tokens == [A, A, A]


@pytest.mark.unit
def test_constrained_and_free_sentences_share_a_batch_as_if_alone():
    short = {(): {A: 0.9, B: 0.1}, (A,): {EOS: 0.95, A: 0.05}}
    tables = [TABLE, short, TABLE]
    cons = [[[[A]]], [], [[[B], [A, B]], [[A]]]]
    opts = SearchOptions(beam=3, nbest=2, lenpen=1.0, max_len_a=0.0, max_len_b=6)
    batch = search(ScriptedModel(tables, NO_EOS), _src(3), opts, constraints=cons)
    alone = [search(ScriptedModel([t], NO_EOS), _src(), opts, constraints=[c])[0] for t, c in zip(tables, cons)]
    assert [[(h.tokens, round(h.score, 6)) for h in hs] for hs in batch] == [[(h.tokens, round(h.score, 6)) for h in hs] for hs in alone]
    assert batch[1][0].tokens == beam_search(ScriptedModel([short], NO_EOS), _src(), beam=3, max_len_a=0.0, max_len_b=6)[0][0].tokens


@pytest.mark.unit
def test_a_constraint_appears_exactly_once_unless_it_is_given_twice():
    """With no EOS in sight the model would say A on every step; once A is placed, A again is
    banned, unless the constraint is given twice (then exactly twice), or another constraint
    still needs it."""
    opts = SearchOptions(beam=3, nbest=3, lenpen=0.0, max_len_a=0.0, max_len_b=6)
    free = search(ScriptedModel([{}], {A: 0.6, B: 0.4}), _src(), opts.replace(loop_guard=0))[0][0]  # (the guard would stop A at 3 in a row)
    assert free.tokens.count(A) == 6
    for groups, times in (([[[A]]], 1), ([[[A]], [[A]]], 2), ([[[A, B]]], 1)):
        hyps = search(ScriptedModel([{}], {A: 0.6, B: 0.4}), _src(), opts, constraints=[groups])[0]
        if groups == [[[A, B]]]:
            counts = [sum(h.tokens[i:i + 2] == [A, B] for i in range(len(h.tokens))) for h in hyps]
        else:
            counts = [h.tokens.count(A) for h in hyps]
        assert counts[0] == times and max(counts) == times, (groups, [h.tokens for h in hyps])  # never more
    # [A] met, [A B] still needs its A: not banned for it
    best = search(ScriptedModel([{}], {A: 0.6, B: 0.4}), _src(), opts, constraints=[[[[A]], [[B, A]]]])[0][0]
    assert _contains(best.tokens, [B, A]) and A in best.tokens


@pytest.mark.unit
def test_a_constraint_longer_than_the_limit_gives_the_best_output_not_a_crash():
    out = search(ScriptedModel([TABLE], NO_EOS), _src(), SearchOptions(beam=2, max_len_a=0.0, max_len_b=2), constraints=[[[[A, B, A, B]]]])[0]
    assert out and all(1 <= len(h.tokens) <= 2 for h in out)


@pytest.mark.unit
def test_stripes_take_the_best_of_every_level_before_the_second_best_of_any():
    scores = torch.tensor([[-1.0, -2.0, -3.0, -4.0, float("-inf")]])
    banks = torch.tensor([[0, 0, 1, 2, 2]])
    key = stripes(scores, banks, torch.tensor([2]))
    assert key.argsort(dim=1).tolist() == [[3, 2, 0, 1, 4]]  # level 2, level 1, level 0, then level 0's second


@pytest.mark.unit
def test_progress_advances_restarts_and_counts_met_groups():
    """A complete phrase counts once the next token ends its word: [4 5 6] then 8 meets the first
    group (3 tokens + its boundary) while 8 starts [8 9] of the second, met by the token after 9."""
    state = ConstraintState([[[[4, 5, 6]], [[7], [8, 9]]]], torch.device("cpu"))
    assert state.total.tolist() == [7]  # (3 + 1) + (the longer form 2 + 1)
    for token, progress in ((4, 1), (5, 2), (4, 1), (5, 2), (6, 3), (8, 5), (9, 6)):
        assert state.progress(torch.tensor([[token]])).item() == progress
        state.advance(torch.tensor([token]))
    assert bool(state.ready().item()) and not bool(state.met.all().item())  # EOS may come: it ends the word
    assert state.progress(torch.tensor([[EOS]])).item() == 7


@pytest.mark.unit
def test_a_phrase_is_met_as_a_whole_word_and_a_glued_form_only_after_an_opening_piece():
    """pieces: 10 "▁under" 11 "stand" 12 "s" (continues) 13 "▁(" (opens) 14 "▁the"."""
    pieces = WordPieces.of(["<pad>", "<unk>", "<s>", "</s>"] + ["x"] * 6 + ["▁under", "stand", "s", "▁(", "▁the"],
                           torch.device("cpu"))
    word = [[[[10, 11], [11]]]]  # "understand" alone, or glued after an opening piece
    for seq, met in (([10, 11, 14], True), ([10, 11, 12], False), ([14, 11, 14], False), ([13, 11, 14], True)):
        state = ConstraintState(word, torch.device("cpu"), pieces, bos=2)
        for t in seq:
            state.advance(torch.tensor([t]))
        assert bool(state.met.all().item()) == met, seq


# ---- properties on a real model -----------------------------------------------------------------
phrase = st.lists(st.integers(4, 49), min_size=1, max_size=3)
group = st.lists(phrase, min_size=1, max_size=2)


@pytest.mark.integration
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(groups=st.lists(st.lists(group, max_size=3), min_size=1, max_size=3), beam=st.integers(1, 4), seed=st.integers(0, 1000),
       prefix=st.booleans())
def test_every_constraint_that_fits_is_in_the_best_output_whatever_shares_the_batch(real_model, groups, beam, seed, prefix):
    g = torch.Generator().manual_seed(seed)
    B_ = len(groups)
    src = torch.randint(4, 50, (B_, 6), generator=g)
    src[:, -1] = real_model.config.eos_id
    given_prefix = torch.randint(4, 50, (B_, 2), generator=g) if prefix else None
    room = max((sum(max(len(a) for a in grp) for grp in groups_b) for groups_b in groups), default=0)
    opts = SearchOptions(beam=beam, nbest=beam, max_len_a=0.0, max_len_b=room + 3 + (2 if prefix else 0))
    with torch.no_grad():
        out = search(real_model, src, opts, prefix=given_prefix, constraints=groups)
        for b in range(B_):
            assert satisfied(out[b][0].tokens, groups[b])
            if prefix:
                assert all(h.tokens[:2] == given_prefix[b].tolist() for h in out[b])
        alone = search(real_model, src[:1, :], opts, prefix=None if given_prefix is None else given_prefix[:1], constraints=groups[:1])
    assert [h.tokens for h in alone[0]] == [h.tokens for h in out[0]]


# ---- text: glossary and constraints files -------------------------------------------------------
@pytest.mark.unit
def test_the_glossary_matches_whole_words_case_sensitively_by_default(tmp_path):
    path = tmp_path / "g.tsv"
    path.write_text("# term\tforms\nDios\tGod\ncielo\theaven\theavens\nluz del día\tdaylight\n\n", encoding="utf-8")
    glossary = Glossary.read(path)
    assert glossary.match("Dios creó el cielo.") == ["God", ["heaven", "heavens"]]
    assert glossary.match("Diosa y cielos, dios.") == []  # not whole words; another case
    assert glossary.match("(Dios) a la luz del día") == ["God", "daylight"]
    assert Glossary.read(path, ignore_case=True).match("dios") == ["God"]
    path.write_text("Dios God\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"g.tsv:1: expected 'source term<TAB>target term'"):
        Glossary.read(path)


@pytest.mark.unit
def test_a_byte_order_mark_is_not_read_as_text_in_a_glossary_or_a_constraints_file(tmp_path):
    glossary = tmp_path / "g.tsv"
    glossary.write_bytes(codecs.BOM_UTF8 + "Dios\tGod\ncielo\theaven\n".encode())  # as Windows editors save UTF-8
    assert Glossary.read(glossary).match("Dios creó el cielo.") == ["God", "heaven"]  # the first entry too
    constraints = tmp_path / "c.jsonl"
    constraints.write_bytes(codecs.BOM_UTF8 + b'["God"]\n[]\n')
    lines = LockstepLines(constraints, "<stdin>", "--constraints", "one JSON list per input line")
    assert [parse_constraints_line(line, f"c.jsonl:{k + 1}") for k, line in enumerate(lines.take(0, 2))] == [["God"], []]


@pytest.mark.unit
def test_a_source_term_given_twice_is_warned_about_naming_both_lines_and_the_first_kept(tmp_path, capsys):
    path = tmp_path / "g.tsv"
    path.write_text("Dios\tGod\ncielo\theaven\nDios\tDeity\n", encoding="utf-8")
    assert Glossary.read(path).match("Dios y cielo") == ["God", "heaven"]
    err = capsys.readouterr().err
    assert f"warning: {path}:3: duplicate source term 'Dios' (first at {path}:1)" in err
    path.write_text("Dios\tGod\ndios\tdeity\n", encoding="utf-8")
    assert Glossary.read(path).match("dios Dios") == ["God", "deity"]  # case-sensitive: two terms, no warning
    assert "duplicate" not in capsys.readouterr().err
    assert Glossary.read(path, ignore_case=True).match("dios") == ["God"]  # one term whatever its case
    assert f"{path}:2: duplicate source term 'dios' (first at {path}:1)" in capsys.readouterr().err


@pytest.mark.unit
def test_a_constraints_line_is_a_json_list_of_phrases_or_of_forms():
    assert parse_constraints_line('["God", ["heaven", "heavens"]]\n', "c:1") == ["God", ["heaven", "heavens"]]
    assert parse_constraints_line("\n", "c:2") == [] and parse_constraints_line("[]", "c:3") == []
    for bad, words in (("God", "c:4: not JSON"), ('{"a": 1}', "expected a JSON list"), ('["", "x"]', "item 1"), ("[[]]", "item 1")):
        with pytest.raises(InputError, match=words):
            parse_constraints_line(bad, "c:4")


# ---- the translator, the CLI -------------------------------------------------------------------------
@pytest.mark.integration
def test_a_phrase_matches_however_the_tokenizer_splits_it_in_context(tiny_checkpoint):
    """A word alone and the same word attached to a bracket split into different pieces; both are
    forms of its constraint."""
    from seqtool.translate import Translator

    t = Translator.load(tiny_checkpoint, device="cpu", beam=2, max_len_a=0.0, max_len_b=8)
    word = next(w for w in ("abc", "hello", "abcd", "bad", "face") if t.tokenizer.pieces(w) != t.tokenizer.pieces("(" + w)[1:])
    (forms,) = t.constraint_ids([word])
    alone, attached = t.tokenizer.encode(word), t.tokenizer.encode("(" + word)[len(t.tokenizer.encode("(")):]
    assert alone in forms and attached in forms and alone != attached
    assert satisfied(t.tokenizer.encode("x (" + word + " y"), [forms]) and satisfied(t.tokenizer.encode("x " + word), [forms])


def _run(ckpt, data: bytes, *args):
    return subprocess.run([sys.executable, "-m", "seqtool", "translate", "-c", str(ckpt), "--beam", "3", "--max-len-a", "0", "--max-len-b", "12",
                           "--device", "cpu", "--precision", "fp32", *args], input=data, capture_output=True, timeout=120)


@pytest.mark.system
def test_cli_constraints_and_glossary_are_kept_and_equal_the_python_api(tiny_checkpoint, tmp_path):
    from seqtool.translate import Translator

    lines = ["a b c", "d e f", "g h", ""]
    (tmp_path / "c.jsonl").write_text('["h g"]\n\n[["e e", "f f"]]\n\n', encoding="utf-8")
    (tmp_path / "g.tsv").write_text("d\tc a\n", encoding="utf-8")
    result = _run(tiny_checkpoint, ("\n".join(lines) + "\n").encode(), "--constraints", str(tmp_path / "c.jsonl"),
                  "--glossary", str(tmp_path / "g.tsv"))
    assert result.returncode == 0, result.stderr.decode()
    out = result.stdout.decode().split("\n")[:4]
    assert "h g" in out[0] and "c a" in out[1] and ("e e" in out[2] or "f f" in out[2]) and out[3] == ""
    t = Translator.load(tiny_checkpoint, device="cpu", precision="fp32", beam=3, max_len_a=0.0, max_len_b=12)
    assert t.translate(lines, constraints=[["h g"], ["c a"], [["e e", "f f"]], []]) == out


@pytest.mark.system
def test_cli_refuses_bad_constraints_naming_file_and_line_and_warns_when_one_does_not_fit(tiny_checkpoint, tmp_path):
    (tmp_path / "c.jsonl").write_text('["a"]\nnot json\n', encoding="utf-8")
    result = _run(tiny_checkpoint, b"a\nb\n", "--constraints", str(tmp_path / "c.jsonl"))
    err = result.stderr.decode().strip().splitlines()
    assert result.returncode == 1 and err[-1].startswith(f"error: {tmp_path / 'c.jsonl'}:2: not JSON"), err
    (tmp_path / "c.jsonl").write_text(json.dumps(["a b c d e f g h a b c d e f g h"]) + "\n", encoding="utf-8")
    result = _run(tiny_checkpoint, b"a\n", "--constraints", str(tmp_path / "c.jsonl"), "--max-len-a", "0", "--max-len-b", "3")
    assert result.returncode == 0 and result.stdout.decode().count("\n") == 1
    assert "line 1: the translation lacks a constraint" in result.stderr.decode()
    result = _run(tiny_checkpoint, b"a\n", "--constraints", str(tmp_path / "c.jsonl"), "--sampling")
    assert result.returncode == 1 and "drop --sampling" in result.stderr.decode()


@pytest.mark.integration
def test_an_ensemble_keeps_constraints_in_every_n_best_output_that_has_room(real_model):
    from seqtool.ensemble import Ensemble

    torch.manual_seed(4)
    other = Transformer(model_config_for("tiny", vocab_size=50, dropout=0.0)).eval()
    src = torch.tensor([[5, 6, 7, 8, real_model.config.eos_id]])
    groups = [[[[11, 12]], [[30], [31, 32]]]]
    with torch.no_grad():
        hyps = search(Ensemble([real_model, other]), src, SearchOptions(beam=4, nbest=2, max_len_a=0.0, max_len_b=12), constraints=groups)[0]
    assert len(hyps) == 2 and all(satisfied(h.tokens, groups[0]) for h in hyps)
