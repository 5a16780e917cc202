"""--teacher CKPT: sequence-level knowledge distillation (Kim & Rush, 2016, "Sequence-Level Knowledge
Distillation").

Owns the teachers of a run (read once, checked against the student's data: tokenizer, vocabulary,
languages; one line naming what differs), the distillation pass (the training source translated by
the teacher, or by the ensemble of teachers, with the search, batching and precision `seqtool
translate` uses by default) and its cache: SAVE_DIR/distill/KEY/, a DATA_DIR of one split whose
target side is the teachers' best translations, KEY a digest of the teachers' weights, the
tokenizer, the training source and the search. A resumed run, or a second student trained in the
same SAVE_DIR (--force) from the same teachers, finds it and does not translate again; a teacher
file changed between runs has another digest, so it is translated afresh, and a resumed run
refuses (its saved configs name the old digest).

Under torchrun every rank translates its share (every world-th sentence of the longest-first
order) and rank 0 writes the split. The pass's time is its own: --max-time counts training only.

What the student learns from: by default both the teachers' outputs and the original targets
(each source twice), or with --teacher-only the teachers' outputs alone (the paper's "seq-KD"). Validation always
scores against the real references. A distilled checkpoint records its decoding defaults
(DECODING: greedy, as the paper decodes its students); translate and serve use them unless told
otherwise.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from .. import checkpoint, log
from ..binarize import write_split
from ..config import DecodeConfig, ModelConfig, SearchOptions
from ..data import ParallelDataset, shard_paths
from ..errors import InputError
from ..textio import atomic_write_bytes

# What a distilled checkpoint's translate and serve use unless an option says otherwise. Kim & Rush: a
# student trained on the teacher's beam output decodes greedily at close to the teacher's beam quality.
# Greedy search has a fifth of beam 5's rows per step, so its steps are small and their fixed costs
# weigh: 256 sentences a batch (the small preset greedy on 1,000 bible lines, 2 threads: 280 -> 397
# sentences/s from 64); int8, faster than fp32 and bf16 there (the 4+1 student's translate call: 829 / 473 / 694
# sentences/s; a whole process loads int8 more slowly: 5.2 s against bf16's 4.8 s; bench/students.py).
DECODING: dict[str, Any] = {"beam": 1, "batch_size": 256, "quantize": "int8"}
CHUNK = 2048  # sentences translated, then counted in the progress, at a time


@dataclass(frozen=True)
class Distill:
    """What --teacher and --distill-original ask for."""
    teachers: tuple[Path, ...]
    # also train on the original targets (--distill-original; --teacher-only: not). The 4+1 student of
    # bench/students.py, 20 minutes: 21.02 BLEU with them, 19.74 without (teacher, beam 5: 21.83)
    original: bool = True


@dataclass
class Teacher:
    path: Path
    weights_sha256: str
    tokenizer_bytes: bytes
    model: ModelConfig
    src_lang: str
    tgt_lang: str

    @property
    def tokenizer_sha256(self) -> str:
        return hashlib.sha256(self.tokenizer_bytes).hexdigest()

    @property
    def digest(self) -> str:
        """How the run's configs name it: its path and weights (a changed file is another teacher)."""
        return f"{self.path}@{self.weights_sha256[:16]}"


class Teachers:
    """A run's teachers, read once; `path` and `tokenizer_bytes` (the first's, which all share) make
    it a tokenizer source for raw files, as a --finetune checkpoint is one."""

    def __init__(self, spec: Distill):
        self.spec = spec
        self.members: list[Teacher] = []
        for path in spec.teachers:
            ckpt = checkpoint.load(path)  # missing, damaged or foreign files: one clear line
            train = (ckpt.get("configs") or {}).get("train") or {}
            self.members.append(Teacher(Path(path), ckpt["weights_sha256"], checkpoint.tokenizer_bytes(ckpt),
                                        ModelConfig.from_dict(ckpt["model_config"]), train.get("src_lang", ""),
                                        train.get("tgt_lang", "")))
            del ckpt
        first = self.members[0]
        for other in self.members[1:]:
            if other.tokenizer_bytes != first.tokenizer_bytes:
                raise InputError(f"--teacher {other.path}: its tokenizer differs from {first.path}'s (sha256 "
                                 f"{other.tokenizer_sha256[:12]} vs {first.tokenizer_sha256[:12]}); the teachers of a run "
                                 f"must share one tokenizer")
        self.path, self.tokenizer_bytes = first.path, first.tokenizer_bytes

    @property
    def tokenizer_sha256(self) -> str:
        return self.members[0].tokenizer_sha256

    def describe(self) -> dict[str, Any]:
        """What the run's saved configs record (resume compares it: a changed teacher refuses)."""
        return {"teachers": [t.digest for t in self.members], "original": self.spec.original}

    def check(self, meta: dict, tokenizer_bytes: bytes, data_dir: Path) -> None:
        """Each teacher against the student's data: one line naming what differs."""
        for t in self.members:
            where = f"--teacher {t.path}"
            if t.tokenizer_bytes != tokenizer_bytes:
                raise InputError(f"{where}: its tokenizer differs from the one {data_dir} was binarized with (sha256 "
                                 f"{t.tokenizer_sha256[:12]} vs {hashlib.sha256(tokenizer_bytes).hexdigest()[:12]}); the student "
                                 f"learns the teacher's token ids: binarize with the teacher's tokenizer, or give raw files "
                                 f"(--train/--valid) and seqtool does")
            if t.model.vocab_size != meta["vocab_size"]:
                raise InputError(f"{where}: vocabulary of {t.model.vocab_size} tokens, but {data_dir} has {meta['vocab_size']}")
            for side, theirs, ours in (("source", t.src_lang, meta["src_lang"]), ("target", t.tgt_lang, meta["tgt_lang"])):
                if theirs and theirs != ours:
                    raise InputError(f"{where}: translates {t.src_lang} -> {t.tgt_lang}, but the training data is "
                                     f"{meta['src_lang']} -> {meta['tgt_lang']} (the {side} language differs)")

    def cache_key(self, meta: dict, options: SearchOptions) -> str:
        """The distilled split's identity: the teachers' weights, the tokenizer, the training source, the search."""
        train = meta["splits"]["train"]
        what = {"teachers": [t.weights_sha256 for t in self.members], "tokenizer": self.tokenizer_sha256,
                "source": [train.get("lines"), train.get("src_tokens"), train.get("src_file"), meta["src_lang"]],
                "search": options.to_dict()}
        return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:20]


def prepare(teachers: Teachers, train_set: ParallelDataset, meta: dict, data_dir: Path, save_dir: Path, dist,
            device: str, threads: int) -> tuple[Path, float]:
    """SAVE_DIR/distill/KEY: the training source with the teachers' translations as its targets
    (made now, or found from an earlier run), and the seconds this pass took (0 when found). dist:
    the run's distributed.Group (every rank translates its share; rank 0 writes)."""
    options = SearchOptions()  # translate's defaults: beam, length penalty, lengths, loop guard
    out = Path(save_dir) / "distill" / teachers.cache_key(meta, options)
    if (out / "meta.json").exists():
        log.info(f"distillation: using the teachers' translations made earlier in {out}")
        return out, 0.0
    started = time.monotonic()
    order = np.argsort(-train_set.src.lengths, kind="stable")  # longest first: a batch too big fails at once
    mine = order[dist.rank::dist.world_size]
    targets = translate_share(teachers, train_set, mine, device, threads, options, len(order))
    gathered = dist.gather((mine, targets))
    if dist.is_main:
        write(out, train_set, meta, data_dir, gathered, teachers, options, time.monotonic() - started)
    dist.barrier(f"waiting for rank 0 to write {out}", patient=True)
    seconds = time.monotonic() - started
    log.info(f"distillation: {len(order):,} sentences translated by {len(teachers.members)} teacher(s) in {seconds:.0f}s "
             f"({len(order) / max(seconds, 1e-9):.1f} sentences/s), kept in {out}; --max-time counts training only")
    return out, seconds


def translate_share(teachers: Teachers, train_set: ParallelDataset, ids: np.ndarray, device: str, threads: int,
                    options: SearchOptions, total: int) -> list[list[int]]:
    """The best translation (token ids) of each source sentence in `ids`, translated as `seqtool
    translate` translates (its defaults), with a progress bar and its ETA."""
    from ..pipeline import Origin, Segment, run
    from ..translate import Translator

    config = DecodeConfig(device=device, threads=threads)
    targets: list[list[int]] = []
    progress = log.Progress(len(ids), "sentence", label="distill")
    started = time.monotonic()
    with Translator.load([t.path for t in teachers.members], config, options) as translator:
        log.info(f"distillation: translating {total:,} training sentences with the teacher(s) "
                 f"(beam {options.beam}, {translator.config.precision})")
        for at in range(0, len(ids), CHUNK):
            chunk = ids[at: at + CHUNK]
            segments = [Segment(int(i), "", train_set.src[int(i)].tolist(), origin=Origin(int(i), label=f"training pair {int(i) + 1}"))
                        for i in chunk]
            targets += [t.hypotheses[0].tokens if t.hypotheses else [] for t in run(translator, segments, options)]
            rate = len(targets) / max(time.monotonic() - started, 1e-9)
            progress.update(len(targets), f"{rate:.1f} sentences/s | eta {(len(ids) - len(targets)) / max(rate, 1e-9):.0f}s")
    progress.close()
    return targets


def write(out: Path, train_set: ParallelDataset, meta: dict, data_dir: Path, gathered: Sequence[tuple[np.ndarray, list]],
          teachers: Teachers, options: SearchOptions, seconds: float) -> None:
    """The distilled split as a DATA_DIR: the training source's shards (linked, or copied across file
    systems), the teachers' translations in source order, then meta.json (written last: a directory
    without it is a pass that did not finish, and is made again)."""
    targets: list[Optional[list[int]]] = [None] * len(train_set)
    for ids, translated in gathered:
        for i, t in zip(ids, translated):
            targets[int(i)] = t
    assert all(t is not None for t in targets), "every training sentence is translated by one rank"
    if out.exists():
        shutil.rmtree(out)  # an unfinished pass of our own (no meta.json)
    out.mkdir(parents=True)
    src, tgt = meta["src_lang"], meta["tgt_lang"]
    for source, dest in zip(shard_paths(data_dir, "train", src), shard_paths(out, "train", src)):
        try:
            os.link(source, dest)
        except OSError:
            shutil.copyfile(source, dest)
    lines, tokens = write_split(out, "train", tgt, targets, np.dtype(meta["dtype"]))  # type: ignore[arg-type]
    train = meta["splits"]["train"]
    atomic_write_bytes(out / "tokenizer.model", teachers.tokenizer_bytes)
    own = {**meta, "splits": {"train": {**train, "tgt_tokens": tokens, "tgt_file": "(the teachers' translations)"}},
           "distill": {**teachers.describe(), "search": options.to_dict(), "seconds": round(seconds, 1)}}
    atomic_write_bytes(out / "meta.json", (json.dumps(own, indent=2) + "\n").encode())
