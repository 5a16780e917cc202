"""Translation as a stream: one line out per line in, in order, whatever the input looks like."""

import io
import subprocess
import sys

import pytest

from seqtool.config import Sampling, SearchOptions, TranslateConfig
from seqtool.device import cpu_bf16_instructions
from seqtool.errors import ConfigError
from seqtool.files import format_translation, translate_file
from seqtool.translate import Translator, settings

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def translator(tiny_checkpoint):
    return Translator.load(tiny_checkpoint, beam=2, max_len_a=0.0, max_len_b=8, batch_size=3, device="cpu")


def test_order_is_preserved_whatever_the_batching(translator, tiny_checkpoint):
    lines = ["a b c d e f g h", "a", "", "c d", "e f g", "j i h g f e d c b a", "b"] * 3
    expected = [translator.translate([line])[0] for line in lines]  # one at a time
    for batch_size, max_tokens in ((3, 0), (64, 0), (1, 0), (64, 12)):
        t = Translator.load(tiny_checkpoint, beam=2, max_len_a=0.0, max_len_b=8, batch_size=batch_size, max_tokens=max_tokens, device="cpu", chunk_lines=5)
        assert t.translate(lines) == expected


def test_empty_lines_give_empty_lines(translator):
    out = translator.translate(["", "a b", ""])
    assert out[0] == "" and out[2] == ""


def test_long_lines_are_cut_into_pieces_with_a_warning_never_cropped(translator, capsys):
    out = translator.translate(["a " * 200, "b"])
    assert len(out) == 2
    err = capsys.readouterr().err
    assert "cropped" not in err and "input line 1: 200 tokens with too few sentence ends to cut at: translated in" in err


def _run_cli(ckpt, data: bytes, *args):
    return subprocess.run([sys.executable, "-m", "seqtool", "translate", "-c", str(ckpt), "--beam", "2", "--max-len-a", "0", "--max-len-b", "6",
                           "--device", "cpu", *args], input=data, capture_output=True, timeout=120)


def test_cli_writes_one_line_per_input_line(tiny_checkpoint):
    data = "a b\r\nc\u2028d\n\n\x85e f\ng\rh\nlast line without newline".encode()
    result = _run_cli(tiny_checkpoint, data)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().count("\n") == 6
    assert result.stdout.decode().split("\n")[2] == ""  # the empty line
    assert b"Traceback" not in result.stderr


def test_cli_replaces_invalid_utf8_with_a_warning(tiny_checkpoint):
    result = _run_cli(tiny_checkpoint, b"a b\n\xff\xfe c\nd\n")
    assert result.returncode == 0
    assert result.stdout.count(b"\n") == 3
    assert b"<stdin>:2: invalid UTF-8" in result.stderr


def test_nbest_format(tiny_checkpoint):
    result = _run_cli(tiny_checkpoint, b"a b\n\nc\n", "--nbest", "2")
    rows = result.stdout.decode().splitlines()
    assert len(rows) == 6
    fields = [r.split("\t") for r in rows]
    assert [f[0] for f in fields] == ["0", "0", "1", "1", "2", "2"]
    assert all(len(f) == 3 for f in fields)
    assert float(fields[0][1]) >= float(fields[1][1])


def test_print_scores_is_one_line_per_input(tiny_checkpoint):
    result = _run_cli(tiny_checkpoint, b"a b\nc\n", "--print-scores")
    rows = result.stdout.decode().splitlines()
    assert [r.split("\t")[0] for r in rows] == ["0", "1"]


def test_head_ends_quietly(tiny_checkpoint):
    cmd = (f"yes 'a b c' | head -n 5000 | {sys.executable} -m seqtool translate -c {tiny_checkpoint} --beam 1 "
           f"--max-len-a 0 --max-len-b 4 --device cpu | head -n 1")
    result = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, timeout=120)
    assert result.stdout.count(b"\n") == 1
    assert b"Traceback" not in result.stderr and b"Broken pipe" not in result.stderr


def test_output_file_is_written_atomically(tiny_checkpoint, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("a b\nc d\n")
    out = tmp_path / "out.txt"
    result = _run_cli(tiny_checkpoint, b"", "--input", str(src), "--output", str(out))
    assert result.returncode == 0, result.stderr.decode()
    assert out.read_text().count("\n") == 2
    assert [p.name for p in tmp_path.iterdir()] == sorted(["in.txt", "out.txt"]) or set(p.name for p in tmp_path.iterdir()) == {"in.txt", "out.txt"}


def test_translate_file_streams_from_a_file(tiny_checkpoint, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("a\nb c\n\n")
    buffer = io.StringIO()
    n = translate_file(tiny_checkpoint, *settings(beam=1, max_len_a=0.0, max_len_b=5, device="cpu"), TranslateConfig(), src, buffer)
    assert n == 3 and buffer.getvalue().count("\n") == 3


def test_format_pads_nbest_for_empty_lines(translator):
    t = translator.translate_chunk(0, [""])[0]
    assert format_translation(t, TranslateConfig(), 3) == "0\t0.0000\t\n" * 3


def test_a_request_s_search_options_override_the_loaded_ones_for_that_call_only(translator, tiny_checkpoint):
    """What a server does per request: the translator loads once (beam 2 here); a call may ask for
    another search, and gets exactly what a translator loaded with those settings gives."""
    lines = ["a b c d", "e f", "", "g h i j k"]
    for asked in (SearchOptions(beam=1, max_len_a=0.0, max_len_b=8), SearchOptions(beam=4, nbest=3, max_len_a=0.0, max_len_b=8, lenpen=0.5),
                  SearchOptions(nbest=2, max_len_a=0.0, max_len_b=8, sampling=Sampling(topk=3, seed=11))):
        fields = dict(beam=asked.beam, nbest=asked.nbest, max_len_a=asked.max_len_a, max_len_b=asked.max_len_b, lenpen=asked.lenpen)
        if asked.sampling is not None:
            fields.update(sampling=True, topk=3, seed=11)
        loaded = Translator.load(tiny_checkpoint, device="cpu", batch_size=3, **fields)
        assert loaded.options == asked
        assert translator.translate(lines, asked) == loaded.translate(lines)
    assert translator.options == SearchOptions(beam=2, max_len_a=0.0, max_len_b=8)  # the loaded settings are untouched
    nbest = translator.translate(lines, SearchOptions(beam=3, nbest=3, max_len_a=0.0, max_len_b=8))
    assert all(isinstance(t, list) and len(t) == 3 for t in nbest)


@pytest.mark.parametrize("make, message", [
    (lambda: SearchOptions(beam=0), "--beam must be in [1, 1024], got 0"),
    (lambda: SearchOptions(beam=2, nbest=3), "--nbest must be between 1 and --beam (2)"),
    (lambda: SearchOptions(max_len_a=0.0, max_len_b=0), "allow no output token"),
    (lambda: Sampling(topp=0.0), "--topp must be in (0, 1], got 0"),
    (lambda: settings(beam=2, nbest=3), "--nbest must be between 1 and --beam (2)"),  # one check, both ways in
])
def test_search_options_are_validated_where_they_are_made(make, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        make()


@pytest.mark.parametrize("precision, quantize", [("fp32", "none"), ("bf16", "none"), ("fp32", "int8")])
def test_a_sentence_translates_the_same_whatever_shares_its_batch(tiny_checkpoint, precision, quantize):
    """What the server promises: alone, or batched with longer and shorter sentences (so padded to
    another length), a line gets the same hypotheses, in every number format, and the same scores:
    bit for bit in bf16; in fp32 a softmax or matrix product over a longer padded row may round
    the last bit differently; int8 rounds each activation row by its own maximum
    (kernels.Int8Linear: no neighbour changes a row's scale), but such a last-bit difference can
    move one rounding step: about 1e-3 in a score. (torch's dynamic quantization, one scale per
    call, changed the hypotheses themselves.)"""
    lines = ["a b c d e f g h i j k l", "a", "c d e", "j i h g f e d c b a b c d e f", "b c", "e f g h"]
    # (bf16 on a CPU with AMX: oneDNN picks its kernel by the number of rows, so another batch sums in
    # another order: the hypotheses stay, a score moves by ~1e-3, measured on an AMX EPYC 2026-12-07)
    lines += [" ".join("abcdefgh"[(i * j + i) % 8] for j in range(1 + i % 9)) for i in range(18)]
    t = Translator.load(tiny_checkpoint, device="cpu", precision=precision, quantize=quantize, beam=3, nbest=2,
                                                       max_len_a=0.0, max_len_b=10)
    amx = "AMX" in cpu_bf16_instructions()
    together = t.translate_chunk(0, lines)
    among_long = t.translate_chunk(0, ["h g f e d c b a " * 6] * 2 + lines[::2])[2:]
    for k, line in enumerate(lines):
        alone = t.translate_chunk(k, [line])[0]
        others = [together[k]] + ([among_long[k // 2]] if k % 2 == 0 else [])
        for other in others:
            assert alone.texts == other.texts
            scores = [h.score for h in other.hypotheses]
            if quantize == "int8" or (precision == "bf16" and amx):
                want = pytest.approx(scores, abs=1e-2)
            else:
                want = scores if precision == "bf16" else pytest.approx(scores, rel=1e-5)
            assert [h.score for h in alone.hypotheses] == want


def test_target_prefixes_start_their_translations_and_an_empty_one_changes_nothing(translator, tiny_checkpoint, tmp_path):
    """--target-prefix FILE: one prefix per input line; the output line starts with it (as the
    tokenizer writes it back), an empty prefix line leaves its line as without the option; the
    Python API's target_prefix= gives the same."""
    lines = ["a b c", "d e", "f", ""]
    prefixes = ["h g", "", "b b b", "c"]
    plain = translator.translate(lines)
    got = translator.translate(lines, target_prefix=prefixes)
    assert got[1] == plain[1] and got[3] == ""  # no prefix; an empty source line stays empty
    assert got[0].startswith("h g") and got[2].startswith("b b b")
    assert translator.translate("a b c", target_prefix="h g") == got[0]
    (tmp_path / "src").write_text("\n".join(lines) + "\n")
    (tmp_path / "pre").write_text("\n".join(prefixes) + "\n")
    result = _run_cli(tiny_checkpoint, b"", "--input", str(tmp_path / "src"), "--target-prefix", str(tmp_path / "pre"))
    assert result.returncode == 0, result.stderr.decode()
    cli = Translator.load(tiny_checkpoint, beam=2, max_len_a=0.0, max_len_b=6, device="cpu")
    assert result.stdout.decode().split("\n")[:4] == cli.translate(lines, target_prefix=prefixes)
    # stdin works in lockstep too, a chunk at a time
    result = _run_cli(tiny_checkpoint, ("\n".join(lines) + "\n").encode(), "--target-prefix", str(tmp_path / "pre"))
    assert result.returncode == 0 and result.stdout.decode().split("\n")[:4] == cli.translate(lines, target_prefix=prefixes)


@pytest.mark.parametrize("prefix_lines, words", [(["x"], "ends after line 1"), (["x"] * 5, "has more lines")])
def test_a_prefix_file_of_another_length_is_one_line_naming_both(tiny_checkpoint, tmp_path, prefix_lines, words):
    (tmp_path / "pre").write_text("\n".join(prefix_lines) + "\n")
    result = _run_cli(tiny_checkpoint, b"a\nb\nc\n", "--target-prefix", str(tmp_path / "pre"))
    err = result.stderr.decode().strip()
    assert result.returncode == 1 and "Traceback" not in err, err
    err = err.splitlines()[-1]  # (after the precision the model decodes in)
    assert err.startswith("error: ") and words in err and str(tmp_path / "pre") in err and "--target-prefix" in err
    (tmp_path / "src").write_text("a\nb\nc\n")
    result = _run_cli(tiny_checkpoint, b"", "--input", str(tmp_path / "src"), "--target-prefix", str(tmp_path / "pre"))
    assert result.returncode == 1 and "--target-prefix needs one prefix per input line" in result.stderr.decode()


def test_min_len_reaches_the_python_api_and_a_request_and_bounds_every_output(translator, tiny_checkpoint):
    """--min-len (an option added by declaring it once, in config.py): the Python API's load and a
    per-call SearchOptions both take it, and no hypothesis is shorter, where the cap allows it."""
    from seqtool.serving.schemas import LibreRequest, TranslateIn

    lines = ["a b c d", "e f", "g h i j k"]
    t = Translator.load(tiny_checkpoint, beam=2, nbest=2, min_len=6, max_len_a=0.0, max_len_b=8, device="cpu")
    assert all(len(h.tokens) >= 6 for tr in t.translate_chunk(0, lines) for h in tr.hypotheses)
    asked = SearchOptions(beam=2, nbest=2, min_len=7, max_len_a=0.0, max_len_b=8)
    assert all(len(h.tokens) >= 7 for tr in translator.translate_chunk(0, lines, asked) for h in tr.hypotheses)
    assert TranslateIn(segments=["a"], min_len=3).min_len == 3 and LibreRequest(q="a", min_len=3).min_len == 3
