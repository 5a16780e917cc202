"""`seqtool train`'s one library call: the command line's settings (options.py: field name -> value)
over the TOML file and the preset, the data (DATA_DIR, raw files or --corpus pairs), fine-tuning
and distillation made into a TrainJob, and the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ..config import TokenizerConfig
from ..errors import ConfigError
from ..fields import scoped


def train_command(data_dir: Optional[Path], save_dir: Path, arch: Optional[str], config_file: Optional[Path],
                  max_time: Optional[str], train_prefix: Optional[str], valid_prefix: Optional[str],
                  corpus: Optional[list[str]], valid_corpus: Optional[list[str]], finetune: Optional[Path],
                  teacher: Optional[list[Path]], distill_original: Optional[bool], workers: int, force: bool,
                  given: dict[str, Any]):
    """Train as the command line asks; returns the run's summary (train.TrainResult)."""
    from ..settings import parse_duration, train_settings
    from .train import RawData, TrainJob, train as run

    tokenizer = TokenizerConfig(**{k: given.pop(k) for k in scoped(TokenizerConfig, "train") if k in given})
    src_lang, tgt_lang = given.get("src_lang"), given.get("tgt_lang")
    options = {**given, **({"max_time": parse_duration(max_time)} if max_time is not None else {})}
    settings = train_settings(arch, options, config_file)
    tune = None
    if finetune is not None:  # the model comes from the checkpoint; what was asked explicitly is checked against it
        from .finetune import Finetune

        tune = Finetune(finetune, settings.asked_model)
    raw = None
    from .multilingual import check_options

    check_options(corpus, valid_corpus, {"DATA_DIR": data_dir, "--src": src_lang, "--tgt": tgt_lang, "--train": train_prefix,
                                         "--valid": valid_prefix})
    if corpus:
        from ..languages import pair_corpora

        corpora = pair_corpora(corpus, valid_corpus or [])
        if len(corpora) == 1:  # one pair: a one-pair run, exactly as --src/--tgt/--train/--valid (no tags)
            (c, v), = corpora
            src_lang, tgt_lang, train_prefix, valid_prefix = c.src, c.tgt, c.prefix, v.prefix
            settings = train_settings(arch, {**options, "src_lang": src_lang, "tgt_lang": tgt_lang}, config_file)
        else:
            raw = RawData(tokenizer=tokenizer,
                          workers=workers, corpora=corpora)
    if raw is None and data_dir is None:
        if not (src_lang and tgt_lang and train_prefix and valid_prefix):
            raise ConfigError("give a DATA_DIR, or raw files with --src, --tgt, --train and --valid")
        raw = RawData(train_prefix, valid_prefix, tokenizer, workers)
    elif train_prefix or valid_prefix:
        raise ConfigError("give either a DATA_DIR or raw files (--train/--valid), not both")
    spec = None
    if teacher:
        from .distill import Distill

        spec = Distill(tuple(teacher), **({} if distill_original is None else {"original": distill_original}))
    elif distill_original is not None:
        raise ConfigError("--distill-original and --teacher-only say what a --teacher's student trains on; add --teacher")
    job = TrainJob(save_dir=save_dir, model=settings.model, optim=settings.optim, train=settings.train, data_dir=data_dir,
                   raw=raw, force=force, finetune=tune, distill=spec)
    return run(job)


def binarize_command(src: Optional[str], tgt: Optional[str], train: Optional[str], valid: Optional[str], test: Optional[str],
                     tokenizer: Path, out: Path, workers: int, errors: str, force: bool, corpus: Optional[list[str]],
                     valid_corpus: Optional[list[str]]) -> list[str]:
    """`seqtool binarize`: one pair's splits, or several --corpus pairs into one multilingual DATA_DIR;
    returns the summary's lines."""
    from ..binarize import SplitSpec, binarize as run

    if errors not in ("strict", "replace"):
        raise ConfigError(f"--errors must be strict or replace, got {errors!r}")
    if corpus or valid_corpus:
        from ..languages import pair_corpora
        from .multilingual import binarize_pairs, check_options

        check_options(corpus, valid_corpus, {"--src": src, "--tgt": tgt, "--train": train, "--valid": valid, "--test": test})
        corpora = pair_corpora(corpus or [], valid_corpus or [])
        if len(corpora) == 1:  # one pair: a one-pair DATA_DIR (no tags), as --src/--tgt/--train/--valid make
            (c, v), = corpora
            src, tgt, train, valid = c.src, c.tgt, c.prefix, v.prefix
        else:
            meta = binarize_pairs(corpora, tokenizer, out, workers, force)
            return [f"wrote {out}: {', '.join(f'{s}-{t}' for s, t in meta['languages']['pairs'])}, "
                    f"{meta['splits']['train']['lines']:,} training lines"]
    if not src or not tgt:
        raise ConfigError("give --src and --tgt (or --corpus SRC-TGT:PREFIX pairs)")
    splits = [SplitSpec(name, prefix) for name, prefix in (("train", train), ("valid", valid), ("test", test)) if prefix]
    if not splits:
        raise ConfigError("give at least one of --train, --valid, --test")
    meta = run(src, tgt, splits, tokenizer, out, workers=workers, errors=errors, force=force)
    return [f"{name}: {s['lines']:,} lines, {s['src_tokens']:,} {src} / {s['tgt_tokens']:,} {tgt} tokens"
            for name, s in meta["splits"].items()] + [f"wrote {out}"]
