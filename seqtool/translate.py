"""Text in, translations out, in input order.

Owns the path from lines of text to lines of translation: a bounded chunk of lines is read
(when input pauses, what has arrived is translated within ~50 ms rather than waiting for a full
chunk), tokenized, cropped to the model's positions with a warning, sorted by length, batched
under --max-tokens / --batch-size, searched, put back in input order, detokenized, written and
flushed. `Translator` is also the Python API for programs that embed seqtool.
"""

from __future__ import annotations

import queue
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, Optional, TextIO

import torch

from . import checkpoint, log, precision
from .attention import align_hypotheses, format_alignment, resolve_layer
from .config import DecodeConfig
from .search import Hypothesis, search
from .textio import LineDecoder, open_binary, open_stdin
from .tokenizer import Tokenizer
from .train import pick_device

IDLE_FLUSH_SECONDS = 0.05
_NEXT = object()  # no pending end or error: read on


@dataclass
class Translation:
    index: int  # 0-based input line number
    source: str
    hypotheses: list[Hypothesis]  # best first; empty for an empty line
    texts: list[str]
    alignments: Optional[list[list[tuple[int, int]]]] = None  # per hypothesis, with --print-alignment


class Translator:
    """Load a checkpoint once, translate many lines.

    >>> t = Translator.load("run/best.pt", DecodeConfig(beam=5))   # or DecodeConfig(quantize="int8")
    >>> t.translate(["Hola mundo."])
    """

    def __init__(self, model, tokenizer: Tokenizer, config: DecodeConfig, device: torch.device):
        self.model, self.tokenizer, self.config, self.device = model, tokenizer, config, device
        self.max_src = model.config.max_positions - 1  # room for the EOS
        if config.print_alignment:
            resolve_layer(config.alignment_layer, model.config.decoder_layers, "--alignment-layer")  # fail before reading input

    @classmethod
    def load(cls, path: Path, config: Optional[DecodeConfig] = None) -> "Translator":
        config = config or DecodeConfig()
        if config.threads:
            torch.set_num_threads(config.threads)
        device = pick_device(config.device)
        precision.check(device, config.precision, config.quantize)
        ckpt = checkpoint.load(Path(path))
        model = precision.prepare(checkpoint.load_model(ckpt, device), device, config.precision, config.quantize)
        tokenizer = Tokenizer(checkpoint.tokenizer_bytes(ckpt), f"{path} (tokenizer)")
        return cls(model, tokenizer, config, device)

    def _encode(self, start: int, lines: list[str]) -> list[list[int]]:
        """Token ids of each line (one tokenizer call per chunk), cropped to the model's positions."""
        ids = self.tokenizer.encode_batch(lines)
        for k, seq in enumerate(ids):
            if len(seq) > self.max_src:
                log.warn(f"input line {start + k + 1}: {len(seq)} tokens, cropped to the model's {self.max_src}")
                ids[k] = seq[: self.max_src]
        return ids

    def _batches(self, order: list[int], lengths: list[int]) -> Iterator[list[int]]:
        c = self.config
        batch: list[int] = []
        width = 0
        for i in order:
            w = max(width, lengths[i] + 1)
            if batch and (len(batch) >= c.batch_size or (c.max_tokens and w * (len(batch) + 1) > c.max_tokens)):
                yield batch
                batch, w = [], lengths[i] + 1
            batch.append(i)
            width = w
        if batch:
            yield batch

    def translate_chunk(self, start: int, lines: list[str]) -> list[Translation]:
        """Translate lines numbered start, start+1, ...; results in the same order."""
        return self.translate_ids(start, lines, self._encode(start, lines))

    def translate_ids(self, start: int, lines: list[str], ids: list[list[int]]) -> list[Translation]:
        """translate_chunk after tokenization: `ids` are the token ids of `lines` (training's
        validation passes the valid split's ids here, so it decodes exactly as translate does)."""
        c, pad, eos = self.config, self.model.config.pad_id, self.model.config.eos_id
        ids = [seq[: self.max_src] for seq in ids]  # _encode crops with a warning; stored ids silently
        results: list[Optional[list[Hypothesis]]] = [None] * len(lines)
        alignments: list[Optional[list]] = [None] * len(lines)
        todo = [k for k in range(len(lines)) if ids[k]]  # an empty line translates to an empty line
        lengths = [len(x) for x in ids]
        todo.sort(key=lambda k: lengths[k], reverse=True)
        for batch in self._batches(todo, lengths):
            S = max(lengths[k] for k in batch) + 1
            src = torch.full((len(batch), S), pad, dtype=torch.long)
            for row, k in enumerate(batch):
                src[row, : lengths[k]] = torch.tensor(ids[k])
                src[row, lengths[k]] = eos
            src = src.to(self.device)
            with torch.inference_mode():  # the model is already in its decoding precision (precision.py)
                hyps = search(self.model, src, c.beam, c.max_len_a, c.max_len_b, c.lenpen, c.nbest)
                if c.print_alignment:  # one forced pass over the final hypotheses; search is untouched
                    for k, a in zip(batch, align_hypotheses(self.model, src, hyps, c.alignment_layer)):
                        alignments[k] = a
            for k, h in zip(batch, hyps):
                results[k] = h
        out = []
        for k, line in enumerate(lines):
            hyps = results[k] or []
            out.append(Translation(start + k, line, hyps, [self.tokenizer.decode(h.tokens) for h in hyps], alignments[k]))
        return out

    def translate(self, lines: Iterable[str]) -> list[str]:
        """Best translation of each line (for programs that embed seqtool)."""
        return [t.texts[0] if t.texts else "" for t in self.translate_stream(lines)]

    def translate_stream(self, lines: Iterable[str]) -> Iterator[Translation]:
        chunk: list[str] = []
        start = 0
        for line in lines:
            if line.endswith("\n"):
                line = line[:-1].removesuffix("\r")
            chunk.append(line)
            if len(chunk) >= self.config.chunk_lines:
                yield from self.translate_chunk(start, chunk)
                start += len(chunk)
                chunk = []
        if chunk:
            yield from self.translate_chunk(start, chunk)


def format_translation(t: Translation, config: DecodeConfig) -> str:
    """Plain: the best hypothesis. With --nbest N > 1, --print-scores or --print-alignment: N
    tab-separated lines, `index score hypothesis [alignment]`.

    A hypothesis never spans lines: a \\n decoded from a byte piece becomes a space."""
    texts = [text.replace("\n", " ") for text in t.texts]
    if config.nbest == 1 and not config.print_scores and not config.print_alignment:
        return (texts[0] if texts else "") + "\n"
    rows = [f"{t.index}\t{h.score:.4f}\t{text}" for h, text in zip(t.hypotheses, texts)]
    if config.print_alignment:
        rows = [f"{row}\t{format_alignment(a)}" for row, a in zip(rows, t.alignments or [])]
    if not rows:  # an empty line: one empty hypothesis, still N lines as promised
        rows = [f"{t.index}\t0.0000\t" + ("\t" if config.print_alignment else "")] * config.nbest
    rows += [rows[-1]] * (config.nbest - len(rows))
    return "\n".join(rows) + "\n"


class _LineReader:
    """Reads lines (\\n only) in a thread, so the main loop can stop waiting after a short pause."""

    def __init__(self, stream: BinaryIO, name: str, maxsize: int, errors: str = "replace"):
        self.queue: queue.Queue = queue.Queue(maxsize=maxsize)
        self.stream, self.decode = stream, LineDecoder(name, errors)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for lineno, raw in enumerate(self.stream, start=1):
                self.queue.put(self.decode(raw, lineno))
            self.decode.finish()
        except BaseException as error:  # handed to the main thread, which reports it
            self.queue.put(error)
        self.queue.put(None)

    def chunks(self, size: int) -> Iterator[list[str]]:
        """Lists of up to `size` lines. The end of input (None) or the reader's error is acted on
        after the chunk of lines read before it."""
        item = self.queue.get()
        while item is not None:
            if isinstance(item, BaseException):
                raise item
            chunk, item = [item], _NEXT
            while len(chunk) < size:
                try:
                    following = self.queue.get(timeout=IDLE_FLUSH_SECONDS)
                except queue.Empty:
                    break  # input paused: translate what has arrived
                if following is None or isinstance(following, BaseException):
                    item = following
                    break
                chunk.append(following)
            yield chunk
            if item is _NEXT:
                item = self.queue.get()


def translate_file(checkpoint_path: Path, config: DecodeConfig, input_path: Optional[Path] = None,
                   output: Optional[TextIO] = None) -> int:
    """The `seqtool translate` command: stdin (or --input) to stdout (or an open output); returns lines."""
    # the input first: a missing file or a closed stdin is reported before the model loads
    if input_path is not None:
        stream, name = open_binary(input_path), str(input_path)
    else:
        stream, name = open_stdin(), "<stdin>"
    translator = Translator.load(checkpoint_path, config)
    output = output or sys.stdout
    reader = _LineReader(stream, name, maxsize=4 * config.chunk_lines, errors=config.errors)
    count = 0
    for chunk in reader.chunks(config.chunk_lines):
        for t in translator.translate_chunk(count, chunk):
            output.write(format_translation(t, config))
        output.flush()
        count += len(chunk)
    return count
