"""Tokenizer.encode_with_offsets / decode_with_offsets: each piece's character range in the text, on
real sentencepiece models trained here (with and without byte fallback), non-ASCII text included."""

import gzip
import pathlib

import pytest
from hypothesis import given, settings, strategies as st

from seqtool.config import TokenizerConfig
from seqtool.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, train_tokenizer

pytestmark = pytest.mark.unit

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "bible-es-en"
EXTRA = ["Grüße aus München, schön und süß.", "Über die Brücke gehen Mädchen.", "Niño, acción, canción, pingüino.",
         "東京は日本の首都です。", "我爱北京天安门。"]
SAMPLES = ["Él dijo: «Ñandú» — ¿qué pasó?", "Grüße aus Köln, Straße 5.", "東京は首都です。", "  leading  and\ttabs  ",
           "emoji 🎉 and ñ", "a", "", "x\u0301y combining", "中文 mixed with English.", "Ωμέγα ζ"]


def train(tmp: pathlib.Path, byte_fallback: bool) -> Tokenizer:
    lines = []
    for lang in ("es", "en"):
        with gzip.open(DATA / f"train.{lang}.gz", "rt", encoding="utf-8") as handle:
            lines += [next(handle).strip() for _ in range(300)]
    corpus = tmp / "corpus.txt"
    corpus.write_text("\n".join(lines + EXTRA * 3) + "\n", encoding="utf-8")
    config = TokenizerConfig(vocab_size=400, byte_fallback=byte_fallback, character_coverage=0.995 if byte_fallback else 1.0)
    return Tokenizer.load(train_tokenizer([corpus], str(tmp / "spm"), config))


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[bool, Tokenizer]:
    """Two models trained on the same lines: with byte fallback (byte_fallback: True) and without."""
    return {fallback: train(tmp_path_factory.mktemp("spm"), fallback) for fallback in (True, False)}


@pytest.fixture(params=[True, False], ids=["byte-fallback", "no-byte-fallback"])
def tokenizer(request, models):
    return models[request.param]


def check_encode(tokenizer: Tokenizer, text: str) -> None:
    ids, ranges = tokenizer.encode_with_offsets(text)
    assert ids == tokenizer.encode(text)
    assert len(ranges) == len(ids)
    previous_end = 0
    for (start, end), piece in zip(ranges, (tokenizer.sp.id_to_piece(i) for i in ids)):
        assert 0 <= start <= end <= len(text)
        assert start >= previous_end  # in order, never overlapping
        previous_end = end
        covered = text[start:end]
        if piece.startswith("<0x") or piece == "<unk>" or not covered:
            continue
        # what the piece covers is the piece itself, its '▁' for whitespace before the word
        assert covered.lstrip() == piece.lstrip("▁") or tokenizer.sp.normalize(covered).lstrip("▁") == piece.lstrip("▁")
    # every character that is not whitespace belongs to exactly one piece
    solid = [k for k, c in enumerate(text) if not c.isspace()]
    assert all(sum(start <= k < end for start, end in ranges) == 1 for k in solid)


def check_decode(tokenizer: Tokenizer, ids: list[int]) -> None:
    text, ranges = tokenizer.decode_with_offsets(ids)
    assert text == tokenizer.decode(ids)
    assert len(ranges) == len(ids)
    previous_end = 0
    for (start, end), i in zip(ranges, ids):
        assert previous_end <= start <= end <= len(text)
        previous_end = end
        if i in (PAD_ID, BOS_ID, EOS_ID):
            assert start == end
    # the ranges tile the text: concatenated, they are the text
    assert "".join(text[a:b] for a, b in ranges) == text


@pytest.mark.parametrize("text", SAMPLES)
def test_encode_offsets_cover_the_text_piece_by_piece(tokenizer, text):
    check_encode(tokenizer, text)


def test_byte_fallback_pieces_cover_the_whole_character(models):
    tok = models[True]
    text = "龍 dragon"  # not in the training text: written as UTF-8 byte pieces
    ids, ranges = tok.encode_with_offsets(text)
    pieces = [tok.sp.id_to_piece(i) for i in ids]
    byte_ranges = [r for p, r in zip(pieces, ranges) if p.startswith("<0x")]
    assert len(byte_ranges) == 3  # three UTF-8 bytes
    assert [r for r in byte_ranges if r[0] != r[1]] == [(0, 1)]  # the character belongs to the last of them
    text_back, back = tok.decode_with_offsets(ids)
    assert text_back == text
    assert [text_back[a:b] for a, b in back if a != b][0] == "龍"


@pytest.mark.parametrize("text", SAMPLES)
def test_decode_offsets_tile_the_normal_decode(tokenizer, text):
    ids = tokenizer.encode(text)
    check_decode(tokenizer, ids)
    check_decode(tokenizer, [BOS_ID, *ids, EOS_ID, PAD_ID])  # special ids: empty ranges, one per id


def test_unknown_ids_decode_with_their_mark(models):
    tok = models[False]
    ids = [UNK_ID, *tok.encode("hola"), UNK_ID]
    text, ranges = tok.decode_with_offsets(ids)
    assert text == tok.decode(ids)
    assert "⁇" in text[ranges[0][0]:ranges[0][1]]


def test_lone_surrogates_keep_offsets_in_the_given_text(tokenizer):
    text = "ab\udc80cd éf"
    ids, ranges = tokenizer.encode_with_offsets(text)
    assert ids == tokenizer.encode_batch([text])[0]
    assert max(end for _, end in ranges) <= len(text)


@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("abcñüßé東京 \t.,¿?") + ["\u2028", "\xa0"]), max_size=40))
def test_any_text(models, text):
    for tok in models.values():
        check_encode(tok, text)
        check_decode(tok, tok.encode(text))
