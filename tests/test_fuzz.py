"""Property-based tests of the text path: whatever the lines, nothing is lost, added or reordered.

- translate writes exactly one line per input line, in input order: each output line equals the
  translation of its input line alone (the tiny untrained model's output depends on its input, so
  a swapped or shifted line shows), and --print-scores numbers the lines 0..n-1;
- binarize then reading back gives the tokenizer's ids of every line;
- `seqtool import` of a Marian directory with random config.json values and random tensor shapes and
  dtypes ends in a checkpoint or a one-line error (exit 1), never exit 2, in bounded memory and time.

Inputs are bytes: any Unicode text (with \\r, \\x85, U+2028, NUL, U+FFFD, empty and very long lines)
and invalid UTF-8. The normal run is bounded (SEQTOOL_FUZZ_EXAMPLES, default 20 per property);
bench/fuzz.py runs the same properties with many more examples.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import seqtool.binarize
from seqtool.binarize import SplitSpec, binarize
from seqtool.cli import app
from seqtool.config import TranslateConfig
from seqtool.data import ParallelDataset
from seqtool.tokenizer import Tokenizer
from seqtool.files import translate_file
from seqtool.translate import Translator
from test_interop import hostile, small_marian, spms  # noqa: F401 - (small_marian, spms: fixtures)

pytestmark = pytest.mark.integration

EXAMPLES = int(os.environ.get("SEQTOOL_FUZZ_EXAMPLES", "20"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# The characters that break naive line handling, mixed into otherwise arbitrary text.
TRICKY = st.sampled_from(["\r", "\x85", "\u2028", "\u2029", "\x00", "\ufffd", "\x0b", "\x0c", " ", "\t", "a b", "\U0001F600", "e\u0301", "\u05e9\u05dc"])
TEXT_LINE = st.lists(st.one_of(st.text(alphabet=st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), max_size=12), TRICKY),
                     max_size=8).map("".join).map(lambda s: s.encode("utf-8"))
BAD_LINE = st.binary(max_size=24).map(lambda b: b.replace(b"\n", b""))  # mostly invalid UTF-8
LONG_LINE = st.integers(200, 3000).map(lambda n: ("a b\r\x85 " * n).encode())  # far beyond 32 positions
LINE = st.one_of(TEXT_LINE, TEXT_LINE, BAD_LINE, st.just(b""), st.just(b"\r"), LONG_LINE)


def as_file(lines: list[bytes], final_newline: bool) -> bytes:
    """The bytes of a file holding these lines; without a final newline the last line still counts,
    unless it is empty (then nothing marks it)."""
    if not lines:
        return b""
    return b"\n".join(lines) + (b"\n" if final_newline or lines[-1] == b"" else b"")


def as_text(raw: bytes) -> str:
    """What every command promises to make of one line: one trailing \\r dropped, bad bytes -> U+FFFD."""
    return raw.removesuffix(b"\r").decode("utf-8", errors="replace")


@pytest.fixture(scope="module")
def greedy(tiny_checkpoint):
    return Translator.load(tiny_checkpoint, beam=1, max_len_a=0.0, max_len_b=5, batch_size=4, max_tokens=40, device="cpu", chunk_lines=5)


@FUZZ
@given(lines=st.lists(LINE, max_size=14), final_newline=st.booleans(), scores=st.booleans())
def test_translate_writes_one_line_per_line_in_order(greedy, tiny_checkpoint, lines, final_newline, scores):
    translator = Translator(greedy.model, greedy.tokenizer, greedy.config, greedy.device, options=greedy.options)
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        path = Path(tmp) / "in.txt"
        path.write_bytes(as_file(lines, final_newline))
        patch.setattr(Translator, "load", classmethod(lambda cls, *args, **kwargs: translator))  # the model loads once per module
        out = io.StringIO()
        assert translate_file(tiny_checkpoint, greedy.config, greedy.options, TranslateConfig(print_scores=scores), path, out) == len(lines)
    rows = out.getvalue().split("\n")
    assert rows.pop() == ""  # every output line ends with \n
    assert len(rows) == len(lines)
    alone = [greedy.translate([as_text(raw)])[0].replace("\n", " ") for raw in lines]
    if scores:
        fields = [row.split("\t", 2) for row in rows]
        assert [int(f[0]) for f in fields] == list(range(len(lines)))
        assert [f[2] for f in fields] == alone
    else:
        assert rows == alone


@FUZZ
@given(pairs=st.lists(st.tuples(LINE, LINE), min_size=1, max_size=12), final_newline=st.booleans())
def test_binarize_then_read_back_gives_the_encoded_ids(tiny_checkpoint, pairs, final_newline):
    tokenizer = Tokenizer(Path(tiny_checkpoint.parent / "spm.model").read_bytes())
    src, tgt = [p[0] for p in pairs], [p[1] for p in pairs]
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        patch.setattr(seqtool.binarize, "CHUNK_LINES", 5)  # several chunks per file
        d = Path(tmp)
        (d / "c.src").write_bytes(as_file(src, final_newline))
        (d / "c.tgt").write_bytes(as_file(tgt, True))
        binarize("src", "tgt", [SplitSpec("train", str(d / "c"))], tiny_checkpoint.parent / "spm.model", d / "bin", errors="replace")
        ds = ParallelDataset(d / "bin", "train")
        assert len(ds) == len(pairs)
        assert [ds.src[i].tolist() for i in range(len(ds))] == tokenizer.encode_batch([as_text(r) for r in src])
        assert [ds.tgt[i].tolist() for i in range(len(ds))] == tokenizer.encode_batch([as_text(r) for r in tgt])


@settings(max_examples=max(2, EXAMPLES // 8), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(LINE, max_size=6))
def test_cli_translate_counts_lines(tiny_checkpoint, lines):
    data = as_file(lines, True)
    result = CliRunner().invoke(app, ["translate", "-c", str(tiny_checkpoint), "--beam", "2", "--max-len-a", "0", "--max-len-b", "4", "--device", "cpu"], input=data)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count("\n") == len(lines)
    assert "Traceback" not in result.stderr


# ---- `seqtool import` of hostile directories (#42) ---------------------------------------------------------
CONFIG_VALUE = st.one_of(st.integers(-2, 700), st.integers(2 ** 31 - 2, 2 ** 80), st.floats(allow_nan=True, allow_infinity=True),
                         st.none(), st.booleans(), st.text(max_size=4), st.lists(st.integers(0, 40), max_size=3))
CONFIG_FIELDS = ("d_model", "vocab_size", "decoder_vocab_size", "encoder_layers", "decoder_layers", "encoder_attention_heads",
                 "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings", "pad_token_id",
                 "eos_token_id", "decoder_start_token_id", "dropout", "scale_embedding")
WEIGHT_NAMES = ("model.shared.weight", "final_logits_bias", "model.encoder.layers.0.fc1.weight", "model.decoder.layers.0.self_attn.k_proj.bias",
                "model.decoder.layers.0.encoder_attn_layer_norm.weight", "model.encoder.layers.1.fc2.bias")
DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int8", "bool")
TENSOR = st.tuples(st.lists(st.integers(0, 70), max_size=3), st.sampled_from(DTYPES), st.sampled_from([0.0, 0.5, float("nan"), float("inf")]))
HOSTILE = dict(config=st.dictionaries(st.sampled_from(CONFIG_FIELDS), CONFIG_VALUE, max_size=3),
               weights=st.dictionaries(st.sampled_from(WEIGHT_NAMES), TENSOR, max_size=2),
               generation=st.dictionaries(st.just("num_beams"), CONFIG_VALUE, max_size=1),
               tokenizer=st.dictionaries(st.just("unk_token"), CONFIG_VALUE, max_size=1))
HEADROOM = 2 * 2 ** 30  # address space an import may take beyond what the process holds before it


def hostile_copy(base: Path, out: Path, config, weights, generation, tokenizer) -> Path:
    import torch

    tensors = {}
    for name, (shape, dtype, fill) in weights.items():
        t = torch.zeros(shape, dtype=getattr(torch, dtype))
        tensors[name] = t.fill_(fill) if t.is_floating_point() else t
    settings = {**json.loads((base / "tokenizer_config.json").read_text()), **tokenizer}
    return hostile(base, out, config=config, weights=tensors, files={"generation_config.json": generation, "tokenizer_config.json": settings})


@contextmanager
def address_space(headroom: int):
    """The process's address space capped at what it maps now plus `headroom` (the soft limit; restored after)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/status") as status:
        mapped = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    cap = mapped + headroom if hard == resource.RLIM_INFINITY else min(hard, mapped + headroom)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@settings(max_examples=5 * EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(**HOSTILE)
def test_import_of_a_hostile_directory_ends_in_a_checkpoint_or_one_line(small_marian, config, weights, generation, tokenizer):
    """import_marian in this process (the CLI makes a SeqtoolError one line and exit 1, anything else exit 2):
    a checkpoint that loads, or a SeqtoolError of one line naming a file of the directory; no other
    exception, no allocation beyond HEADROOM (a MemoryError fails the test) and no example over 60 s."""
    from seqtool import checkpoint
    from seqtool.errors import SeqtoolError
    from seqtool.interop import import_marian

    with tempfile.TemporaryDirectory() as tmp:
        d = hostile_copy(small_marian, Path(tmp) / "marian", config, weights, generation, tokenizer)
        start = time.monotonic()
        try:
            with address_space(HEADROOM):
                import_marian(d, Path(tmp) / "model.pt")
        except SeqtoolError as error:
            message = str(error)
            assert "\n" not in message and message.startswith(str(d)), message
            assert not (Path(tmp) / "model.pt").exists()
        else:
            checkpoint.load_model(checkpoint.load(Path(tmp) / "model.pt"))
        assert time.monotonic() - start < 60


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(**HOSTILE)
def test_cli_import_of_a_hostile_directory_exits_0_or_1(small_marian, config, weights, generation, tokenizer):
    """The same through `python -m seqtool import`, in a process of at most 4 GiB of address space and
    120 s: exit 0 with a checkpoint, or exit 1 with one line on stderr; never 2."""
    import resource
    import subprocess
    import sys

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (4 * 2 ** 30, 4 * 2 ** 30))

    with tempfile.TemporaryDirectory() as tmp:
        d = hostile_copy(small_marian, Path(tmp) / "marian", config, weights, generation, tokenizer)
        run = subprocess.run([sys.executable, "-m", "seqtool", "import", str(d), "--output", str(Path(tmp) / "model.pt")],
                             capture_output=True, text=True, timeout=120, preexec_fn=limit, env=dict(os.environ, OMP_NUM_THREADS="2"))
        assert run.returncode in (0, 1), run.stderr
        errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
        assert (Path(tmp) / "model.pt").exists() == (run.returncode == 0) and len(errors) == (run.returncode == 1), run.stderr
        assert "Traceback" not in run.stderr
