"""Parallel text -> memory-mapped token arrays.

Writes DATA_DIR in the format data.py defines and reads (per split and language a flat token
array and its offsets, meta.json, a copy of the tokenizer). Streams both sides in chunks, so memory stays flat as the
corpus grows; --workers encodes chunks in several processes while the parent writes in order.
Every array is written under a temp name and renamed only when all splits succeeded, and
meta.json comes last: an error or Ctrl-C leaves no file that looks complete.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import multiprocessing as mp
import os
import signal
import threading
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

import numpy as np

from .data import FORMAT_VERSION, shard_paths, token_dtype
from .errors import InputError, ResourceError
from .interrupts import Interrupts
from .procpool import WatchedPool, WorkerDied
from .textio import atomic_write_bytes, find_split_file, read_lines
from .tokenizer import Tokenizer

CHUNK_LINES = 4096


@dataclass
class SplitSpec:
    name: str  # train / valid / test
    prefix: str


# Worker side: each process loads the tokenizer once from bytes.
_worker_tokenizer: Optional[Tokenizer] = None


def _init_worker(model_bytes: bytes) -> None:
    global _worker_tokenizer
    _worker_tokenizer = Tokenizer(model_bytes)


class _EncodingPool:
    """Worker processes that encode chunks, with Ctrl-C taken only at safe points.

    A terminal sends SIGINT to the whole process group. The workers ignore it (the disposition is
    set before spawn's exec, so it holds from their first instruction); only the parent acts. In the
    parent, a KeyboardInterrupt raised at an arbitrary instruction can land inside multiprocessing's
    own locking (e.g. between a queue's lock acquire and its try/finally inside apply_async) and leave
    the pool's handler threads, and so Pool.terminate(), waiting forever: the likeliest cause of a
    binarize that once did not exit after Ctrl-C in CI. So while the pool lives, SIGINT only sets a
    flag, checked between chunks and while waiting for results (every 50 ms), and the
    KeyboardInterrupt is raised from there."""

    def __init__(self, workers: int, model_bytes: bytes):
        self.workers = workers
        self.model_bytes = model_bytes
        self.interrupted = threading.Event()
        self.previous = self.previous_term = None

    def __enter__(self) -> "_EncodingPool":
        main = threading.current_thread() is threading.main_thread()  # only it may set handlers
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            # concurrent.futures (procpool.py), not multiprocessing.Pool: a dead worker is reported,
            # where Pool waits forever for the lost chunk and its terminate() can block on a queue
            # lock the dead worker held. Started now, while SIGINT is ignored.
            self.pool = WatchedPool(self.workers, mp.get_context("spawn"), _init_worker, (self.model_bytes,))
        except BrokenProcessPool:
            raise ResourceError(f"--workers {self.workers}: an encoding process failed to start (out of memory?)") from None
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)
        if main:  # SIGTERM too: it also stops the run with its temp files removed
            self.previous = signal.signal(signal.SIGINT, lambda signum, frame: self.interrupted.set())
            self.previous_term = signal.signal(signal.SIGTERM, lambda signum, frame: self.interrupted.set())
        return self

    def check(self) -> None:
        if self.interrupted.is_set():
            raise KeyboardInterrupt

    def submit(self, lines: list[str], side: str = "source"):
        self.check()
        try:
            return self.pool.submit(_encode_chunk, lines, side)
        except WorkerDied as died:
            raise self._died(died.pid) from None

    def get(self, result) -> list[list[int]]:
        try:
            return self.pool.result(result, between=self.check)
        except WorkerDied as died:
            raise self._died(died.pid) from None

    def _died(self, pid: Optional[int] = None) -> ResourceError:
        which = f" (PID {pid})" if pid is not None else ""
        return ResourceError(f"a --workers process{which} died: killed, or out of memory; nothing was written; "
                             "run again, with fewer --workers if memory is short")

    def __exit__(self, *exc) -> None:
        self.pool.shutdown()  # the running chunks (small) end first: no worker outlives the pool
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            signal.signal(signal.SIGTERM, self.previous_term)
        if exc[0] is None:
            self.check()  # a Ctrl-C after the last check still stops the run before anything is committed


def _encode_chunk(lines: list[str], side: str = "source") -> list[list[int]]:
    assert _worker_tokenizer is not None
    return _worker_tokenizer.encode_batch(lines, side)


def unaligned(src, na: int, tgt, nb: int) -> InputError:
    return InputError(f"{src} has {na} lines but {tgt} has {nb}; the two sides of a parallel corpus must align line by line")


def _paired_chunks(src: Path, tgt: Path, errors: str) -> Iterator[tuple[list[str], list[str]]]:
    """Chunks of aligned lines; unequal line counts stop with both files and counts named."""
    src_lines, tgt_lines = read_lines(src, errors), read_lines(tgt, errors)
    n = 0
    while True:
        a = list(itertools.islice(src_lines, CHUNK_LINES))
        b = list(itertools.islice(tgt_lines, CHUNK_LINES))
        n += min(len(a), len(b))
        if len(a) != len(b):
            na = n + (len(a) - min(len(a), len(b))) + sum(1 for _ in src_lines)
            nb = n + (len(b) - min(len(a), len(b))) + sum(1 for _ in tgt_lines)
            raise unaligned(src, na, tgt, nb)
        if not a:
            return
        yield a, b


class _ArrayWriter:
    """Appends token ids to DIR/NAME.bin and offsets to NAME.idx (written under temp names)."""

    def __init__(self, path_bin: Path, path_idx: Path, dtype: np.dtype):
        self.final = (path_bin, path_idx)
        pid = os.getpid()  # two runs writing one directory never share a temp file
        self.tmp = (path_bin.with_suffix(f".bin.{pid}.tmp"), path_idx.with_suffix(f".idx.{pid}.tmp"))
        self.dtype = dtype
        self.bin = open(self.tmp[0], "wb")
        self.idx = open(self.tmp[1], "wb")
        self.total = 0
        self.lines = 0
        self.committed: list[Path] = []
        self.idx.write(np.zeros(1, dtype=np.int64).tobytes())

    def add(self, seqs: Sequence[Sequence[int]]) -> None:
        lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
        flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype=self.dtype, count=int(lengths.sum()))
        # file.write of the raw bytes (what ndarray.tofile writes): a Ctrl-C inside tofile can
        # surface as "TypeError: expected str, bytes or os.PathLike object, not BufferedWriter"
        # (numpy falls back to treating the file as a path), seen once in CI
        self.bin.write(flat.tobytes())
        self.idx.write((self.total + np.cumsum(lengths)).tobytes())
        self.total += int(lengths.sum())
        self.lines += len(seqs)

    def close(self) -> None:
        self.bin.close()
        self.idx.close()

    def commit(self) -> None:
        for tmp, final in zip(self.tmp, self.final):
            tmp.replace(final)
            self.committed.append(final)

    def discard(self) -> None:
        """Remove what this run wrote, also files already renamed (a failure or Ctrl-C during the commit)."""
        self.close()
        for path in (*self.tmp, *self.committed):
            path.unlink(missing_ok=True)


def write_split(out_dir: Path, split: str, lang: str, seqs: Sequence[Sequence[int]], dtype: np.dtype) -> tuple[int, int]:
    """One side of one split (SPLIT.LANG.bin/.idx) in out_dir from token id sequences, written under
    temp names and then renamed; returns its lines and tokens."""
    writer = _ArrayWriter(*shard_paths(out_dir, split, lang), dtype)
    try:
        for at in range(0, len(seqs), 4096):
            writer.add(seqs[at: at + 4096])
        writer.close()
        writer.commit()
    except BaseException:
        writer.discard()
        raise
    return writer.lines, writer.total


def binarize(
    src_lang: str, tgt_lang: str, splits: Sequence[SplitSpec], tokenizer_path: Path, out_dir: Path,
    workers: int = 1, errors: str = "strict", force: bool = False,
) -> dict:
    """Encode every split into out_dir; returns the meta dict written to meta.json."""
    if src_lang == tgt_lang:
        raise InputError(f"--src and --tgt are both {src_lang!r}; give two different language suffixes")
    tokenizer = Tokenizer.load(tokenizer_path)
    files = {s.name: (find_split_file(s.prefix, src_lang), find_split_file(s.prefix, tgt_lang)) for s in splits}
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{out_dir}: is a file; --out names a directory for the binarized data")
    if (out_dir / "meta.json").exists() and not force:
        raise InputError(f"{out_dir}: already holds binarized data (meta.json); pass --force to replace it or pick another --out")
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(tokenizer.vocab_size)
    meta = {
        "format_version": FORMAT_VERSION,
        "src_lang": src_lang,
        "tgt_lang": tgt_lang,
        "vocab_size": tokenizer.vocab_size,
        "special_ids": {"pad": tokenizer.pad_id, "unk": tokenizer.unk_id, "bos": tokenizer.bos_id, "eos": tokenizer.eos_id},
        "dtype": dtype.name,
        "tokenizer_sha256": hashlib.sha256(tokenizer.model_bytes).hexdigest(),
        "splits": {},
    }
    writers: list[_ArrayWriter] = []
    interrupts = Interrupts()  # SIGTERM, like Ctrl-C, stops the run and removes its temp files
    interrupts.install()
    try:
        with (_EncodingPool(workers, tokenizer.model_bytes) if workers > 1 else contextlib.nullcontext()) as pool:
            for name, (src, tgt) in files.items():
                meta["splits"][name] = _binarize_split(name, src, tgt, src_lang, tgt_lang, tokenizer, out_dir, dtype, pool, workers, errors, writers)
        # All splits are done: only now replace anything. Old data first loses its meta.json, so a
        # failure between here and the new meta.json never leaves a directory that looks complete.
        (out_dir / "meta.json").unlink(missing_ok=True)
        for w in writers:
            w.commit()
        atomic_write_bytes(out_dir / "tokenizer.model", tokenizer.model_bytes)
        atomic_write_bytes(out_dir / "meta.json", (json.dumps(meta, indent=2) + "\n").encode())
    except BaseException:
        for w in writers:
            w.discard()
        if created and not any(out_dir.iterdir()):
            out_dir.rmdir()
        raise
    finally:
        interrupts.restore()
    return meta


def _binarize_split(name, src, tgt, src_lang, tgt_lang, tokenizer, out_dir, dtype, pool, workers, errors, all_writers) -> dict:
    """Write one split under temp names; the writers join all_writers, which the caller commits."""
    writers = []
    for lang in (src_lang, tgt_lang):
        writers.append(_ArrayWriter(*shard_paths(out_dir, name, lang), dtype))
        all_writers.append(writers[-1])
    unk = [0, 0]
    try:
        pending: list = []

        def drain(limit: int) -> None:
            while len(pending) > limit:
                for k, result in enumerate(pending.pop(0)):
                    ids = pool.get(result) if pool is not None else result
                    unk[k] += sum(s.count(tokenizer.unk_id) for s in ids)
                    writers[k].add(ids)

        for a, b in _paired_chunks(src, tgt, errors):
            if pool is None:
                pending.append((tokenizer.encode_batch(a), tokenizer.encode_batch(b, "target")))
            else:
                pending.append((pool.submit(a), pool.submit(b, "target")))
            drain(workers)  # bounded work in flight: memory does not grow with the corpus
        drain(0)
        if writers[0].lines == 0:
            raise InputError(f"{src}: empty file; split {name!r} needs at least one line")
    finally:
        for w in writers:
            w.close()
    return {
        "lines": writers[0].lines,
        "src_tokens": writers[0].total,
        "tgt_tokens": writers[1].total,
        "src_unk": unk[0],
        "tgt_unk": unk[1],
        "src_file": str(src),
        "tgt_file": str(tgt),
    }

