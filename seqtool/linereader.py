"""Lines of input read in a thread for translate: a block of bytes at a time, handed over in lists.

The reader thread reads blocks of bytes (at most BLOCK_BYTES, whatever has arrived on a pipe)
and hands over lists of lines through a queue of at most QUEUE_BLOCKS blocks, so memory is
bounded by a chunk plus a few blocks whatever the input's size, and a million lines cost a
few thousand queue operations rather than a million. When input pauses, what has arrived is
handed over within IDLE_FLUSH_SECONDS rather than waiting for a full chunk.
"""

from __future__ import annotations

import queue
import threading
from typing import BinaryIO, Iterator

from .errors import InputError
from .textio import LineDecoder

IDLE_FLUSH_SECONDS = 0.05
BLOCK_BYTES = 1 << 16  # the reader's largest read
QUEUE_BLOCKS = 8  # blocks of lines read ahead of translation
MAX_LINE_BYTES = 1 << 20  # a sentence is a few hundred bytes; 1 MiB without a newline is not text to translate
_NEXT = object()  # no pending end or error: read on


class LineReader:
    """Reads lines (\\n only) in a thread, a block at a time, so the main loop can stop waiting
    after a short pause and a long input costs few queue operations."""

    def __init__(self, stream: BinaryIO, name: str, errors: str = "replace", max_blocks: int = QUEUE_BLOCKS):
        self.queue: queue.Queue = queue.Queue(maxsize=max_blocks)
        self.stream, self.decode = stream, LineDecoder(name, errors)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        # read1 returns what a pipe has (at least one byte) instead of waiting for a full block
        read = getattr(self.stream, "read1", None) or self.stream.read
        tail: list[bytes] = []  # the start of a line whose \n has not arrived yet
        tail_bytes = 0
        lineno = 0
        try:
            while block := read(BLOCK_BYTES):
                if b"\n" not in block:
                    tail.append(block)
                    tail_bytes += len(block)
                    if tail_bytes > MAX_LINE_BYTES:  # memory stays bounded, whatever the input
                        raise InputError(f"{self.decode.where}:{lineno + 1}: a line of more than {MAX_LINE_BYTES:,} bytes; "
                                         "translate reads one sentence per line (is this a text file?)")
                    continue
                raws = (b"".join(tail) + block).split(b"\n") if tail else block.split(b"\n")
                rest = raws.pop()  # after the last \n: empty, or a line still arriving
                tail = [rest] if rest else []
                tail_bytes = len(rest)
                lines = []
                try:
                    for raw in raws:
                        lineno += 1
                        lines.append(self.decode(raw, lineno))
                finally:  # lines before an undecodable one are still translated, then the error
                    if lines:
                        self.queue.put(lines)
            if tail:
                lineno += 1
                self.queue.put([self.decode(b"".join(tail), lineno)])
            self.decode.finish()
        except BaseException as error:  # handed to the main thread, which reports it
            self.queue.put(error)
        self.queue.put(None)

    def chunks(self, size: int) -> Iterator[list[str]]:
        """Lists of up to `size` lines. The end of input (None) or the reader's error is acted on
        after the lines read before it."""
        lines: list[str] = []  # read, not yet handed out
        end = _NEXT
        while True:
            if not lines and end is _NEXT:
                item = self.queue.get()  # wait as long as it takes for the first line
                if item is None or isinstance(item, BaseException):
                    end = item
                else:
                    lines = item
            while len(lines) < size and end is _NEXT:
                try:
                    item = self.queue.get(timeout=IDLE_FLUSH_SECONDS)
                except queue.Empty:
                    break  # input paused: translate what has arrived
                if item is None or isinstance(item, BaseException):
                    end = item
                else:
                    lines.extend(item)
            if lines:
                yield lines[:size]
                lines = lines[size:]
            elif end is None:
                return
            elif end is not _NEXT:
                raise end
