"""Streaming: the reader hands over lines in bounded blocks, in order, promptly for pipes; a
million lines pass through translate in bounded memory."""

import gc
import os
import sys
import threading
import time

import pytest

import seqtool.translate
from seqtool.config import TranslateConfig
from seqtool.steps import Hypothesis
from seqtool.textio import InputError
from seqtool.linereader import LineReader
from seqtool.files import translate_file
from seqtool.translate import settings


class Trickle:
    """A stream that hands out at most `step` bytes per read, as a slow pipe does."""

    def __init__(self, data: bytes, step: int):
        self.data, self.step, self.pos = data, step, 0

    def read1(self, n: int = -1) -> bytes:
        size = self.step if n < 0 else min(n, self.step)
        chunk = self.data[self.pos : self.pos + size]
        self.pos += len(chunk)
        return chunk


LINES = ["a b", "", "c\rd", "e\u2028f", "\x85", "long " * 40, "x", "last without newline"]
DATA = ("a b\r\n\nc\rd\ne\u2028f\n\x85\n" + "long " * 40 + "\nx\nlast without newline").encode()


@pytest.mark.parametrize("step", [1, 3, 7, 1 << 16])
@pytest.mark.unit
def test_reader_gives_every_line_in_order_whatever_the_reads(step):
    chunks = list(LineReader(Trickle(DATA, step), "<test>").chunks(3))
    assert [line for chunk in chunks for line in chunk] == LINES
    assert all(1 <= len(chunk) <= 3 for chunk in chunks)


@pytest.mark.unit
def test_reader_hands_over_the_lines_before_an_error_then_the_error():
    reader = LineReader(Trickle(b"a\nb\n\xff\nc\n", 1 << 16), "<test>", errors="strict")
    got = []
    with pytest.raises(InputError, match="<test>:3: invalid UTF-8"):
        for chunk in reader.chunks(10):
            got.extend(chunk)
    assert got == ["a", "b"]


@pytest.mark.unit
def test_reader_translates_what_has_arrived_when_a_pipe_pauses():
    read_end, write_end = os.pipe()
    stream = os.fdopen(read_end, "rb")
    chunks = LineReader(stream, "<pipe>").chunks(1000)
    os.write(write_end, b"a\nb\nc")  # "c" is still being typed: not a line yet
    got = []
    worker = threading.Thread(target=lambda: got.append(next(chunks)))
    start = time.monotonic()
    worker.start()
    worker.join(timeout=30)
    assert got == [["a", "b"]]  # without waiting for 1000 lines or the end of input
    assert time.monotonic() - start < 10
    os.write(write_end, b"\n")
    os.close(write_end)
    assert list(chunks) == [["c"]]
    stream.close()


def _letters(i: int) -> str:
    """A line that names its number and that the tiny tokenizer reads and writes back exactly."""
    return " ".join("abcdefghij"[int(d)] for d in str(i))


def _rss_bytes() -> int:
    """Resident memory of this process (Linux, as CI)."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.integration
def test_a_million_lines_stream_through_translate_in_bounded_memory(tiny_checkpoint, tmp_path, monkeypatch):
    n = 1_000_000
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    with open(source, "w") as handle:
        handle.writelines(f"{_letters(i)}\n" for i in range(n))

    def echo(model, src, *args, **kwargs):  # the search stubbed: each "translation" is its source
        lengths = src.ne(model.config.pad_id).sum(1).sub(1).tolist()  # (B,) without the EOS
        return [[Hypothesis(row[:n], 0.0)] for row, n in zip(src.tolist(), lengths)]

    monkeypatch.setattr(seqtool.translate, "search", echo)
    config, options = settings(beam=1, device="cpu", batch_size=512)
    (tmp_path / "small.txt").write_text("a b\n" * 5000)
    with open(tmp_path / "warm.txt", "w") as handle:  # torch, sentencepiece and the model warmed up before measuring
        translate_file(tiny_checkpoint, config, options, TranslateConfig(), tmp_path / "small.txt", handle)

    baseline, peak, done = _rss_bytes(), [0], threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], _rss_bytes())
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    # The chunk's objects trigger the collector's full passes now and then; frozen, the objects
    # pytest and torch already hold are not rescanned by each (this halves the test's time).
    # Lines are freed by reference counting either way.
    gc.freeze()
    try:
        with open(output, "w", encoding="utf-8") as handle:
            assert translate_file(tiny_checkpoint, config, options, TranslateConfig(), source, handle) == n
    finally:
        gc.unfreeze()
        done.set()
        watcher.join()
    growth = peak[0] - baseline
    # Holding every line as a str alone would take n * 60+ bytes (plus its tokens and its output);
    # streaming holds a chunk and a few read-ahead blocks.
    everything = n * sys.getsizeof(_letters(n - 1))
    assert growth < everything / 3, f"memory grew by {growth / 2**20:.0f} MiB"
    print(f"peak memory growth {growth / 2**20:.1f} MiB; the lines alone would take {everything / 2**20:.0f} MiB")
    with open(output, encoding="utf-8") as handle:
        count = 0
        for i, line in enumerate(handle):
            assert line == f"{_letters(i)}\n", f"output line {i + 1}"
            count += 1
    assert count == n
