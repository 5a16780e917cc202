"""Every bad input gets one clear line on stderr and a non-zero exit, and nothing the user had is lost.

Each test goes through the command line (in-process with CliRunner, or a real subprocess where a
signal or a closed file descriptor is the point) and checks the exit status, the one `error:`
line, the absence of a traceback, and that files which existed before are byte-identical after.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from seqtool import checkpoint
from seqtool.cli import app
from seqtool.config import TokenizerConfig, TranslateConfig
from seqtool.data import ParallelDataset
from seqtool.tokenizer import Tokenizer, train_tokenizer
from seqtool.files import translate_file
from seqtool.translate import settings

runner = CliRunner()
PYTHON = [sys.executable, "-m", "seqtool"]
TRANSLATE = ["--beam", "1", "--max-len-a", "0", "--max-len-b", "4", "--device", "cpu", "--precision", "fp32"]  # fp32: stderr holds only what a test looks for
TRAIN = ["--arch", "tiny", "--max-tokens", "600", "--threads", "1", "--device", "cpu"]


def cli(*args, input=None):
    return runner.invoke(app, [str(a) for a in args], input=input)


def one_error(result, *fragments, code=1) -> str:
    """The run failed with `code`, printed exactly one `error:` line holding every fragment, no traceback."""
    err = result.stderr
    assert result.exit_code == code, (result.exit_code, err, result.exception)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert "Traceback" not in err
    return lines[0]


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def corpus(tiny_checkpoint, tmp_path_factory) -> Path:
    """A private copy of the tiny checkpoint's corpus and tokenizer (the session fixture stays untouched)."""
    d = tmp_path_factory.mktemp("errors")
    for name in ("train.src", "train.tgt", "valid.src", "valid.tgt", "spm.model"):
        shutil.copy(tiny_checkpoint.parent / name, d / name)
    return d


@pytest.fixture(scope="module")
def data_dir(corpus) -> Path:
    result = cli("binarize", "--src", "src", "--tgt", "tgt", "--train", corpus / "train", "--valid", corpus / "valid",
                 "--tokenizer", corpus / "spm.model", "--out", corpus / "bin")
    assert result.exit_code == 0, result.stderr
    return corpus / "bin"


def write_pair(directory: Path, prefix: str, src: bytes, tgt: bytes) -> str:
    (directory / f"{prefix}.src").write_bytes(src)
    (directory / f"{prefix}.tgt").write_bytes(tgt)
    return str(directory / prefix)


def binarize_cli(corpus: Path, train: str, out: Path, *extra):
    return cli("binarize", "--src", "src", "--tgt", "tgt", "--train", train, "--tokenizer", corpus / "spm.model", "--out", out, *extra)


# ---- inputs ---------------------------------------------------------------------------------

@pytest.mark.integration
def test_missing_and_unreadable_inputs(tiny_checkpoint, corpus, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_error(binarize_cli(corpus, "nope", tmp_path / "bin"), "nope.src: no such file")
    one_error(cli("translate", "-c", tiny_checkpoint, "--input", "absent.txt", *TRANSLATE), "absent.txt: no such file")
    one_error(cli("train-tokenizer", "absent.txt", "--model-prefix", "m"), "absent.txt: no such file")
    one_error(cli("score", "--ref", "absent.ref", "--hyp", corpus / "valid.tgt"), "absent.ref: no such file")
    one_error(cli("translate", "-c", tiny_checkpoint, "--input", tmp_path, *TRANSLATE), "is a directory")
    one_error(cli("train", tmp_path / "nodata", "--save-dir", "run", *TRAIN), "no meta.json", "binarize")
    one_error(binarize_cli(corpus, str(corpus / "train"), tmp_path / "b", "--tokenizer", "absent.model"), "absent.model: no such tokenizer")
    # unreadable: the tests run as root, where chmod 000 does not stop reading, so the open fails here instead
    import seqtool.textio

    def denied(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    (tmp_path / "locked.txt").write_text("a b\n")
    monkeypatch.setattr(seqtool.textio, "open", denied, raising=False)
    one_error(cli("translate", "-c", tiny_checkpoint, "--input", "locked.txt", *TRANSLATE), "locked.txt: cannot read: Permission denied")
    assert not list(tmp_path.glob("b*"))  # nothing was created by the failed binarize runs


@pytest.mark.integration
def test_empty_files(tiny_checkpoint, corpus, tmp_path):
    train = write_pair(tmp_path, "e", b"", b"")
    one_error(binarize_cli(corpus, train, tmp_path / "bin"), "e.src: empty file", "at least one line")
    assert not (tmp_path / "bin").exists()
    one_error(cli("train-tokenizer", tmp_path / "e.src", "--model-prefix", tmp_path / "m"), "no text to train a tokenizer on")
    result = cli("translate", "-c", tiny_checkpoint, *TRANSLATE, input=b"")
    assert result.exit_code == 0 and result.stdout == ""  # no line in, no line out
    one_error(cli("score", "--ref", corpus / "valid.tgt", "--hyp", tmp_path / "e.src"), "has 0 lines", "valid.tgt has 10")


@pytest.mark.integration
def test_unequal_line_counts_name_both_files_and_counts(corpus, tmp_path):
    train = write_pair(tmp_path, "u", b"a b\n" * 5000, b"b a\n" * 4999)  # crosses a 4096-line chunk
    line = one_error(binarize_cli(corpus, train, tmp_path / "bin"), "u.src has 5000 lines", "u.tgt has 4999")
    assert "align line by line" in line
    assert not (tmp_path / "bin").exists()


@pytest.mark.integration
def test_lines_end_at_newline_only(tiny_checkpoint, corpus, tmp_path):
    src = "a b\r\nc\rd\n\u2028e\x85f\r\n\r\n".encode()
    tgt = b"x\ny\nz\nw\n"
    binarize_result = binarize_cli(corpus, write_pair(tmp_path, "n", src, tgt), tmp_path / "bin")
    assert binarize_result.exit_code == 0, binarize_result.stderr
    tok = Tokenizer.load(corpus / "spm.model")
    ds = ParallelDataset(tmp_path / "bin", "train")
    expected = ["a b", "c\rd", "\u2028e\x85f", ""]  # CRLF normalised; \r, U+2028, \x85 inside a line are text
    assert [ds.src[i].tolist() for i in range(len(ds))] == tok.encode_batch(expected)
    result = cli("translate", "-c", tiny_checkpoint, *TRANSLATE, input=src)
    assert result.exit_code == 0 and result.stdout.count("\n") == 4


@pytest.mark.integration
def test_invalid_utf8(tiny_checkpoint, corpus, tmp_path):
    train = write_pair(tmp_path, "bad", b"a b\nc \xff d\ne\n", b"b a\nd c\ne\n")
    # binarize: strict by default, the message names file and line; nothing written
    one_error(binarize_cli(corpus, train, tmp_path / "bin"), "bad.src:2: invalid UTF-8", "--errors replace")
    assert not (tmp_path / "bin").exists()
    result = binarize_cli(corpus, train, tmp_path / "bin", "--errors", "replace")
    assert result.exit_code == 0 and "bad.src:2: invalid UTF-8" in result.stderr
    assert len(ParallelDataset(tmp_path / "bin", "train")) == 3
    # translate: replace with a warning by default, --errors strict stops; a previous --output survives
    result = cli("translate", "-c", tiny_checkpoint, *TRANSLATE, input=b"a\n\xc3(\nb\n")
    assert result.exit_code == 0 and result.stdout.count("\n") == 3
    assert "<stdin>:2: invalid UTF-8" in result.stderr
    out = tmp_path / "out.txt"
    out.write_text("previous translation\n")
    one_error(cli("translate", "-c", tiny_checkpoint, *TRANSLATE, "--errors", "strict", "--input", train + ".src", "--output", out),
              "bad.src:2: invalid UTF-8")
    assert out.read_text() == "previous translation\n" and sorted(p.name for p in tmp_path.glob(".*")) == []


@pytest.mark.integration
def test_many_invalid_lines_warn_a_few_times_then_count(tiny_checkpoint, tmp_path):
    result = cli("translate", "-c", tiny_checkpoint, *TRANSLATE, input=b"\xff\n" * 30)
    assert result.exit_code == 0 and result.stdout.count("\n") == 30
    assert result.stderr.count("invalid UTF-8, undecodable bytes replaced") == 10
    assert "invalid UTF-8 replaced in 30 lines in all" in result.stderr


@pytest.mark.integration
def test_odd_text_is_just_text(tiny_checkpoint, corpus, tmp_path):
    """NUL bytes, whitespace-only lines, non-BMP characters, combining marks, right-to-left text."""
    lines = ["a\x00b", "\x00", "   \t ", "\U0001F600 \U00020000 a", "e\u0301 a\u0308", "\u05e9\u05dc\u05d5\u05dd b \u0645\u0631\u062d\u0628\u0627", ""]
    data = ("\n".join(lines) + "\n").encode()
    result = binarize_cli(corpus, write_pair(tmp_path, "o", data, data), tmp_path / "bin")
    assert result.exit_code == 0, result.stderr
    ds = ParallelDataset(tmp_path / "bin", "train")
    assert [ds.tgt[i].tolist() for i in range(len(ds))] == Tokenizer.load(corpus / "spm.model").encode_batch(lines)
    result = cli("translate", "-c", tiny_checkpoint, *TRANSLATE, input=data)
    assert result.exit_code == 0 and result.stdout.count("\n") == len(lines)
    assert result.stdout.split("\n")[2] == ""  # a whitespace-only line has no tokens: an empty translation


@pytest.mark.integration
def test_a_million_character_line(tiny_checkpoint, corpus, tmp_path):
    """Binarized whole, skipped and counted by training; translated in pieces, never cropped (a
    20,000-character line here: the million decode for a minute, the pieces' invariants are
    test_text_policy's)."""
    long_line = ("a b " * 250_000).encode()
    train = write_pair(tmp_path, "big", (corpus / "train.src").read_bytes() + long_line + b"\n",
                       (corpus / "train.tgt").read_bytes() + b"b a\n")
    shutil.copy(corpus / "valid.src", tmp_path / "valid.src")
    shutil.copy(corpus / "valid.tgt", tmp_path / "valid.tgt")
    result = cli("binarize", "--src", "src", "--tgt", "tgt", "--train", train, "--valid", tmp_path / "valid",
                 "--tokenizer", corpus / "spm.model", "--out", tmp_path / "bin")
    assert result.exit_code == 0, result.stderr
    assert int(ParallelDataset(tmp_path / "bin", "train").src.lengths.max()) >= 500_000
    result = cli("train", tmp_path / "bin", "--save-dir", tmp_path / "run", "--max-updates", "1", *TRAIN)
    assert result.exit_code == 0, result.stderr
    assert "1 pairs skipped as too long" in result.stderr  # in the summary line
    result = cli("translate", "-c", tiny_checkpoint, *TRANSLATE, input=b"a b\n" + long_line[:20_000] + b"\nc\n")
    assert result.exit_code == 0 and result.stdout.count("\n") == 3
    assert "input line 2: 10,000 tokens with too few sentence ends to cut at: translated in " in result.stderr
    assert "cropped" not in result.stderr


# ---- settings -------------------------------------------------------------------------------

@pytest.mark.integration
def test_vocabulary_too_large_gives_advice(corpus, tmp_path):
    one_error(cli("train-tokenizer", corpus / "valid.src", "--model-prefix", tmp_path / "m", "--vocab-size", "5000"),
              "--vocab-size 5000 is too large for this data (at most", "lower --vocab-size")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.integration
def test_max_tokens_smaller_than_one_sentence(tiny_checkpoint, data_dir, tmp_path):
    one_error(cli("train", data_dir, "--save-dir", tmp_path / "run", *TRAIN, "--max-tokens", "3"),
              "no training pair fits --max-tokens 3", "raise --max-tokens to at least")
    assert not (tmp_path / "run" / "last.pt").exists()
    result = cli("translate", "-c", tiny_checkpoint, *TRANSLATE, "--max-tokens", "1", input=b"a b c\nd e f g\n\nh\n")
    assert result.exit_code == 0 and result.stdout.count("\n") == 4  # a sentence over the budget is a batch of its own


@pytest.mark.integration
def test_data_dir_of_another_format_version(data_dir, tmp_path):
    copy = tmp_path / "bin"
    shutil.copytree(data_dir, copy)
    meta = json.loads((copy / "meta.json").read_text())
    meta["format_version"] = 99
    (copy / "meta.json").write_text(json.dumps(meta))
    one_error(cli("train", copy, "--save-dir", tmp_path / "run", *TRAIN), "data format version 99", "binarize the data again")


@pytest.mark.integration
def test_tokenizer_that_does_not_match_the_data(tiny_checkpoint, corpus, data_dir, tmp_path):
    copy = tmp_path / "bin"
    shutil.copytree(data_dir, copy)
    other = train_tokenizer([corpus / "train.tgt"], str(tmp_path / "other"), TokenizerConfig(vocab_size=24, model_type="unigram"))
    shutil.copy(other, copy / "tokenizer.model")
    one_error(cli("train", copy, "--save-dir", tmp_path / "run", *TRAIN), "tokenizer.model is not the tokenizer the data was binarized with")
    one_error(binarize_cli(corpus, str(corpus / "train"), tmp_path / "b", "--tokenizer", tiny_checkpoint), "not a sentencepiece model")
    assert not (tmp_path / "run" / "last.pt").exists() and not (tmp_path / "b").exists()


@pytest.mark.integration
def test_mismatched_languages(corpus, data_dir, tmp_path):
    one_error(binarize_cli(corpus, str(corpus / "train"), tmp_path / "b", "--tgt", "src"), "both 'src'")
    one_error(cli("binarize", "--src", "de", "--tgt", "tgt", "--train", corpus / "train", "--tokenizer", corpus / "spm.model",
                  "--out", tmp_path / "b"), "train.de: no such file")
    one_error(cli("train", data_dir, "--save-dir", tmp_path / "run", *TRAIN, "--src", "de", "--tgt", "tgt"),
              "--src de", "holds src -> tgt data")
    assert not (tmp_path / "b").exists() and not (tmp_path / "run").exists()


# ---- files ----------------------------------------------------------------------------------

@pytest.mark.integration
def test_truncated_or_corrupted_checkpoints(tiny_checkpoint, tmp_path):
    data = tiny_checkpoint.read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) * 2 // 3])
    one_error(cli("translate", "-c", tmp_path / "cut.pt", *TRANSLATE, input=b"a\n"), "cut.pt: truncated or corrupted checkpoint")
    ckpt = torch.load(tiny_checkpoint, weights_only=True)
    name = sorted(ckpt["weights"])[3]
    ckpt["weights"][name] = ckpt["weights"][name].clone()
    ckpt["weights"][name].view(-1)[0] += 1.0
    torch.save(ckpt, tmp_path / "weights.pt")
    one_error(cli("translate", "-c", tmp_path / "weights.pt", *TRANSLATE, input=b"a\n"), "corrupted checkpoint: the weights do not match their stored sha256")
    ckpt = torch.load(tiny_checkpoint, weights_only=True)
    ckpt["tokenizer"] = ckpt["tokenizer"].clone()
    ckpt["tokenizer"][len(ckpt["tokenizer"]) // 2] ^= 1  # one bit of the tokenizer model
    torch.save(ckpt, tmp_path / "tok.pt")
    one_error(cli("translate", "-c", tmp_path / "tok.pt", *TRANSLATE, input=b"a\n"), "the tokenizer does not match its stored sha256")
    (tmp_path / "text.pt").write_text("not a checkpoint\n")
    one_error(cli("average", tmp_path / "text.pt", "--output", tmp_path / "avg.pt"), "text.pt: a text file, not a checkpoint")
    (tmp_path / "config.json").write_text('{"model": {"d_model": 256}}\n')  # the run folder's other file, given by mistake
    one_error(cli("translate", "-c", tmp_path / "config.json", *TRANSLATE, input=b"a\n"), "config.json: a text file, not a checkpoint; give a .pt")
    assert not (tmp_path / "avg.pt").exists()


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.integration
def test_a_pickle_carrying_code_is_refused_never_run(tmp_path):
    marker = tmp_path / "code-ran"
    torch.save({"format_version": 1, "weights": {}, "payload": _Payload(marker)}, tmp_path / "evil.pt")
    assert not marker.exists()
    one_error(cli("translate", "-c", tmp_path / "evil.pt", *TRANSLATE, input=b"a\n"), "evil.pt: refused", "run code")
    one_error(cli("average", tmp_path / "evil.pt", "--output", tmp_path / "avg.pt"), "evil.pt: refused")
    assert not marker.exists()


@pytest.mark.integration
def test_full_disk_at_save_keeps_the_previous_checkpoint(data_dir, tmp_path, monkeypatch):
    run = tmp_path / "run"
    assert cli("train", data_dir, "--save-dir", run, "--max-updates", "1", *TRAIN).exit_code == 0
    before = {name: (run / name).read_bytes() for name in ("last.pt", "best.pt")}

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    # best.pt is written before last.pt after an improving validation: either name is right
    line = one_error(cli("train", data_dir, "--save-dir", run, "--max-updates", "2", *TRAIN), ".pt: no space left on device", "free space")
    assert str(run / "last.pt") in line or str(run / "best.pt") in line
    assert {name: (run / name).read_bytes() for name in before} == before
    assert not [p.name for p in run.iterdir() if ".tmp" in p.name]  # no temp file left behind


@pytest.mark.unit
def test_full_disk_while_translating_keeps_the_previous_output(tmp_path, monkeypatch):
    import seqtool.files
    import seqtool.translate

    def write_then_fail(checkpoint_path, config, options, io, input_path, output):
        output.write("half a translation\n")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(seqtool.files, "translate_file", write_then_fail)
    out = tmp_path / "out.txt"
    out.write_text("previous translation\n")
    one_error(cli("translate", "-c", tmp_path / "m.pt", "-o", out, input=b"a\n"), "out.txt: no space left on device")
    assert out.read_text() == "previous translation\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


@pytest.mark.integration
def test_existing_outputs_are_never_overwritten_without_force(data_dir, corpus, tiny_checkpoint, tmp_path):
    before = snapshot(data_dir)
    one_error(cli("binarize", "--src", "src", "--tgt", "tgt", "--train", corpus / "train", "--tokenizer", corpus / "spm.model",
                  "--out", data_dir), "already holds binarized data", "--force")
    # --force whose run fails part-way (the second split does not align) also leaves the old data whole
    write_pair(tmp_path, "odd", b"a\nb\n", b"a\n")
    one_error(cli("binarize", "--src", "src", "--tgt", "tgt", "--train", corpus / "train", "--valid", tmp_path / "odd",
                  "--tokenizer", corpus / "spm.model", "--out", data_dir, "--force"), "odd.src has 2 lines")
    assert snapshot(data_dir) == before
    one_error(binarize_cli(corpus, str(corpus / "train"), corpus / "spm.model"), "is a file")
    # train: a SAVE_DIR holding best.pt of another run is refused; --force starts over
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(tiny_checkpoint, run / "best.pt")
    one_error(cli("train", data_dir, "--save-dir", run, "--max-updates", "1", *TRAIN), "holds best.pt from another run", "--force")
    assert (run / "best.pt").read_bytes() == tiny_checkpoint.read_bytes()
    result = cli("train", data_dir, "--save-dir", run, "--max-updates", "1", *TRAIN, "--force")
    assert result.exit_code == 0, result.stderr
    assert checkpoint.load(run / "last.pt")["train_state"]["progress"]["updates"] == 1
    # ... and a changed setting is refused, not resumed and not overwritten
    saved = snapshot(run)
    one_error(cli("train", data_dir, "--save-dir", run, "--max-updates", "2", *TRAIN, "--lr", "0.5"),
              "saved with a different configuration", "optim.lr", "--force")
    assert snapshot(run) == saved
    (tmp_path / "avg.pt").write_bytes(b"mine")
    one_error(cli("average", tiny_checkpoint, "--output", tmp_path / "avg.pt"), "already exists", "--force")
    one_error(cli("train-tokenizer", corpus / "train.src", "--model-prefix", corpus / "spm"), "spm.model: already exists; pass --force")
    assert (tmp_path / "avg.pt").read_bytes() == b"mine"


@pytest.mark.integration
def test_output_paths_that_cannot_be_written(tiny_checkpoint, tmp_path):
    one_error(cli("translate", "-c", tiny_checkpoint, *TRANSLATE, "-o", tmp_path / "nodir" / "out.txt", input=b"a\n"),
              "the directory", "does not exist")
    one_error(cli("translate", "-c", tiny_checkpoint, *TRANSLATE, "-o", tmp_path, input=b"a\n"), "is a directory")


# ---- processes ------------------------------------------------------------------------------

@pytest.mark.system
def test_stdin_closed_or_a_terminal(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    python = " ".join(PYTHON)
    cmd = (f"{python} translate -c {tiny_checkpoint} {' '.join(TRANSLATE)} <&-; echo status $?; "
           f"{python} score --ref {tiny_checkpoint.parent / 'valid.tgt'} <&-; echo status $?")
    result = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=300)
    assert result.stdout == "status 1\nstatus 1\n"
    assert result.stderr.count("error: <stdin>: standard input is closed; pipe text in or give an input file\n") == 2
    assert "Traceback" not in result.stderr

    class Terminal:
        closed = False
        buffer = io.BytesIO(b"a b\n")

        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdin", Terminal())
    out = io.StringIO()
    assert translate_file(tiny_checkpoint, *settings(beam=1, max_len_a=0.0, max_len_b=4, device="cpu"), TranslateConfig(), None, out) == 1
    assert "reading from the terminal: type lines, end with Ctrl-D" in capsys.readouterr().err


@pytest.mark.system
def test_sigpipe_ends_quietly_with_status_0(tiny_checkpoint, tmp_path):
    (tmp_path / "in.txt").write_text("a b c\n" * 3000)
    cmd = (" ".join([*PYTHON, "translate", "-c", str(tiny_checkpoint), *TRANSLATE, "--input", str(tmp_path / "in.txt"), "--print-scores"])
           + " | head -n 2")
    result = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 2 and not [line for line in result.stderr.splitlines() if "length cap" not in line]


@pytest.mark.unit
def test_an_unexpected_failure_is_one_line_too(monkeypatch, tmp_path):
    import seqtool.score

    def broken(*args, **kwargs):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(seqtool.score, "score_files", broken)
    (tmp_path / "r").write_text("a\n")
    one_error(cli("score", "--ref", tmp_path / "r", "--hyp", tmp_path / "r"), "unexpected ZeroDivisionError", "SEQTOOL_DEBUG=1", code=2)


def _wait_for(predicate, timeout=300.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _default_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# Its own process group (so the test can signal the group, like a terminal), with Ctrl-C at its
# default even when the test runner was started where SIGINT is ignored (a background job).
CTRL_C_ABLE = dict(start_new_session=True, preexec_fn=_default_sigint)


def _ctrl_c(proc: subprocess.Popen) -> tuple[str, str]:
    """What a terminal does on Ctrl-C: SIGINT to the whole process group (workers included)."""
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    return out, err


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.system
def test_a_signal_in_binarize_leaves_nothing_that_looks_complete(corpus, tmp_path, signum):
    lines = b"".join(b"a b c d e f g h i j %d\n" % (i % 7) for i in range(600_000))
    write_pair(tmp_path, "big", lines, lines)
    out_dir = tmp_path / "bin"
    proc = subprocess.Popen([*PYTHON, "binarize", "--src", "src", "--tgt", "tgt", "--train", str(tmp_path / "big"),
                             "--tokenizer", str(corpus / "spm.model"), "--out", str(out_dir), "--workers", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **CTRL_C_ABLE)

    def started() -> bool:  # the first chunk of token ids is on disk under a temp name
        try:
            return any(p.suffix == ".tmp" and p.stat().st_size > 0 for p in out_dir.iterdir())
        except FileNotFoundError:
            return False

    assert _wait_for(started)
    if signum == signal.SIGINT:
        _, err = _ctrl_c(proc)  # a terminal's Ctrl-C: the whole group
    else:
        os.kill(proc.pid, signum)  # a scheduler's SIGTERM: the process it started
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    # one error line, and neither the parent nor a worker prints a traceback
    assert [line for line in err.splitlines() if line.startswith("error:")] == ["error: interrupted"], err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert not out_dir.exists()


@pytest.mark.system
def test_a_binarize_worker_killed_is_an_error_within_seconds_not_a_hang(corpus, tmp_path):
    """SIGKILL (as the OOM killer) of one encoding worker mid-run: one clear line naming it, exit 1,
    nothing written, no worker left. A worker killed while writing its result left half a message
    in concurrent.futures' result pipe, and its manager thread waited for the rest forever (1 run in
    4 hung); the pool now watches its workers itself (binarize._EncodingPool._check_workers)."""
    from conftest import process_running

    lines = b"".join(b"a b c d e f g h i j %d\n" % (i % 7) for i in range(600_000))
    write_pair(tmp_path, "big", lines, lines)
    out_dir = tmp_path / "bin"
    proc = subprocess.Popen([*PYTHON, "binarize", "--src", "src", "--tgt", "tgt", "--train", str(tmp_path / "big"),
                             "--tokenizer", str(corpus / "spm.model"), "--out", str(out_dir), "--workers", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

    def workers() -> list[int]:
        return [c for c in _children(proc.pid) if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]

    def started() -> bool:  # both workers up and encoded chunks arriving: the kill lands mid-run
        try:
            return len(workers()) == 2 and any(p.suffix == ".tmp" and p.stat().st_size > 0 for p in out_dir.iterdir())
        except (FileNotFoundError, ProcessLookupError):
            return False

    assert _wait_for(started)
    pool = workers()
    victim = pool[0]
    os.kill(victim, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        f"error: a --workers process (PID {victim}) died: killed, or out of memory; nothing was written; "
        "run again, with fewer --workers if memory is short"], err
    assert not out_dir.exists()
    assert _wait_for(lambda: not any(map(process_running, pool)), timeout=30)  # no worker left behind


@pytest.mark.integration
def test_binarize_pool_takes_ctrl_c_only_at_its_checks_and_restores_the_handler(corpus):
    # SIGINT while the pool lives must not raise inside multiprocessing's locking: it is flagged,
    # and the next check (submit / waiting for a result) raises KeyboardInterrupt
    from seqtool.binarize import _EncodingPool

    before = signal.getsignal(signal.SIGINT)
    model_bytes = (corpus / "spm.model").read_bytes()
    with pytest.raises(KeyboardInterrupt):
        with _EncodingPool(2, model_bytes) as pool:
            first = pool.submit(["a b c"])
            os.kill(os.getpid(), signal.SIGINT)  # would raise right here under the default handler
            reached = True
            assert pool.interrupted.is_set()
            pool.get(first)
    assert reached
    assert signal.getsignal(signal.SIGINT) is before
    # a Ctrl-C after the last check still stops the with-block instead of being swallowed
    with pytest.raises(KeyboardInterrupt):
        with _EncodingPool(2, model_bytes) as pool:
            assert pool.get(pool.submit(["a b"]))
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@pytest.mark.system
def test_ctrl_c_in_train_tokenizer_is_answered_at_once_and_keeps_the_previous_model(tmp_path):
    # enough distinct words that sentencepiece's C++ loop runs for a while after reading the text
    words = [f"w{i:05d}x{i % 97}" for i in range(40_000)]
    text = "\n".join(" ".join(words[(i * 7919 + k * 104729) % len(words)] for k in range(12)) for i in range(60_000)) + "\n"
    (tmp_path / "big.txt").write_text(text)
    (tmp_path / "spm.model").write_bytes(b"the previous model")
    (tmp_path / "spm.vocab").write_bytes(b"the previous vocab")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen([*PYTHON, "train-tokenizer", str(tmp_path / "big.txt"), "--model-prefix", str(tmp_path / "spm"),
                             "--vocab-size", "8000", "--force"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TMPDIR=str(tmp)), **CTRL_C_ABLE)
    assert _wait_for(lambda: bool(_children(proc.pid)), timeout=120), proc.stderr.read() if proc.poll() is not None else ""
    trainers = _children(proc.pid)
    _, err = _ctrl_c(proc)
    assert proc.returncode == 130, err
    assert [line for line in err.splitlines() if line.startswith("error:")] == ["error: interrupted"], err
    assert "Traceback" not in err, err
    assert (tmp_path / "spm.model").read_bytes() == b"the previous model"
    assert (tmp_path / "spm.vocab").read_bytes() == b"the previous vocab"
    assert list(tmp.iterdir()) == []  # the trainer's scratch directory went with it
    assert not [pid for pid in trainers if Path(f"/proc/{pid}").exists()]  # no trainer left running
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.txt", "spm.model", "spm.vocab", "tmp"]


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 130)])
@pytest.mark.system
def test_a_signal_in_translate_output_keeps_the_previous_file_and_leaves_no_partial(tiny_checkpoint, tmp_path, signum, code):
    out = tmp_path / "out.txt"
    out.write_text("previous translation\n")
    proc = subprocess.Popen([*PYTHON, "translate", "-c", str(tiny_checkpoint), *TRANSLATE, "--output", str(out)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **CTRL_C_ABLE)
    proc.stdin.write(b"a b\nc d\n")
    proc.stdin.flush()  # stdin stays open: translate is mid-stream, waiting for more
    from seqtool.textio import temp_path

    partial = temp_path(out, proc.pid)  # the writer's PID: two runs never share a temp file
    assert _wait_for(lambda: partial.exists() and partial.stat().st_size > 0)
    os.killpg(proc.pid, signum)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == code, err
    assert [line for line in err.decode().splitlines() if "length cap" not in line] == ["error: interrupted"]  # (an untrained model's outputs reach their caps)
    assert out.read_text() == "previous translation\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


@pytest.mark.parametrize("which", ["input", "target", "checkpoint"])
@pytest.mark.integration
def test_translate_output_may_not_be_one_of_its_inputs(tiny_checkpoint, tmp_path, which):
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("a b\n")
    ref.write_text("b a\n")
    ckpt = tmp_path / "model.pt"
    shutil.copy(tiny_checkpoint, ckpt)
    output = {"input": src, "target": ref, "checkpoint": ckpt}[which]
    before = output.read_bytes()
    result = cli("translate", "-c", ckpt, *TRANSLATE, "--input", src, "--score-reference", "--target", ref, "--output", output)
    one_error(result, f"--output is the --{which} file")
    assert output.read_bytes() == before


@pytest.mark.system
def test_ctrl_c_in_train_saves_a_resumable_checkpoint(data_dir, tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen([*PYTHON, "train", str(data_dir), "--save-dir", str(run), *TRAIN],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **CTRL_C_ABLE)
    assert _wait_for(lambda: (run / "metrics.jsonl").exists())
    _, err = _ctrl_c(proc)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "run the same command again to resume" in err
    assert [line for line in err.splitlines() if line.startswith("error:")] == ["error: interrupted"]
    ckpt = checkpoint.load(run / "last.pt")  # complete and verified, not half-written
    assert ckpt["train_state"]["progress"]["updates"] >= 1
    assert not [p.name for p in run.iterdir() if ".tmp" in p.name]


@pytest.mark.integration
def test_translate_input_without_newlines_is_refused_not_buffered_without_end(tiny_checkpoint):
    # memory is bounded by a setting, not by the input: 2 MiB and no newline is not a sentence
    result = cli("translate", "-c", tiny_checkpoint, *TRANSLATE, input="ab " * (700 << 10))
    one_error(result, "<stdin>:1: a line of more than 1,048,576 bytes", "one sentence per line")


@pytest.mark.unit
def test_out_of_memory_advice_names_only_what_the_command_has(tmp_path, monkeypatch):
    """`import` has no --max-tokens: its out-of-memory line says what it is; translate's names its options."""
    import seqtool.interop
    import seqtool.files
    import seqtool.translate

    def out_of_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(seqtool.interop, "import_marian", out_of_memory)
    (tmp_path / "model").mkdir()
    line = one_error(cli("import", tmp_path / "model", "--output", tmp_path / "x.pt"), "out of memory")
    assert "--max-tokens" not in line and "--batch-size" not in line and "import" in line
    monkeypatch.setattr(seqtool.files, "translate_file", out_of_memory)
    one_error(cli("translate", "-c", tmp_path / "x.pt"), "out of memory; lower --max-tokens / --batch-size")
