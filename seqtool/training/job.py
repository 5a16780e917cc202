"""What a training run is asked to do, the data it reads, and what it gives back.

Owns the job (configs, where the data is: DATA_DIR, or raw files that prepare_raw tokenizes and
binarizes into SAVE_DIR/data through train-tokenizer's and binarize's code), opening the data with
the checks that it is what the job asks for (languages, tokenizer, a valid split where one is
needed), and the run's summary. The loop itself is train.py's.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Protocol

from .. import log
from . import distributed, finetune, multilingual
from ..binarize import SplitSpec, binarize
from ..config import ModelConfig, OptimConfig, TokenizerConfig, TrainConfig
from ..data import ParallelDataset, epoch_batches, min_pair_length, read_meta
from ..errors import ConfigError, InputError
from ..languages import Corpus
from ..tokenizer import Tokenizer, train_tokenizer
from .distill import Distill, Teachers


@dataclass
class RawData:
    """Raw parallel files to tokenize and binarize into SAVE_DIR/data before training: one pair's
    (prefixes, with --src/--tgt), or several pairs' (corpora: --corpus and --valid-corpus)."""

    train_prefix: str = ""
    valid_prefix: str = ""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    workers: int = 1
    corpora: list = field(default_factory=list)  # [(languages.Corpus, its validation Corpus)], two or more


@dataclass
class TrainJob:
    save_dir: Path
    model: ModelConfig  # vocab_size and special ids are taken from the data
    optim: OptimConfig
    train: TrainConfig
    data_dir: Optional[Path] = None
    raw: Optional[RawData] = None
    force: bool = False  # start afresh in a SAVE_DIR that holds another run (instead of resuming or refusing)
    finetune: Optional[finetune.Finetune] = None  # start from these weights (and tokenizer), with fresh training state
    distill: Optional["Distill"] = None  # learn the translations of these teachers (distill.py)


@dataclass
class TrainResult:
    updates: int
    epochs: float
    best_valid_loss: float
    last_valid_loss: float
    train_tokens: int
    train_seconds: float
    skipped_too_long: int
    save_dir: Path
    stopped_by: str
    best_metric: str = "loss"
    best_value: float = float("nan")  # of best_metric
    distill_seconds: float = 0.0  # the teachers' pass (--teacher), apart from train_seconds; 0 when it was made earlier

    @property
    def tokens_per_second(self) -> float:
        return self.train_tokens / max(self.train_seconds, 1e-9)


class TokenizerSource(Protocol):
    """A checkpoint whose tokenizer the run must use: --finetune's (finetune.Source), --teacher's (distill.Teachers)."""
    path: Path
    tokenizer_bytes: bytes


def prepare_raw(job: TrainJob, source: Optional[TokenizerSource] = None) -> Path:
    """Tokenizer + binarized data in SAVE_DIR/data (reused when a previous run made them); with
    --finetune or --teacher, that checkpoint's tokenizer instead of a new one."""
    assert job.raw is not None
    tuned = isinstance(source, finetune.Source)
    corpora = job.raw.corpora
    if tuned and source.languages is not None and not corpora:  # one pair of a multilingual model: tagged, as its pairs are
        src, tgt = job.train.src_lang, job.train.tgt_lang
        corpora = [(Corpus(src, tgt, job.raw.train_prefix), Corpus(src, tgt, job.raw.valid_prefix))]
    if corpora:
        if source is not None and not tuned:
            multilingual.refuse("--teacher")
        base = multilingual.Base(source.path, source.tokenizer_bytes, source.languages) if tuned else None
        return multilingual.prepare(job.save_dir, corpora, job.raw.tokenizer, job.train.lang_temperature,
                                    job.raw.workers, job.force, base=base)
    data_dir = Path(job.save_dir) / "data"
    src, tgt = job.train.src_lang, job.train.tgt_lang
    if not src or not tgt:
        raise ConfigError("training on raw files needs --src and --tgt")
    from ..textio import find_split_file

    files = [find_split_file(job.raw.train_prefix, src), find_split_file(job.raw.train_prefix, tgt)]
    find_split_file(job.raw.valid_prefix, src), find_split_file(job.raw.valid_prefix, tgt)  # fail early
    if (data_dir / "meta.json").exists() and not job.force:
        earlier = read_meta(data_dir)["splits"].get("train", {})
        if [earlier.get("src_file"), earlier.get("tgt_file")] != [str(f) for f in files]:
            raise InputError(f"{data_dir}: was prepared from {earlier.get('src_file')} and {earlier.get('tgt_file')}, not "
                             f"{files[0]} and {files[1]}; use another --save-dir or pass --force to start over")
        log.info(f"using the data prepared earlier in {data_dir}")
        return data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    if source is not None:
        log.info(f"using the tokenizer of {source.path}")
        model_path = finetune.write_tokenizer(source, data_dir)
    else:
        log.info(f"training a {job.raw.tokenizer.model_type} tokenizer ({job.raw.tokenizer.vocab_size} pieces) on {', '.join(map(str, files))}")
        model_path = train_tokenizer(files, str(data_dir / "tokenizer"), job.raw.tokenizer)
    log.info(f"binarizing into {data_dir}")
    binarize(src, tgt, [SplitSpec("train", job.raw.train_prefix), SplitSpec("valid", job.raw.valid_prefix)],
             model_path, data_dir, workers=job.raw.workers, force=job.force)
    return data_dir


def check_teachers(job: TrainJob, teachers: Teachers, source: Optional[finetune.Source] = None) -> None:
    """What --teacher cannot teach this run, one line naming it, before any work (a tokenizer trained,
    raw files binarized, data opened): a multilingual teacher or student, another tokenizer or
    vocabulary, other languages. (The data, once open, is checked again: Teachers.check.)"""
    teachers.refuse_unsupported()
    if (job.raw is not None and job.raw.corpora) or (source is not None and source.languages is not None):
        multilingual.refuse("--teacher")
    if source is not None and source.tokenizer_bytes != teachers.tokenizer_bytes:
        raise InputError(f"--finetune {source.path}: its tokenizer differs from that of --teacher {teachers.path}; the student "
                         f"learns the teacher's token ids: fine-tune a checkpoint that has the teacher's tokenizer")
    if job.raw is not None:
        teachers.check_pair(job.train.src_lang, job.train.tgt_lang, "--src/--tgt")
        return
    data_dir = Path(job.data_dir)
    meta = read_meta(data_dir)
    if multilingual.is_multilingual(meta):
        multilingual.refuse("--teacher")
    if (data_dir / "tokenizer.model").is_file():  # (a missing one: open_data says so)
        teachers.check(meta, (data_dir / "tokenizer.model").read_bytes(), data_dir)


@dataclass
class TrainingData:
    data_dir: Path
    meta: dict
    tokenizer: Tokenizer
    train_set: ParallelDataset
    valid_set: Optional[ParallelDataset]
    pairs: Optional[multilingual.Opened] = None  # several pairs: train_set is the mixture's first epoch


def open_data(job: TrainJob, source: Optional[finetune.Source] = None) -> TrainingData:
    """The job's binarized data (DATA_DIR, or SAVE_DIR/data made by prepare_raw), checked against
    the job: its languages, its tokenizer (the one it was binarized with; the --finetune
    checkpoint's), and a valid split where --eval-bleu, --patience or --best-metric need one."""
    cfg = job.train
    data_dir = Path(job.save_dir) / "data" if job.raw is not None else Path(job.data_dir)
    meta = read_meta(data_dir)
    check_languages(data_dir, meta, cfg)
    tokenizer = Tokenizer.load(data_dir / "tokenizer.model")
    if multilingual.is_multilingual(meta):
        if meta.get("tokenizer_sha256") != hashlib.sha256(tokenizer.model_bytes).hexdigest():
            raise InputError(f"{data_dir}/tokenizer.model is not the tokenizer the data was binarized with (sha256 differs from meta.json)")
        pairs = multilingual.open_pairs(data_dir, meta, cfg, tokenizer)
        if source is not None:  # its tokenizer, and its tags: the data's targets are the checkpoint's
            finetune.check_data(source, tokenizer, data_dir)
            held = source.languages.targets if source.languages is not None else ()
            if pairs.languages.targets != held:
                raise InputError(f"{data_dir}: its target tags ({', '.join(pairs.languages.targets)}) are not those of {source.path} "
                                 f"({', '.join(held) or 'none: a one-pair model'}); give the raw files (--corpus) and seqtool prepares them")
        if not pairs.valid and (cfg.eval_bleu or cfg.patience or cfg.best_metric != "loss"):
            raise ConfigError(f"{data_dir}: has no valid split, which --eval-bleu, --patience and --best-metric need")
        return TrainingData(data_dir, meta, tokenizer, pairs.mixture.epoch(cfg.seed, 1), None, pairs)
    if tokenizer.vocab_size != meta["vocab_size"]:
        raise InputError(f"{data_dir}/tokenizer.model has {tokenizer.vocab_size} pieces but meta.json says {meta['vocab_size']}; binarize again")
    if meta.get("tokenizer_sha256") not in (None, hashlib.sha256(tokenizer.model_bytes).hexdigest()):
        raise InputError(f"{data_dir}/tokenizer.model is not the tokenizer the data was binarized with (sha256 differs from meta.json); binarize again with it")
    if source is not None:
        finetune.check_data(source, tokenizer, data_dir)
    train_set = ParallelDataset(data_dir, "train", meta)
    valid_set = ParallelDataset(data_dir, "valid", meta) if "valid" in meta["splits"] else None
    if valid_set is None and (cfg.eval_bleu or cfg.patience or cfg.best_metric != "loss"):
        raise ConfigError(f"{data_dir}: has no valid split, which --eval-bleu, --patience and --best-metric need; binarize one with --valid")
    return TrainingData(data_dir, meta, tokenizer, train_set, valid_set)


def check_languages(data_dir: Path, meta: dict, cfg: TrainConfig) -> None:
    """--src/--tgt, when given, must be the languages DATA_DIR holds (never trained the wrong way silently);
    a multilingual DATA_DIR names its pairs itself (a fine-tuning run's one pair included)."""
    if multilingual.is_multilingual(meta):
        pairs = [f"{s}-{t}" for s, t in meta["languages"]["pairs"]]
        if cfg.src_lang and cfg.tgt_lang and f"{cfg.src_lang}-{cfg.tgt_lang}" not in pairs:
            raise ConfigError(f"--src {cfg.src_lang} --tgt {cfg.tgt_lang}, but {data_dir} holds {', '.join(pairs)}")
        return
    for option, asked, held in (("--src", cfg.src_lang, meta["src_lang"]), ("--tgt", cfg.tgt_lang, meta["tgt_lang"])):
        if asked and asked != held:
            raise ConfigError(f"{option} {asked}, but {data_dir} holds {meta['src_lang']} -> {meta['tgt_lang']} data; "
                              f"drop {option} or binarize {asked} data")


def plan_epoch(train_set: ParallelDataset, data_dir: Path, cfg: TrainConfig, max_positions: int, epoch: int, rank: int,
               world: int, first: bool) -> tuple[list, int]:
    """This rank's updates of an epoch (each a list of micro-batch ids), and the pairs skipped as
    too long; a clear error when nothing can be trained. first: the run's first epoch (warn once)."""
    shard, skipped = epoch_batches(train_set, cfg.max_tokens, max_positions, cfg.seed, epoch, rank=rank, world=world)
    batches = distributed.update_batches(shard, cfg.update_freq)  # per update: its micro-batches
    if skipped == len(train_set):
        shortest = int(min_pair_length(train_set))
        raise InputError(f"{data_dir}: no training pair fits --max-tokens {cfg.max_tokens} and {max_positions} positions "
                         f"(the shortest pair needs {shortest}); raise --max-tokens to at least {shortest}")
    if not batches:
        raise InputError(f"{data_dir}: an epoch has fewer batches of --max-tokens {cfg.max_tokens} than one update needs "
                         f"(--update-freq {cfg.update_freq} x {world} process(es)); lower --max-tokens or --update-freq")
    if first and skipped:
        log.warn(f"skipping {skipped} training pairs longer than {min(max_positions, cfg.max_tokens)} tokens")
    return batches, skipped
