"""Training on several language pairs at once: one model, the target language named by a tag.

Owns what a multilingual run adds to a one-pair run (languages.py holds the tags and why they
are ids after the tokenizer's pieces):

- preparing `--corpus SRC-TGT:PREFIX` files into SAVE_DIR/data: one joint sentencepiece model
  over every language, trained on a sample in which a small language's lines are repeated up to
  its temperature share (so that it still gets its pieces: at plain proportions a language with a
  tenth of the lines gets few), then each pair binarized by binarize's code into data/SRC-TGT (a
  complete one-pair DATA_DIR), and data/meta.json listing the pairs (written last);
- opening such a DATA_DIR: the training pairs as a data.Mixture (each source led by its tag,
  drawn per epoch in temperature shares) and each pair's validation set with its tag.

A run with one --corpus is a one-pair run, exactly as with --src/--tgt/--train/--valid: no tags.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .. import log
from ..binarize import SplitSpec, binarize, unaligned
from ..config import TokenizerConfig, TrainConfig
from ..data import FORMAT_VERSION, Mixture, ParallelDataset, read_meta
from ..errors import ConfigError, InputError
from ..languages import Corpus, Languages, temperature_shares
from ..textio import atomic_write_bytes, find_split_file, read_lines
from ..tokenizer import Tokenizer, train_tokenizer


@dataclass
class Opened:
    """A multilingual DATA_DIR, opened for training."""
    languages: Languages  # with the shares this run trains in
    mixture: Mixture
    valid: dict[str, tuple[ParallelDataset, int]]  # pair -> its validation set (untagged) and its target tag
    sizes: dict[str, int]  # pair -> training lines


def is_multilingual(meta: dict) -> bool:
    return "languages" in meta


def _count_lines(path: Path) -> int:
    return sum(1 for line in read_lines(path, errors="replace") if line.strip())


def tokenizer_repeats(files: dict[str, list[Path]], temperature: float) -> dict[str, int]:
    """How many times each language's lines go into the tokenizer's sample: its temperature share
    over its plain share, at least once (a large language is never thinned out, a small one is
    repeated up to its share)."""
    sizes = {lang: sum(_count_lines(f) for f in paths) for lang, paths in files.items()}
    langs = sorted(sizes)
    total = sum(sizes.values())
    shares = temperature_shares([sizes[l] for l in langs], temperature)
    return {l: max(1, round(q / (sizes[l] / total))) if sizes[l] else 1 for l, q in zip(langs, shares)}


def prepare(save_dir: Path, corpora: list[tuple[Corpus, Corpus]], tokenizer_config: TokenizerConfig, temperature: float,
            workers: int = 1, force: bool = False, base: Optional["Base"] = None) -> Path:
    """SAVE_DIR/data for the --corpus pairs (reused when an earlier run made it from the same files);
    with a base (--finetune of a multilingual checkpoint), its tokenizer and its tags instead of new ones."""
    data_dir = Path(save_dir) / "data"
    files = corpus_files(corpora)
    if (data_dir / "meta.json").exists() and not force:
        meta = read_meta(data_dir)
        if meta.get("corpora") != files:
            raise InputError(f"{data_dir}: was prepared from other files ({', '.join(meta.get('corpora') or ['one pair'])}); "
                             "use another --save-dir or pass --force to start over")
        log.info(f"using the data prepared earlier in {data_dir}")
        return data_dir
    if base is not None:
        check_targets(base, corpora)
    check_aligned(files)  # before the tokenizer's minutes
    data_dir.mkdir(parents=True, exist_ok=True)
    if base is not None:
        log.info(f"using the tokenizer and the target tags of {base.path}")
        atomic_write_bytes(data_dir / "tokenizer.model", base.tokenizer_bytes)
        binarize_pairs(corpora, data_dir / "tokenizer.model", data_dir, workers, force=True, base=base.languages)
        return data_dir
    by_lang: dict[str, list[Path]] = {}
    for c, _ in corpora:
        src, tgt = files[c.pair][:2]
        by_lang.setdefault(c.src, []).append(Path(src))
        by_lang.setdefault(c.tgt, []).append(Path(tgt))
    repeats = tokenizer_repeats(by_lang, temperature)
    order = sorted(by_lang)
    log.info(f"training a {tokenizer_config.model_type} tokenizer ({tokenizer_config.vocab_size} pieces) on "
             + ", ".join(f"{l}" + (f" (x{repeats[l]})" if repeats[l] > 1 else "") for l in order))
    model_path = train_tokenizer([f for l in order for f in by_lang[l]], str(data_dir / "tokenizer"), tokenizer_config,
                                 repeats=[repeats[l] for l in order for _ in by_lang[l]])
    binarize_pairs(corpora, model_path, data_dir, workers, force=True)
    return data_dir


@dataclass
class Base:
    """What a multilingual run fine-tuning a checkpoint takes from it (finetune.Source has these)."""
    path: Path
    tokenizer_bytes: bytes
    languages: Optional[Languages]


def check_targets(base: Base, corpora: list[tuple[Corpus, Corpus]]) -> None:
    """Fine-tuning keeps the checkpoint's tags: every pair's target must have one (its source may be any)."""
    if base.languages is None:
        raise ConfigError(f"--finetune {base.path}: a one-pair model has no target-language tags; fine-tune it on its own pair "
                          "(--src/--tgt), or train a multilingual model")
    lacking = sorted({c.tgt for c, _ in corpora} - set(base.languages.targets))
    if lacking:
        raise ConfigError(f"--finetune {base.path}: it has no tag for target {lacking[0]!r} (it translates into "
                          f"{', '.join(base.languages.targets)}); fine-tuning can add a pair into one of those")


def check_aligned(files: dict[str, list[str]]) -> None:
    """Each pair's two training files, and its two validation files, have as many lines (binarize
    says so too, but only after the joint tokenizer is trained)."""
    for paths in files.values():
        for src, tgt in (paths[:2], paths[2:]):
            na, nb = (sum(1 for _ in read_lines(Path(f), errors="replace")) for f in (src, tgt))
            if na != nb:
                raise unaligned(src, na, tgt, nb)


def corpus_files(corpora: list[tuple[Corpus, Corpus]]) -> dict[str, list[str]]:
    """Each pair's training and validation files (PREFIX.SRC, PREFIX.TGT or their .gz): a missing one is an error now."""
    return {c.pair: [str(find_split_file(c.prefix, c.src)), str(find_split_file(c.prefix, c.tgt)),
                     str(find_split_file(v.prefix, v.src)), str(find_split_file(v.prefix, v.tgt))] for c, v in corpora}


def binarize_pairs(corpora: list[tuple[Corpus, Corpus]], tokenizer_path: Path, data_dir: Path, workers: int = 1,
                   force: bool = False, base: Optional[Languages] = None) -> dict:
    """Each pair binarized by binarize's code into DATA_DIR/SRC-TGT (a complete one-pair DATA_DIR),
    then DATA_DIR/meta.json listing them with their tags (written last: the directory is complete
    only then) and the tokenizer beside it. Returns that meta. base: a fine-tuned checkpoint's
    languages, whose pairs (and so tags) the data's languages keep, its new pairs added after them."""
    data_dir = Path(data_dir)
    files = corpus_files(corpora)
    if (data_dir / "meta.json").exists() and not force:
        raise InputError(f"{data_dir}: already holds binarized data (meta.json); pass --force to replace it or pick another --out")
    tokenizer = Tokenizer.load(tokenizer_path)
    splits: dict[str, dict] = {"train": {"lines": 0}, "valid": {"lines": 0}}
    meta: dict = {}
    for c, v in corpora:
        log.info(f"binarizing {c.pair} into {data_dir / c.pair}")
        meta = binarize(c.src, c.tgt, [SplitSpec("train", c.prefix), SplitSpec("valid", v.prefix)], tokenizer_path,
                        data_dir / c.pair, workers=workers, force=True)
        for split in splits:
            splits[split]["lines"] += meta["splits"][split]["lines"]
    pairs = tuple((c.src, c.tgt) for c, _ in corpora)
    if base is not None:
        if base.first_tag != tokenizer.vocab_size:
            raise InputError(f"{tokenizer_path}: {tokenizer.vocab_size} pieces, but the checkpoint's first tag is {base.first_tag}")
        pairs = base.pairs + tuple(p for p in pairs if p not in base.pairs)
    languages = Languages(pairs, tokenizer.vocab_size)
    top = {
        "format_version": FORMAT_VERSION,
        "src_lang": "", "tgt_lang": "",  # several: see languages
        "languages": languages.to_dict(),
        "vocab_size": tokenizer.vocab_size + languages.tags,  # the pieces, then one tag per target language
        "special_ids": meta["special_ids"],
        "dtype": meta["dtype"],
        "tokenizer_sha256": hashlib.sha256(tokenizer.model_bytes).hexdigest(),
        "splits": splits,
        "corpora": files,
    }
    if Path(tokenizer_path).resolve() != (data_dir / "tokenizer.model").resolve():
        atomic_write_bytes(data_dir / "tokenizer.model", tokenizer.model_bytes)
    atomic_write_bytes(data_dir / "meta.json", (json.dumps(top, indent=2) + "\n").encode())  # last: the directory is complete
    return top


def open_pairs(data_dir: Path, meta: dict, cfg: TrainConfig, tokenizer: Tokenizer) -> Opened:
    """The pairs of a multilingual DATA_DIR, each checked to be binarized with its tokenizer."""
    saved = Languages.from_dict(meta["languages"])
    assert saved is not None
    if saved.first_tag != tokenizer.vocab_size:
        raise InputError(f"{data_dir}/meta.json: the first language tag is {saved.first_tag}, but the tokenizer has "
                         f"{tokenizer.vocab_size} pieces; prepare the data again")
    parts, valid, sizes = [], {}, {}
    here = set(meta.get("corpora") or ()) or {f"{s}-{t}" for s, t in saved.pairs}  # (a fine-tuning run: some of the model's pairs)
    for src, tgt in saved.pairs:
        pair = f"{src}-{tgt}"
        if pair not in here:
            continue
        sub = data_dir / pair
        sub_meta = read_meta(sub)
        if sub_meta.get("tokenizer_sha256") != meta.get("tokenizer_sha256"):
            raise InputError(f"{sub}: binarized with another tokenizer than {data_dir}/tokenizer.model; prepare the data again")
        train = ParallelDataset(sub, "train", sub_meta)
        parts.append(train)
        sizes[pair] = len(train)
        if "valid" in sub_meta["splits"]:
            valid[pair] = (ParallelDataset(sub, "valid", sub_meta), saved.tag(tgt))
    shares = temperature_shares([len(p) for p in parts], cfg.lang_temperature)
    share_of = dict(zip(sizes, shares))
    languages = Languages(saved.pairs, saved.first_tag, tuple(share_of.get(f"{s}-{t}", 0.0) for s, t in saved.pairs), cfg.lang_temperature)
    mixture = Mixture(parts, [saved.tag(t) for s, t in saved.pairs if f"{s}-{t}" in here], shares)
    log.info("pairs: " + ", ".join(f"{p} {n:,} lines, {s:.1%} of an epoch" for (p, n), s in zip(sizes.items(), shares))
             + f" (--lang-temperature {cfg.lang_temperature:g})")
    return Opened(languages, mixture, valid, sizes)


def refuse(what: str) -> None:
    raise ConfigError(f"{what} does not train several pairs yet: train on one --corpus pair, or leave {what} out")


def check_options(corpus: Optional[list], valid_corpus: Optional[list], others: dict) -> None:
    """--corpus excludes the one-pair options (--src/--tgt/--train/--valid and a DATA_DIR)."""
    if not corpus and valid_corpus:
        raise ConfigError("--valid-corpus validates a --corpus pair; add --corpus")
    given = [name for name, value in others.items() if value]
    if corpus and given:
        raise ConfigError(f"--corpus names the files and languages; drop {', '.join(given)}")
