"""--teacher CKPT: sequence-level knowledge distillation (Kim & Rush, 2016, "Sequence-Level Knowledge
Distillation").

Owns the teachers of a run (read once, checked against the student's data: tokenizer, vocabulary,
languages; one line naming what differs, and what no teacher can teach yet, such as a multilingual
one, refused before any work), the distillation pass (the training source translated by the
teacher, or by the ensemble of teachers, with the search, batching and precision `seqtool
translate` uses by default) and its cache: SAVE_DIR/distill/KEY/, a DATA_DIR of one split whose
target side is the teachers' best translations, KEY a digest of the teachers' weights, the
tokenizer, the training source and the search. A resumed run, or a second student trained in the
same SAVE_DIR (--force) from the same teachers, finds it and does not translate again; a teacher
file changed between runs has another digest, so it is translated afresh, and a resumed run
refuses (its saved configs name the old digest).

The cache's meta.json records what it was made from and the sha256 of each of its files; a cache
whose files do not match them, or whose token ids are not the student's, is damaged: it is made
again, with a warning saying why. The pass keeps its progress in SAVE_DIR/distill/KEY.partial/, one
file per CHUNK sentences of the longest-first order (its ids, its translations and their sha256,
each written atomically): a pass killed part way continues from its last complete chunk.

Under torchrun the chunks are shared round by round (rank r translates the r-th chunk of each round
of world chunks) and rank 0 keeps them and writes the split. The pass's time is its own: --max-time
counts training only.

What the student learns from: by default both the teachers' outputs and the original targets
(each source twice), or with --teacher-only the teachers' outputs alone (the paper's "seq-KD"). Validation always
scores against the real references. A distilled checkpoint records its decoding defaults
(DECODING: greedy, as the paper decodes its students); translate and serve use them unless told
otherwise.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from .. import checkpoint, log
from ..binarize import write_split
from ..config import DecodeConfig, ModelConfig, SearchOptions
from ..data import ParallelDataset, shard_paths
from ..errors import ConfigError, InputError
from ..languages import Languages
from ..textio import atomic_write, atomic_write_bytes, remove_stale_temps
from ..tokenizer import Tokenizer

# What a distilled checkpoint's translate and serve use unless an option says otherwise. Kim & Rush: a
# student trained on the teacher's beam output decodes greedily at close to the teacher's beam quality.
# Greedy search has a fifth of beam 5's rows per step, so its steps are small and their fixed costs
# weigh: 256 sentences a batch (the small preset greedy on 1,000 bible lines, 2 threads: 280 -> 397
# sentences/s from 64); int8, faster than fp32 and bf16 there (the 4+1 student's translate call: 829 / 473 / 694
# sentences/s; a whole process loads int8 more slowly: 5.2 s against bf16's 4.8 s; bench/students.py).
DECODING: dict[str, Any] = {"beam": 1, "batch_size": 256, "quantize": "int8"}
# sentences translated at a time (of the longest-first order), then counted in the progress and kept in
# KEY.partial: what a pass killed part way loses at most (per rank)
CHUNK = 2048


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
    languages: Optional[dict] = None  # a multilingual model's pairs and tags (configs["languages"]): refused

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
            configs = ckpt.get("configs") or {}
            train = configs.get("train") or {}
            self.members.append(Teacher(Path(path), ckpt["weights_sha256"], checkpoint.tokenizer_bytes(ckpt),
                                        ModelConfig.from_dict(ckpt["model_config"]), train.get("src_lang", ""),
                                        train.get("tgt_lang", ""), configs.get("languages") or None))
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

    def refuse_unsupported(self) -> None:
        """What no student can learn from these teachers yet, one line naming it: called before any
        work (a tokenizer trained, files binarized, data opened)."""
        for t in self.members:
            where = f"--teacher {t.path}"
            if t.languages or t.model.language_tags:
                try:
                    pairs = ", ".join(f"{s}-{g}" for s, g in Languages.from_dict(t.languages).pairs) if t.languages else ""
                except (KeyError, TypeError, ValueError):
                    pairs = ""
                tags = f"{t.model.vocab_size} ids, {t.model.language_tags} of them target-language tags" if t.model.language_tags else ""
                raise ConfigError(f"{where}: a multilingual model ({'; '.join(filter(None, (pairs, tags)))}): distillation from "
                                  f"a multilingual teacher is not supported; give a teacher trained on the student's one pair")
            pieces = Tokenizer(t.tokenizer_bytes, f"{where} (its tokenizer)").vocab_size
            if pieces != t.model.vocab_size:
                raise InputError(f"{where}: its model has {t.model.vocab_size} token ids but its tokenizer {pieces} pieces: a "
                                 f"student binarized with that tokenizer cannot learn its ids (not supported)")

    def check_pair(self, src: str, tgt: str, what: str) -> None:
        """The teachers translate src -> tgt (those of `what`: the training data, or --src/--tgt)."""
        for t in self.members:
            for side, theirs, ours in (("source", t.src_lang, src), ("target", t.tgt_lang, tgt)):
                if theirs and ours and theirs != ours:
                    raise InputError(f"--teacher {t.path}: translates {t.src_lang} -> {t.tgt_lang}, but {what} is "
                                     f"{src} -> {tgt} (the {side} language differs)")

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
        self.check_pair(meta["src_lang"], meta["tgt_lang"], "the training data")

    def made_from(self, meta: dict, options: SearchOptions) -> dict[str, Any]:
        """What the distilled split is made from: the teachers' weights, the tokenizer, the training source, the search."""
        train = meta["splits"]["train"]
        return {"teachers": [t.weights_sha256 for t in self.members], "tokenizer": self.tokenizer_sha256,
                "source": [train.get("lines"), train.get("src_tokens"), train.get("src_file"), meta["src_lang"]],
                "search": options.to_dict()}

    def cache_key(self, meta: dict, options: SearchOptions) -> str:
        """The distilled split's identity: a digest of what it is made from (made_from)."""
        return hashlib.sha256(json.dumps(self.made_from(meta, options), sort_keys=True, default=str).encode()).hexdigest()[:20]


Translations = tuple[np.ndarray, np.ndarray]  # some sentences' translations: offsets (n+1, int64) into their tokens (int64)


class Damaged(Exception):
    """A kept translation (the cache, or a chunk of an unfinished pass) that cannot be trusted: why."""


def prepare(teachers: Teachers, train_set: ParallelDataset, meta: dict, data_dir: Path, save_dir: Path, dist,
            device: str, threads: int) -> tuple[Path, float]:
    """SAVE_DIR/distill/KEY: the training source with the teachers' translations as its targets
    (made now, continued from the chunks an unfinished pass kept, or found, checked, from an earlier
    run), and the seconds this pass took (0 when found). dist: the run's distributed.Group (the
    ranks share the chunks; rank 0 checks what was kept, keeps the chunks and writes the split)."""
    options = SearchOptions()  # translate's defaults: beam, length penalty, lengths, loop guard
    made_from = teachers.made_from(meta, options)
    out = Path(save_dir) / "distill" / teachers.cache_key(meta, options)
    # rank 0 reads what was kept while the others wait without --dist-timeout (a large cache takes a while to hash)
    found = reusable(out, train_set, meta, made_from) if dist.is_main else None
    dist.barrier(f"waiting for rank 0 to check {out}", patient=True)
    if dist.from_main(found):
        return out, 0.0
    started = time.monotonic()
    order = np.argsort(-train_set.src.lengths, kind="stable")  # longest first: a batch too big fails at once
    chunks = [order[at: at + CHUNK] for at in range(0, len(order), CHUNK)]
    partial = out.with_name(f"{out.name}.partial")
    done = kept_chunks(partial, chunks, meta["vocab_size"]) if dist.is_main else {}
    dist.barrier(f"waiting for rank 0 to check {partial}", patient=True)
    todo: list[int] = dist.from_main([c for c in range(len(chunks)) if c not in done] if dist.is_main else None)
    if todo:
        translate_chunks(teachers, train_set, chunks, todo, partial, done, dist, device, threads, options)
    if dist.is_main:
        write(out, train_set, meta, data_dir, chunks, done, teachers, made_from, time.monotonic() - started)
        shutil.rmtree(partial, ignore_errors=True)  # (after meta.json: a kill in between reuses every chunk)
    dist.barrier(f"waiting for rank 0 to write {out}", patient=True)
    seconds = time.monotonic() - started
    translated = sum(len(chunks[c]) for c in todo)
    earlier = f", {len(order) - translated:,} more by an earlier pass" if translated < len(order) else ""
    log.info(f"distillation: {translated:,} sentences translated by {len(teachers.members)} teacher(s) in {seconds:.0f}s "
             f"({translated / max(seconds, 1e-9):.1f} sentences/s){earlier}, kept in {out}; --max-time counts training only")
    return out, seconds


def reusable(out: Path, train_set: ParallelDataset, meta: dict, made_from: dict) -> bool:
    """Whether `out` holds a finished pass to train on, its files checked against their sha256 and
    its ids against the student's vocabulary; a damaged one is removed, with a warning saying why."""
    if not (out / "meta.json").exists():
        return False  # never made, or a write that did not finish (write starts over)
    try:
        check_cache(out, train_set, meta, made_from)
    except Damaged as damage:
        log.warn(f"distillation: the teachers' translations in {out} are damaged ({damage}); translating the training source again")
        shutil.rmtree(out)
        return False
    log.info(f"distillation: using the teachers' translations made earlier in {out} (sha256 checked)")
    return True


def check_cache(out: Path, train_set: ParallelDataset, meta: dict, made_from: dict) -> None:
    """Damaged (why) unless `out` is what write() wrote from `made_from` for this training set."""
    try:
        own = json.loads((out / "meta.json").read_text())
        recorded = own["distill"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise Damaged(f"meta.json unreadable: {type(error).__name__}") from None
    digests = recorded.get("sha256") if isinstance(recorded, dict) else None
    if not isinstance(digests, dict):
        raise Damaged("meta.json records no sha256 of its files: made by an earlier seqtool")
    if recorded.get("made_from") != json.loads(json.dumps(made_from, default=str)):
        raise Damaged("meta.json says it was made from other teachers, tokenizer, source or search")
    if any(own.get(k) != meta.get(k) for k in ("src_lang", "tgt_lang", "vocab_size", "dtype")):
        raise Damaged("meta.json does not describe the training data")
    names = cache_files(meta)
    if sorted(digests) != sorted(names):
        raise Damaged(f"meta.json records the sha256 of {', '.join(sorted(digests))}, not of {', '.join(names)}")
    for name in names:
        if not (out / name).is_file():
            raise Damaged(f"{name} is missing")
        if file_sha256(out / name) != digests[name]:
            raise Damaged(f"{name} does not match its sha256")
    try:
        taught = ParallelDataset(out, "train", meta)
    except InputError as error:
        raise Damaged(str(error)) from None
    if len(taught) != len(train_set) or not np.array_equal(taught.src.lengths, train_set.src.lengths):
        raise Damaged("its source is not the training source")
    check_ids(taught.tgt.offsets, taught.tgt.tokens, len(train_set), meta["vocab_size"])


def check_ids(offsets: np.ndarray, tokens: np.ndarray, n: int, vocab_size: int) -> None:
    """Damaged unless `offsets` delimit n sentences of `tokens`, every id one of the student's."""
    if len(offsets) != n + 1 or offsets[0] != 0 or offsets[-1] != len(tokens) or bool(np.any(offsets[1:] < offsets[:-1])):
        raise Damaged(f"its offsets are not those of {n:,} sentences")
    if len(tokens) and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        at = int(np.flatnonzero((tokens < 0) | (tokens >= vocab_size))[0])
        sentence = int(np.searchsorted(offsets, at, side="right"))  # 1-based
        raise Damaged(f"sentence {sentence} holds token id {int(tokens[at])}, outside the student's vocabulary of {vocab_size}")


def cache_files(meta: dict) -> list[str]:
    """The files of a distilled split whose sha256 its meta.json records."""
    sides = [p.name for lang in (meta["src_lang"], meta["tgt_lang"]) for p in shard_paths(Path(), "train", lang)]
    return [*sides, "tokenizer.model"]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


# ---- the pass, chunk by chunk ----------------------------------------------------------------
def chunk_path(partial: Path, c: int) -> Path:
    return partial / f"chunk{c:06d}.npz"


def chunk_digest(ids: np.ndarray, offsets: np.ndarray, tokens: np.ndarray) -> bytes:
    digest = hashlib.sha256()
    for array in (ids, offsets, tokens):
        array = np.ascontiguousarray(array, dtype=np.int64)
        digest.update(len(array).to_bytes(8, "little"))
        digest.update(array.tobytes())
    return digest.digest()


def keep_chunk(partial: Path, c: int, ids: np.ndarray, translations: Translations) -> None:
    """Chunk c's sentence ids and translations, with their sha256, in KEY.partial (atomically)."""
    offsets, tokens = translations
    ids = np.asarray(ids, dtype=np.int64)
    digest = np.frombuffer(chunk_digest(ids, offsets, tokens), dtype=np.uint8)
    atomic_write(chunk_path(partial, c), lambda handle: np.savez(handle, ids=ids, offsets=offsets, tokens=tokens, sha256=digest))


def read_chunk(path: Path, ids: np.ndarray, vocab_size: int) -> Translations:
    """A kept chunk's translations; Damaged unless it is whole (its sha256), of the sentences `ids`,
    and in the student's vocabulary."""
    try:
        with np.load(path, allow_pickle=False) as stored:
            ids_, offsets, tokens, digest = (stored[k] for k in ("ids", "offsets", "tokens", "sha256"))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
        raise Damaged(f"unreadable: {type(error).__name__}") from None
    if digest.tobytes() != chunk_digest(ids_, offsets, tokens):
        raise Damaged("does not match its sha256")
    if not np.array_equal(ids_, ids):
        raise Damaged("holds other sentences")
    check_ids(offsets, tokens, len(ids), vocab_size)
    return offsets.astype(np.int64), tokens.astype(np.int64)


def kept_chunks(partial: Path, chunks: list[np.ndarray], vocab_size: int) -> dict[int, Translations]:
    """The chunks an unfinished pass kept in `partial` that can be trusted (a damaged one is
    translated again, with a warning), saying how many sentences they spare."""
    if not partial.is_dir():
        return {}
    remove_stale_temps(partial, r"chunk\d+\.npz")  # a chunk being written when its pass was killed
    done, damaged = {}, []
    for c, ids in enumerate(chunks):
        path = chunk_path(partial, c)
        if not path.exists():
            continue
        try:
            done[c] = read_chunk(path, ids, vocab_size)
        except Damaged as damage:
            damaged.append(f"{path.name}: {damage}")
    if damaged:
        log.warn(f"distillation: {len(damaged)} chunk(s) kept in {partial} are damaged and translated again "
                 f"({'; '.join(damaged[:3])}{'; ...' if len(damaged) > 3 else ''})")
    reused = sum(len(chunks[c]) for c in done)
    total = sum(len(ids) for ids in chunks)
    if reused:
        log.info(f"distillation: reusing {reused:,} of {total:,} sentences translated by an earlier pass ({len(done)} chunk(s) "
                 f"in {partial}); translating the other {total - reused:,}")
    return done


def pack(seqs: list[list[int]]) -> Translations:
    lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths)])
    return offsets, np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=int(offsets[-1]))


def translate_chunk(translator, train_set: ParallelDataset, ids: np.ndarray, options: SearchOptions) -> Translations:
    """The best translation of each source sentence in `ids`, as `seqtool translate` makes it (its defaults)."""
    from ..pipeline import Origin, Segment, run

    segments = [Segment(int(i), "", train_set.src[int(i)].tolist(), origin=Origin(int(i), label=f"training pair {int(i) + 1}"))
                for i in ids]
    return pack([t.hypotheses[0].tokens if t.hypotheses else [] for t in run(translator, segments, options)])


def translate_chunks(teachers: Teachers, train_set: ParallelDataset, chunks: list[np.ndarray], todo: list[int], partial: Path,
                     done: dict[int, Translations], dist, device: str, threads: int, options: SearchOptions) -> None:
    """Translates the chunks `todo` (the same list on every rank) round by round, a chunk a rank (rank
    r the r-th of each round); rank 0 gathers each round's, keeps each chunk in `partial` and adds it
    to `done`. A progress bar with its ETA."""
    from ..translate import Translator

    config = DecodeConfig(device=device, threads=threads)
    total = sum(len(chunks[c]) for c in todo)
    progress = log.Progress(total, "sentence", label="distill")
    started, translated = time.monotonic(), 0
    if dist.is_main:
        partial.mkdir(parents=True, exist_ok=True)
    with Translator.load([t.path for t in teachers.members], config, options) as translator:
        log.info(f"distillation: translating {total:,} training sentences with the teacher(s) "
                 f"(beam {options.beam}, {translator.config.precision})")
        for at in range(0, len(todo), dist.world_size):
            round_ = todo[at: at + dist.world_size]
            mine = round_[dist.rank] if dist.rank < len(round_) else None
            translations = translate_chunk(translator, train_set, chunks[mine], options) if mine is not None else None
            for c, kept in dist.gather((mine, translations)) or []:
                if c is not None:
                    keep_chunk(partial, c, chunks[c], kept)
                    done[c] = kept
            translated += sum(len(chunks[c]) for c in round_)
            rate = translated / max(time.monotonic() - started, 1e-9)
            progress.update(translated, f"{rate:.1f} sentences/s | eta {(total - translated) / max(rate, 1e-9):.0f}s")
    progress.close()


def write(out: Path, train_set: ParallelDataset, meta: dict, data_dir: Path, chunks: list[np.ndarray],
          done: dict[int, Translations], teachers: Teachers, made_from: dict, seconds: float) -> None:
    """The distilled split as a DATA_DIR: the training source's shards (linked, or copied across file
    systems), the teachers' translations in source order, then meta.json with what it was made from
    and the sha256 of each file (written last: a directory without it is a pass that did not finish,
    and is made again)."""
    targets: list[Optional[list[int]]] = [None] * len(train_set)
    for c, ids in enumerate(chunks):
        offsets, tokens = done[c]
        for k, i in enumerate(ids):
            targets[int(i)] = tokens[offsets[k]: offsets[k + 1]].tolist()
    assert all(t is not None for t in targets), "every training sentence is translated"
    if out.exists():
        shutil.rmtree(out)  # an unfinished write of our own (no meta.json)
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
           "distill": {**teachers.describe(), "search": made_from["search"], "seconds": round(seconds, 1),
                       "made_from": made_from, "sha256": {name: file_sha256(out / name) for name in cache_files(meta)}}}
    atomic_write_bytes(out / "meta.json", (json.dumps(own, indent=2, default=str) + "\n").encode())
