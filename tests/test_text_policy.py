"""One text policy for every front-end (textpolicy.TextPolicy): the CLI's best and n-best lines, the
Python API, LibreTranslate's /translate with and without alternatives, and /v1/translate with and
without n-best all give the same translation of the same line: URLs and e-mail addresses verbatim
and apart from the words around them, text with no letter as it was, long lines cut into sentences
and joined back."""

import subprocess
import sys

import httpx
import pytest
from hypothesis import given, settings, strategies as st

from servers import FP32, Server
from seqtool.documents import placeholders

pytestmark = pytest.mark.system

LONG = " ".join(["Ab c d e f."] * 8)  # past the tiny model's 31 positions: cut into sentences
LINES = ["a b https://example.com/x?q=1 c", "d e jose@localhost, f", "2024", "[22]", "3.14 %", "g h user@example.org.",
         LONG, "visit www.example.org/a_(b) now", "c a"]


@pytest.fixture(scope="module")
def tiny_translator(tiny_checkpoint):
    from seqtool.translate import Translator

    with Translator.load(tiny_checkpoint, device="cpu", precision="fp32", threads=2) as t:
        yield t


def cli(checkpoint, *args) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "seqtool", "translate", "-c", str(checkpoint), *FP32, "--beam", "2", *args],
                         input="\n".join(LINES) + "\n", capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "cropped" not in out.stderr  # (the long line was cut into sentences, each within the model's positions)
    return out.stdout.splitlines()


def test_every_front_end_gives_the_same_translation_with_the_same_handling(tiny_checkpoint):
    from seqtool.translate import Translator

    got = {"cli": cli(tiny_checkpoint)}
    rows = [row.split("\t") for row in cli(tiny_checkpoint, "--nbest", "2")]
    got["cli --nbest 2"] = [rows[2 * k][2] for k in range(len(LINES))]
    assert all(rows[2 * k][0] == rows[2 * k + 1][0] == str(k) for k in range(len(LINES)))
    with Translator.load(tiny_checkpoint, device="cpu", precision="fp32", threads=2, beam=2, max_len_a=0.0, max_len_b=8) as t:
        got["python"] = t.translate(LINES)
    s = Server(tiny_checkpoint, "--beam", "2")
    try:
        def post(path, body):
            r = httpx.post(f"{s.url}{path}", json=body, timeout=120)
            assert r.status_code == 200, r.text
            return r.json()

        got["/translate"] = post("/translate", {"q": LINES, "source": "auto", "target": "tgt"})["translatedText"]
        libre = post("/translate", {"q": LINES, "alternatives": 1})
        got["/translate alternatives"] = libre["translatedText"]
        got["/v1/translate"] = [x["text"] for x in post("/v1/translate", {"segments": LINES})["translations"]]
        native = post("/v1/translate", {"segments": LINES, "nbest": 2})["translations"]
        got["/v1/translate nbest"] = [x["text"] for x in native]
    finally:
        s.stop()
    for name, outputs in got.items():
        assert outputs == got["cli"], f"{name} differs from the CLI"
    for line, out in zip(LINES, got["cli"]):
        for a, b in placeholders(line):  # verbatim, and read back as itself (nothing glued to it)
            assert line[a:b] in [out[x:y] for x, y in placeholders(out)], (line, out)
        if not any(c.isalpha() for c in line):
            assert out == line
    alternatives = [alts for alts in libre["alternatives"]]
    assert len(alternatives) == len(LINES) and all(len(a) <= 1 for a in alternatives)
    for line, alts, first in zip(LINES, alternatives, native):
        for alt in alts + [x["text"] for x in first.get("alternatives", [])]:
            for a, b in placeholders(line):  # alternatives under the same policy
                assert line[a:b] in [alt[x:y] for x, y in placeholders(alt)], (line, alt)


# --- a line the model cannot take whole (issue 42) ------------------------------------------------------
WORDS = " ".join("abcdefghij"[(k * 7) % 10] * (1 + k % 4) for k in range(400))  # ~1,000 tokens, no sentence end


def test_a_long_line_without_sentence_ends_is_translated_in_pieces_never_cropped(tiny_checkpoint):
    from seqtool import pipeline, textpolicy
    from seqtool.translate import Translator

    with Translator.load(tiny_checkpoint, device="cpu", precision="fp32", threads=2, beam=1, max_len_a=0.0, max_len_b=4) as t:
        for mode in ("auto", "never"):  # (never: the user's choice, prefixes, constraints, alignments)
            policy = textpolicy.TextPolicy(mode)
            plan = textpolicy.unit_segments(t, textpolicy.units_of([WORDS], policy), pipeline.lines(0, [WORDS]), policy)
            most = textpolicy.budget(t, mode)
            assert len(plan.segments) > 1 and all(0 < len(s.ids) <= most + 1 for s in plan.segments)
            assert "".join(a + b for a, b in plan.joints[0].pieces) == WORDS  # every word goes to the model
            assert len(plan.notes) == 1 and f"pieces of at most {most} tokens" in plan.notes[0][1]
        [out] = t.translate_lines(0, [WORDS])
        assert len(out.hypotheses[0].tokens) > t.max_src  # more than one cropped segment could give
    cli_out = subprocess.run([sys.executable, "-m", "seqtool", "translate", "-c", str(tiny_checkpoint), *FP32, "--beam", "1",
                              "--print-alignment"], input=WORDS + "\nc a\n", capture_output=True, text=True, timeout=300)
    assert cli_out.returncode == 0, cli_out.stderr
    assert "cropped" not in cli_out.stderr and "input line 1: " in cli_out.stderr and " pieces of at most " in cli_out.stderr
    rows = cli_out.stdout.splitlines()
    assert len(rows) == 2  # one line out per line in
    pairs = [tuple(map(int, p.split("-"))) for p in rows[0].split("\t")[-1].split()]
    assert max(a for a, _ in pairs) > 31  # the alignment covers the whole line, piece after piece


def test_a_server_response_says_when_it_cut_a_text_or_reached_the_length_cap(tiny_checkpoint):
    from seqtool.translate import Translator

    with Translator.load(tiny_checkpoint, device="cpu", precision="fp32", threads=2, beam=2, max_len_a=0.0, max_len_b=8) as t:
        capped = [bool(x.capped) for x in t.translate_lines(0, ["c a", "a b c d e f g h"])]
    s = Server(tiny_checkpoint, "--beam", "2")
    try:
        libre = httpx.post(f"{s.url}/translate", json={"q": [WORDS, "c a"]}, timeout=120).json()
        assert "text 1: " in libre["warnings"][0] and " pieces of at most " in libre["warnings"][0]
        assert not any(w.startswith("text 2: ") and "pieces" in w for w in libre["warnings"])
        native = httpx.post(f"{s.url}/v1/translate", json={"segments": ["c a", "a b c d e f g h"]}, timeout=120).json()
        told = [any(w.startswith(f"segment {k + 1}: ") and "length cap" in w for w in native.get("warnings", [])) for k in range(2)]
        assert told == capped  # said where, and only where, the output reached its cap
        html = httpx.post(f"{s.url}/v1/translate", json={"segments": [f"<p>{WORDS}</p>"], "format": "html"}, timeout=120).json()
        assert any(w.startswith("text 1: ") and "pieces" in w for w in html["warnings"])
    finally:
        s.stop()


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="abcdefghij \t\u00e9\u4e2d", min_size=1, max_size=400), st.integers(1, 40))
def test_budgeted_pieces_keep_every_character_and_fit_the_budget(tiny_translator, text, limit):
    from seqtool import textpolicy

    pieces, _ = textpolicy.budgeted(tiny_translator, [(text, "")], limit)
    assert "".join(a + b for a, b in pieces) == text
    # (a piece is re-read alone: a word cut in two may take one more token at the cut; no piece is less than a character)
    sizes = tiny_translator.tokenizer.encode_batch([a for a, _ in pieces])
    assert all(len(ids) <= limit + 1 or len(a) == 1 for ids, (a, _) in zip(sizes, pieces)), list(zip(pieces, map(len, sizes)))
