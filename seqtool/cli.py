"""The `seqtool` command line.

Thin by design: each command parses options, builds a config, calls ONE library function and
prints a summary. Heavy imports (torch) happen inside the commands, so `seqtool --help` is
instant. User mistakes become one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from .config import DecodeConfig, Sampling, SearchOptions, ServeConfig, TrainConfig, TranslateConfig, field_info
from .errors import ConfigError, InputError
from .exits import handles_user_errors

app = typer.Typer(
    name="seqtool",
    help="Train Transformer translation models on parallel text, translate, and score.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# ---- options shared by several commands, defined once -------------------------------------
Force = Annotated[bool, typer.Option("--force", help="Replace existing outputs.")]
Workers = Annotated[int, typer.Option("--workers", min=1, help="Processes that encode text in parallel.")]
SrcLang = Annotated[Optional[str], typer.Option("--src", help="Source language suffix: reads PREFIX.SRC (or PREFIX.SRC.gz).")]
TgtLang = Annotated[Optional[str], typer.Option("--tgt", help="Target language suffix: reads PREFIX.TGT (or PREFIX.TGT.gz).")]
MaxTokens = Annotated[Optional[int], typer.Option("--max-tokens", help="Token budget of a batch.")]
Errors = Annotated[str, typer.Option("--errors", help="Invalid UTF-8: strict (stop) or replace (U+FFFD, with a warning).")]


@app.command("train-tokenizer")
@handles_user_errors
def train_tokenizer_cmd(
    files: Annotated[list[Path], typer.Argument(help="Text files (plain or .gz); one joint vocabulary over all of them.")],
    *,
    model_prefix: Annotated[str, typer.Option("--model-prefix", help="Writes PREFIX.model and PREFIX.vocab.")],
    vocab_size: Annotated[int, typer.Option("--vocab-size", help="Number of pieces.")] = 8000,
    model_type: Annotated[str, typer.Option("--model-type", help="bpe or unigram.")] = "bpe",
    character_coverage: Annotated[float, typer.Option("--character-coverage", help="Share of characters covered.")] = 1.0,
    input_sentence_size: Annotated[int, typer.Option("--input-sentence-size", help="Train on a uniform sample of this many lines (0 = all; memory grows with it).")] = 1_000_000,
    byte_fallback: Annotated[bool, typer.Option("--byte-fallback", help="Unknown characters become bytes, not <unk>.")] = False,
    threads: Annotated[int, typer.Option("--threads", help="sentencepiece threads.")] = 2,
    force: Force = False,
):
    """Train a sentencepiece tokenizer (BPE or unigram) on raw text."""
    from .config import TokenizerConfig
    from .tokenizer import train_tokenizer

    config = TokenizerConfig(vocab_size=vocab_size, model_type=model_type, character_coverage=character_coverage,
                             input_sentence_size=input_sentence_size, byte_fallback=byte_fallback, threads=threads)
    if Path(f"{model_prefix}.model").exists() and not force:
        raise InputError(f"{model_prefix}.model already exists; pass --force to replace it")
    path = train_tokenizer(files, model_prefix, config)
    typer.echo(f"wrote {path} and {model_prefix}.vocab ({vocab_size} pieces)", err=True)


@app.command()
@handles_user_errors
def binarize(
    *,
    src: Annotated[Optional[str], typer.Option("--src", help="Source language suffix.")] = None,
    tgt: Annotated[Optional[str], typer.Option("--tgt", help="Target language suffix.")] = None,
    train: Annotated[Optional[str], typer.Option("--train", help="Training files prefix: PREFIX.SRC, PREFIX.TGT.")] = None,
    valid: Annotated[Optional[str], typer.Option("--valid", help="Validation files prefix.")] = None,
    test: Annotated[Optional[str], typer.Option("--test", help="Test files prefix.")] = None,
    tokenizer: Annotated[Path, typer.Option("--tokenizer", help="sentencepiece .model from train-tokenizer.")],
    out: Annotated[Path, typer.Option("--out", help="Output DATA_DIR.")],
    workers: Workers = 1,
    errors: Errors = "strict",
    force: Force = False,
    corpus: Annotated[Optional[list[str]], typer.Option("--corpus", help="SRC-TGT:PREFIX, repeatable: several pairs into one multilingual DATA_DIR (each pair in DATA_DIR/SRC-TGT, target tags after the tokenizer's pieces), for train.")] = None,
    valid_corpus: Annotated[Optional[list[str]], typer.Option("--valid-corpus", help="SRC-TGT:PREFIX, one per --corpus pair: its validation files.")] = None,
):
    """Encode parallel text into memory-mapped token arrays in DATA_DIR."""
    from .binarize import SplitSpec, binarize as run

    if errors not in ("strict", "replace"):
        raise ConfigError(f"--errors must be strict or replace, got {errors!r}")
    if corpus or valid_corpus:
        from .languages import pair_corpora
        from .training.multilingual import binarize_pairs, check_options

        check_options(corpus, valid_corpus, {"--src": src, "--tgt": tgt, "--train": train, "--valid": valid, "--test": test})
        corpora = pair_corpora(corpus or [], valid_corpus or [])
        if len(corpora) == 1:  # one pair: a one-pair DATA_DIR (no tags), as --src/--tgt/--train/--valid make
            (c, v), = corpora
            src, tgt, train, valid = c.src, c.tgt, c.prefix, v.prefix
        else:
            meta = binarize_pairs(corpora, tokenizer, out, workers, force)
            typer.echo(f"wrote {out}: {', '.join(f'{s}-{t}' for s, t in meta['languages']['pairs'])}, "
                       f"{meta['splits']['train']['lines']:,} training lines", err=True)
            return
    if not src or not tgt:
        raise ConfigError("give --src and --tgt (or --corpus SRC-TGT:PREFIX pairs)")
    splits = [SplitSpec(name, prefix) for name, prefix in (("train", train), ("valid", valid), ("test", test)) if prefix]
    if not splits:
        raise ConfigError("give at least one of --train, --valid, --test")
    meta = run(src, tgt, splits, tokenizer, out, workers=workers, errors=errors, force=force)
    for name, s in meta["splits"].items():
        typer.echo(f"{name}: {s['lines']:,} lines, {s['src_tokens']:,} {src} / {s['tgt_tokens']:,} {tgt} tokens", err=True)
    typer.echo(f"wrote {out}", err=True)


@app.command()
@handles_user_errors
def train(
    data_dir: Annotated[Optional[Path], typer.Argument(help="DATA_DIR from binarize (or give raw files with --src/--tgt/--train/--valid).")] = None,
    *,
    save_dir: Annotated[Path, typer.Option("--save-dir", help="Where last.pt, best.pt, config.json and metrics.jsonl go.")],
    arch: Annotated[Optional[str], typer.Option("--arch", help="tiny, small, base, big, or student (a deep encoder and a shallow decoder, for distillation) [default: small].")] = None,
    config_file: Annotated[Optional[Path], typer.Option("--config", help="TOML file with model, optim and train tables (and an arch key); options given here win.")] = None,
    max_tokens: MaxTokens = None,
    lr: Annotated[Optional[float], typer.Option("--lr", help="Peak learning rate.")] = None,
    warmup: Annotated[Optional[float], typer.Option("--warmup", help="Linear warmup: N updates (at most 10% of the horizon), or a share of the horizon below 1 (e.g. 0.05) [default: 1000].")] = None,
    lr_schedule: Annotated[Optional[str], typer.Option("--lr-schedule", help="auto (linear decay to 0 at the horizon of --max-updates/--max-epochs/--max-time when there is one, else inverse-sqrt), inverse-sqrt, linear, cosine or wsd (warmup-stable-decay, the last 20%).")] = None,
    label_smoothing: Annotated[Optional[float], typer.Option("--label-smoothing")] = None,
    dropout: Annotated[Optional[float], typer.Option("--dropout")] = None,
    clip_norm: Annotated[Optional[float], typer.Option("--clip-norm", help="Gradient norm clip (0 = off).")] = None,
    max_updates: Annotated[Optional[int], typer.Option("--max-updates")] = None,
    max_epochs: Annotated[Optional[int], typer.Option("--max-epochs")] = None,
    max_time: Annotated[Optional[str], typer.Option("--max-time", help="Wall-clock limit, e.g. 20m, 1.5h.")] = None,
    validate_interval_updates: Annotated[Optional[int], typer.Option("--validate-interval-updates", help="Also validate every N updates.")] = None,
    eval_bleu: Annotated[Optional[bool], typer.Option("--eval-bleu/--no-eval-bleu", help="Validation also decodes the valid set (translate's search) and scores BLEU and chrF.")] = None,
    eval_bleu_beam: Annotated[Optional[int], typer.Option("--eval-bleu-beam", help="Beam size of --eval-bleu [default: 4].")] = None,
    eval_bleu_lenpen: Annotated[Optional[float], typer.Option("--eval-bleu-lenpen", help="Length penalty of --eval-bleu [default: 1.0].")] = None,
    eval_bleu_max_len_a: Annotated[Optional[float], typer.Option("--eval-bleu-max-len-a", help="--eval-bleu max output length = a * source length + b [default: a 1.2].")] = None,
    eval_bleu_max_len_b: Annotated[Optional[int], typer.Option("--eval-bleu-max-len-b", help="[default: b 10]")] = None,
    best_metric: Annotated[Optional[str], typer.Option("--best-metric", help="What best.pt is best at: loss, bleu or chrf (bleu/chrf need --eval-bleu) [default: loss].")] = None,
    patience: Annotated[Optional[int], typer.Option("--patience", help="Stop after N validations without improving --best-metric (0 = never).")] = None,
    save_interval_updates: Annotated[Optional[int], typer.Option("--save-interval-updates", help="Also write last.pt every N updates.")] = None,
    keep_last: Annotated[Optional[int], typer.Option("--keep-last", help="Keep the newest K copies checkpoint_u<UPDATES>.pt written every --save-interval-updates.")] = None,
    tensorboard_dir: Annotated[Optional[Path], typer.Option("--tensorboard", help="Also log to TensorBoard in this directory (pip install 'seqtool[tensorboard]').")] = None,
    finetune: Annotated[Optional[Path], typer.Option("--finetune", help="Start from this checkpoint's weights, model and tokenizer, with fresh optimizer, schedule and progress.")] = None,
    teacher: Annotated[Optional[list[Path]], typer.Option("--teacher", help="Distil this checkpoint (repeat for an ensemble): train on its translations of the training source (beam search as translate does it; cached in SAVE_DIR/distill, its time apart from --max-time). The checkpoint then decodes greedily by default.")] = None,
    distill_original: Annotated[Optional[bool], typer.Option("--distill-original/--teacher-only", help="With --teacher: train on the original targets too, each source twice (the default: measured 1.3 BLEU better for a 20-minute student), or on the teacher's translations only.")] = None,
    precision: Annotated[Optional[str], typer.Option("--precision", help="auto (bf16 on GPUs and CPUs with bfloat16 arithmetic: AVX512-BF16 or AMX; fp16 on older GPUs; else fp32), fp32, bf16 or fp16 (with loss scaling) [default: auto].")] = None,
    device: Annotated[Optional[str], typer.Option("--device", help="auto, cpu, cuda or cuda:N [default: auto].")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="[default: 1]")] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", help="CPU threads for torch (0 = torch's default) [default: 0].")] = None,
    update_freq: Annotated[Optional[int], typer.Option("--update-freq", help="Batches of --max-tokens accumulated into one update (per process) [default: 1].")] = None,
    dist_timeout: Annotated[Optional[float], typer.Option("--dist-timeout", help="Seconds a process waits for the others under torchrun before the job fails [default: 600].")] = None,
    ema_decay: Annotated[Optional[float], typer.Option("--ema-decay", help="Keep an exponential moving average of the weights with this decay; at the end of the run it becomes best.pt when validation says it is better (0 = off, the default: with --lr-schedule auto it never won in our runs; try 0.999 with inverse-sqrt).")] = None,
    compile: Annotated[Optional[bool], typer.Option("--compile/--no-compile", help="torch.compile the model (falls back to eager where it cannot) [default: no].")] = None,
    pre_norm: Annotated[Optional[bool], typer.Option("--pre-norm/--post-norm", help="Layer norm placement (paper: post).")] = None,
    src_lang: SrcLang = None,
    tgt_lang: TgtLang = None,
    train_prefix: Annotated[Optional[str], typer.Option("--train", help="Raw training files prefix.")] = None,
    valid_prefix: Annotated[Optional[str], typer.Option("--valid", help="Raw validation files prefix.")] = None,
    corpus: Annotated[Optional[list[str]], typer.Option("--corpus", help="SRC-TGT:PREFIX, repeatable: train one model on several pairs (PREFIX.SRC and PREFIX.TGT, plain or .gz), the target language a tag in front of the source; one joint tokenizer.")] = None,
    valid_corpus: Annotated[Optional[list[str]], typer.Option("--valid-corpus", help="SRC-TGT:PREFIX, one per --corpus pair: its validation files (loss, BLEU and chrF per pair; best.pt by their mean).")] = None,
    lang_temperature: Annotated[Optional[float], typer.Option("--lang-temperature", help=field_info(TrainConfig, "lang_temperature")["help"] + f" [default: {field_info(TrainConfig, 'lang_temperature')['default']:g}]")] = None,
    vocab_size: Annotated[int, typer.Option("--vocab-size", help="Tokenizer size when training on raw files.")] = 8000,
    input_sentence_size: Annotated[int, typer.Option("--input-sentence-size", help="Raw files: the tokenizer trains on a sample of this many lines (0 = all).")] = 1_000_000,
    workers: Workers = 1,
    force: Annotated[bool, typer.Option("--force", help="Start a new run in a SAVE_DIR that holds another (replaces its checkpoints).")] = False,
):
    """Train a Transformer on DATA_DIR, or directly on raw parallel files."""
    from .config import TokenizerConfig
    from .settings import parse_duration, train_settings
    from .training.train import RawData, TrainJob, train as run

    options = dict(dropout=dropout, pre_norm=pre_norm, lr=lr, warmup=warmup, lr_schedule=lr_schedule,
                   label_smoothing=label_smoothing, clip_norm=clip_norm, max_tokens=max_tokens, max_updates=max_updates,
                   max_epochs=max_epochs, max_time=parse_duration(max_time) if max_time is not None else None,
                   validate_interval_updates=validate_interval_updates, eval_bleu=eval_bleu, eval_bleu_beam=eval_bleu_beam,
                   eval_bleu_lenpen=eval_bleu_lenpen, eval_bleu_max_len_a=eval_bleu_max_len_a,
                   eval_bleu_max_len_b=eval_bleu_max_len_b, best_metric=best_metric, patience=patience,
                   save_interval_updates=save_interval_updates, keep_last=keep_last,
                   tensorboard_dir=str(tensorboard_dir) if tensorboard_dir else None, update_freq=update_freq,
                   dist_timeout=dist_timeout, compile=compile, ema_decay=ema_decay, precision=precision, device=device,
                   seed=seed, threads=threads, src_lang=src_lang, tgt_lang=tgt_lang, lang_temperature=lang_temperature)
    settings = train_settings(arch, options, config_file)
    tune = None
    if finetune is not None:  # the model comes from the checkpoint; what was asked explicitly is checked against it
        from .training.finetune import Finetune

        tune = Finetune(finetune, settings.asked_model)
    raw = None
    from .training.multilingual import check_options

    check_options(corpus, valid_corpus, {"DATA_DIR": data_dir, "--src": src_lang, "--tgt": tgt_lang, "--train": train_prefix,
                                         "--valid": valid_prefix})
    if corpus:
        from .languages import pair_corpora

        corpora = pair_corpora(corpus, valid_corpus or [])
        if len(corpora) == 1:  # one pair: a one-pair run, exactly as --src/--tgt/--train/--valid (no tags)
            (c, v), = corpora
            src_lang, tgt_lang, train_prefix, valid_prefix = c.src, c.tgt, c.prefix, v.prefix
            settings = train_settings(arch, {**options, "src_lang": src_lang, "tgt_lang": tgt_lang}, config_file)
        else:
            raw = RawData(tokenizer=TokenizerConfig(vocab_size=vocab_size, input_sentence_size=input_sentence_size),
                          workers=workers, corpora=corpora)
    if raw is None and data_dir is None:
        if not (src_lang and tgt_lang and train_prefix and valid_prefix):
            raise ConfigError("give a DATA_DIR, or raw files with --src, --tgt, --train and --valid")
        raw = RawData(train_prefix, valid_prefix, TokenizerConfig(vocab_size=vocab_size, input_sentence_size=input_sentence_size), workers)
    elif train_prefix or valid_prefix:
        raise ConfigError("give either a DATA_DIR or raw files (--train/--valid), not both")
    spec = None
    if teacher:
        from .training.distill import Distill

        spec = Distill(tuple(teacher), **({} if distill_original is None else {"original": distill_original}))
    elif distill_original is not None:
        raise ConfigError("--distill-original and --teacher-only say what a --teacher's student trains on; add --teacher")
    job = TrainJob(save_dir=save_dir, model=settings.model, optim=settings.optim, train=settings.train, data_dir=data_dir,
                   raw=raw, force=force, finetune=tune, distill=spec)
    result = run(job)
    from .training.distributed import environment

    if environment().rank != 0:  # under torchrun the summary is rank 0's to print
        return
    best = "" if result.best_metric == "loss" else f"; best valid {result.best_metric} {result.best_value:.2f}"
    typer.echo(
        f"{result.updates} updates, {result.epochs:.2f} epochs in {result.train_seconds:.0f}s "
        f"({result.tokens_per_second:,.0f} target tokens/s); best valid loss {result.best_valid_loss:.3f}{best}; "
        f"stopped by {result.stopped_by}; checkpoints in {result.save_dir}"
        + (f"; the teachers' pass took {result.distill_seconds:.0f}s more" if result.distill_seconds else "")
        + (f"; {result.skipped_too_long} pairs skipped as too long" if result.skipped_too_long else ""),
        err=True,
    )


def _option(cls, name: str, *flags: str, **extra):
    """A command-line option for field `name` of config class cls: its help from the field (its
    default goes with it: _default), so an option and its field cannot disagree."""
    return typer.Option(*(flags or ("--" + name.replace("_", "-"),)), help=field_info(cls, name)["help"], **extra)


def _default(cls, name: str):
    return field_info(cls, name)["default"]


def _given(ctx: typer.Context, values: dict) -> dict:
    """The values of the options given on the command line: the others take their defaults, or the
    checkpoint's recorded decoding defaults (translate.settings)."""
    # (by name: the enum is click's, or the copy of it that newer typer releases carry)
    return {k: v for k, v in values.items()
            if getattr(ctx.get_parameter_source(k), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")}


@app.command()
@handles_user_errors
def translate(
    ctx: typer.Context,
    *,
    checkpoint: Annotated[list[Path], typer.Option("--checkpoint", "-c", help="best.pt or last.pt from seqtool train; give it several times for an ensemble (probabilities averaged).")],
    input: Annotated[Optional[Path], typer.Option("--input", "-i", help="Read this file instead of stdin.")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write this file instead of stdout.")] = None,
    beam: Annotated[int, _option(SearchOptions, "beam", "--beam", "-b")] = _default(SearchOptions, "beam"),
    lenpen: Annotated[float, _option(SearchOptions, "lenpen")] = _default(SearchOptions, "lenpen"),
    nbest: Annotated[int, typer.Option("--nbest", help="Hypotheses per line (tab-separated output when > 1).")] = _default(SearchOptions, "nbest"),
    max_tokens: Annotated[int, _option(DecodeConfig, "max_tokens")] = _default(DecodeConfig, "max_tokens"),
    batch_size: Annotated[int, _option(DecodeConfig, "batch_size")] = _default(DecodeConfig, "batch_size"),
    max_len_a: Annotated[float, _option(SearchOptions, "max_len_a")] = _default(SearchOptions, "max_len_a"),
    max_len_b: Annotated[int, _option(SearchOptions, "max_len_b")] = _default(SearchOptions, "max_len_b"),
    no_repeat_ngram_size: Annotated[int, _option(SearchOptions, "no_repeat_ngram_size")] = _default(SearchOptions, "no_repeat_ngram_size"),
    loop_guard: Annotated[int, _option(SearchOptions, "loop_guard")] = _default(SearchOptions, "loop_guard"),
    print_scores: Annotated[bool, _option(TranslateConfig, "print_scores")] = _default(TranslateConfig, "print_scores"),
    errors: Annotated[str, _option(TranslateConfig, "errors")] = _default(TranslateConfig, "errors"),
    print_alignment: Annotated[bool, _option(TranslateConfig, "print_alignment")] = _default(TranslateConfig, "print_alignment"),
    alignment_layer: Annotated[int, _option(DecodeConfig, "alignment_layer")] = _default(DecodeConfig, "alignment_layer"),
    device: Annotated[str, _option(DecodeConfig, "device")] = _default(DecodeConfig, "device"),
    precision: Annotated[str, _option(DecodeConfig, "precision")] = _default(DecodeConfig, "precision"),
    quantize: Annotated[str, _option(DecodeConfig, "quantize")] = _default(DecodeConfig, "quantize"),
    threads: Annotated[int, _option(DecodeConfig, "threads")] = _default(DecodeConfig, "threads"),
    workers: Annotated[int, _option(DecodeConfig, "workers")] = _default(DecodeConfig, "workers"),
    sampling: Annotated[bool, typer.Option("--sampling", help="Draw --nbest random translations per line instead of searching (--beam unused).")] = False,
    topk: Annotated[int, _option(Sampling, "topk")] = _default(Sampling, "topk"),
    topp: Annotated[float, _option(Sampling, "topp")] = _default(Sampling, "topp"),
    temperature: Annotated[float, _option(Sampling, "temperature")] = _default(Sampling, "temperature"),
    seed: Annotated[int, _option(Sampling, "seed")] = _default(Sampling, "seed"),
    score_reference: Annotated[bool, _option(TranslateConfig, "score_reference")] = _default(TranslateConfig, "score_reference"),
    target: Annotated[Optional[Path], _option(TranslateConfig, "target")] = None,
    target_prefix: Annotated[Optional[Path], _option(TranslateConfig, "target_prefix")] = None,
    constraints: Annotated[Optional[Path], _option(TranslateConfig, "constraints")] = None,
    glossary: Annotated[Optional[Path], _option(TranslateConfig, "glossary")] = None,
    glossary_ignore_case: Annotated[bool, _option(TranslateConfig, "glossary_ignore_case")] = _default(TranslateConfig, "glossary_ignore_case"),
    split_sentences: Annotated[str, _option(TranslateConfig, "split_sentences")] = _default(TranslateConfig, "split_sentences"),
    format: Annotated[str, _option(TranslateConfig, "format")] = _default(TranslateConfig, "format"),
    keep_attributes: Annotated[bool, _option(TranslateConfig, "keep_attributes")] = _default(TranslateConfig, "keep_attributes"),
    src_lang: Annotated[str, _option(TranslateConfig, "src_lang")] = _default(TranslateConfig, "src_lang"),
    tgt_lang: Annotated[str, _option(TranslateConfig, "tgt_lang")] = _default(TranslateConfig, "tgt_lang"),
):
    """Translate stdin (or --input) line by line to stdout, in input order."""
    from .translate import recorded_defaults, settings, translate_file

    # the options given on the command line, over the checkpoint's recorded decoding defaults (a student's beam 1)
    config, options = settings(recorded=recorded_defaults(checkpoint), **_given(ctx, dict(
        max_tokens=max_tokens, batch_size=batch_size, alignment_layer=alignment_layer, device=device, precision=precision,
        quantize=quantize, threads=threads, workers=workers, beam=beam, lenpen=lenpen, nbest=nbest, max_len_a=max_len_a,
        max_len_b=max_len_b, sampling=sampling, no_repeat_ngram_size=no_repeat_ngram_size, loop_guard=loop_guard,
        topk=topk, topp=topp, temperature=temperature, seed=seed)))
    io = TranslateConfig(print_scores=print_scores, print_alignment=print_alignment, errors=errors, score_reference=score_reference,
                         **{k: str(v) if v is not None else "" for k, v in (("target", target), ("target_prefix", target_prefix),
                                                                            ("constraints", constraints), ("glossary", glossary))},
                         glossary_ignore_case=glossary_ignore_case, split_sentences=split_sentences, format=format,
                         keep_attributes=keep_attributes,
                         src_lang=src_lang, tgt_lang=tgt_lang)
    # several checkpoints: an ensemble; one stays a plain Path, as translate_file has always taken
    checkpoints = checkpoint[0] if len(checkpoint) == 1 else checkpoint
    if output is None:
        translate_file(checkpoints, config, options, io, input)
        return
    from .textio import atomic_text_output, check_output_file

    check_output_file(output, [("--input", input), ("--target", target), ("--target-prefix", target_prefix),
                               ("--constraints", constraints), ("--glossary", glossary)]
                      + [("--checkpoint", c) for c in checkpoint])
    with atomic_text_output(output) as handle:
        translate_file(checkpoints, config, options, io, input, handle)


def _serve_option(name: str, *flags: str):
    """A `serve` option for ServeConfig's field `name`: its help (and, below, its default) from the field."""
    return typer.Option(*(flags or ("--" + name.replace("_", "-"),)), help=field_info(ServeConfig, name)["help"])


def _serve_default(name: str):
    return field_info(ServeConfig, name)["default"]


@app.command()
@handles_user_errors
def serve(
    ctx: typer.Context,
    *,
    checkpoint: Annotated[list[Path], typer.Option("--checkpoint", "-c", help="best.pt from seqtool train; several for an ensemble.")],
    host: Annotated[str, _serve_option("host")] = _serve_default("host"),
    port: Annotated[int, _serve_option("port")] = _serve_default("port"),
    max_batch_tokens: Annotated[int, _serve_option("max_batch_tokens")] = _serve_default("max_batch_tokens"),
    max_wait_ms: Annotated[float, _serve_option("max_wait_ms")] = _serve_default("max_wait_ms"),
    queue_limit: Annotated[int, _serve_option("queue_limit")] = _serve_default("queue_limit"),
    request_timeout: Annotated[float, _serve_option("request_timeout")] = _serve_default("request_timeout"),
    max_lines: Annotated[int, _serve_option("max_lines")] = _serve_default("max_lines"),
    max_chars: Annotated[int, _serve_option("max_chars")] = _serve_default("max_chars"),
    max_beam: Annotated[int, _serve_option("max_beam")] = _serve_default("max_beam"),
    max_nbest: Annotated[int, _serve_option("max_nbest")] = _serve_default("max_nbest"),
    max_len: Annotated[int, _serve_option("max_len")] = _serve_default("max_len"),
    max_glossary: Annotated[int, _serve_option("max_glossary")] = _serve_default("max_glossary"),
    max_constraints: Annotated[int, _serve_option("max_constraints")] = _serve_default("max_constraints"),
    api_keys: Annotated[Optional[Path], _serve_option("api_keys")] = None,
    req_limit: Annotated[int, _serve_option("req_limit")] = _serve_default("req_limit"),
    cors: Annotated[Optional[list[str]], typer.Option("--cors", help="An origin allowed to call the API from a browser (repeat for more; * for any); none by default.")] = None,
    alignments: Annotated[bool, _serve_option("alignments")] = _serve_default("alignments"),
    workers: Annotated[int, _serve_option("workers")] = _serve_default("workers"),
    header_timeout: Annotated[float, _serve_option("header_timeout")] = _serve_default("header_timeout"),
    body_timeout: Annotated[float, _serve_option("body_timeout")] = _serve_default("body_timeout"),
    keep_alive_timeout: Annotated[float, _serve_option("keep_alive_timeout")] = _serve_default("keep_alive_timeout"),
    max_connections: Annotated[int, _serve_option("max_connections")] = _serve_default("max_connections"),
    beam: Annotated[int, typer.Option("--beam", "-b", help="Default beam size (a request may ask for another).")] = _default(SearchOptions, "beam"),
    lenpen: Annotated[float, typer.Option("--lenpen", help="Default length penalty.")] = _default(SearchOptions, "lenpen"),
    max_len_a: Annotated[float, typer.Option("--max-len-a", help="Default max output length = a * source length + b.")] = _default(SearchOptions, "max_len_a"),
    max_len_b: Annotated[int, typer.Option("--max-len-b")] = _default(SearchOptions, "max_len_b"),
    no_repeat_ngram_size: Annotated[int, _option(SearchOptions, "no_repeat_ngram_size")] = _default(SearchOptions, "no_repeat_ngram_size"),
    loop_guard: Annotated[int, _option(SearchOptions, "loop_guard")] = _default(SearchOptions, "loop_guard"),
    batch_size: Annotated[int, _option(DecodeConfig, "batch_size")] = _default(DecodeConfig, "batch_size"),
    device: Annotated[str, _option(DecodeConfig, "device")] = _default(DecodeConfig, "device"),
    precision: Annotated[str, _option(DecodeConfig, "precision")] = _default(DecodeConfig, "precision"),
    quantize: Annotated[str, _option(DecodeConfig, "quantize")] = _default(DecodeConfig, "quantize"),
    threads: Annotated[int, _option(DecodeConfig, "threads")] = _default(DecodeConfig, "threads"),
):
    """Serve translations over HTTP (LibreTranslate's /translate, /v1/translate, /health, /metrics, a page at /)."""
    from .serving.server import within_caps
    from .translate import recorded_defaults, settings

    config = ServeConfig(host=host, port=port, max_batch_tokens=max_batch_tokens, max_wait_ms=max_wait_ms,
                         queue_limit=queue_limit, request_timeout=request_timeout, max_lines=max_lines, max_chars=max_chars,
                         max_beam=max_beam, max_nbest=max_nbest, max_len=max_len, max_glossary=max_glossary,
                         max_constraints=max_constraints, api_keys=str(api_keys) if api_keys else "", req_limit=req_limit,
                         cors=",".join(cors or []), alignments=alignments, workers=workers, header_timeout=header_timeout,
                         body_timeout=body_timeout, keep_alive_timeout=keep_alive_timeout, max_connections=max_connections)
    # the options given on the command line, over the checkpoint's recorded decoding defaults (a student's beam 1;
    # lowered to the caps: only a --beam given here over --max-beam is refused)
    decode, options = settings(recorded=within_caps(recorded_defaults(checkpoint), config), **_given(ctx, dict(
        batch_size=batch_size, device=device, precision=precision, quantize=quantize, threads=threads, beam=beam,
        lenpen=lenpen, max_len_a=max_len_a, max_len_b=max_len_b, no_repeat_ngram_size=no_repeat_ngram_size,
        loop_guard=loop_guard)))
    if workers > 1:
        from .serving.pool import run
    else:
        from .serving.server import serve as run
    run(checkpoint[0] if len(checkpoint) == 1 else checkpoint, decode, options, config)


@app.command()
@handles_user_errors
def attention(
    source: Annotated[str, typer.Argument(help="The source sentence.")],
    *,
    checkpoint: Annotated[Path, typer.Option("--checkpoint", "-c", help="best.pt or last.pt from seqtool train.")],
    target: Annotated[Optional[str], typer.Option("--target", "-t", help="Force-decode this translation instead of searching for one.")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Picture to write: .png, .svg or .pdf (needs matplotlib).")] = None,
    layer: Annotated[int, typer.Option("--layer", help="Layer to draw, 1-based (0 = the last).")] = 0,
    all_layers: Annotated[bool, typer.Option("--all-layers", help="Draw every layer.")] = False,
    terminal: Annotated[bool, typer.Option("--terminal", help="Print encoder-decoder attention as a heatmap on stdout.")] = False,
    beam: Annotated[int, _option(SearchOptions, "beam", "--beam", "-b")] = _default(SearchOptions, "beam"),
    lenpen: Annotated[float, _option(SearchOptions, "lenpen")] = _default(SearchOptions, "lenpen"),
    device: Annotated[str, _option(DecodeConfig, "device")] = _default(DecodeConfig, "device"),
    precision: Annotated[str, typer.Option("--precision", help="fp32 (the weights drawn as trained), bf16 or fp16 (CUDA); auto as translate's.")] = "fp32",
    threads: Annotated[int, _option(DecodeConfig, "threads")] = _default(DecodeConfig, "threads"),
    tgt_lang: Annotated[str, _option(TranslateConfig, "tgt_lang")] = _default(TranslateConfig, "tgt_lang"),
):
    """Draw the attention of one sentence: every head of the encoder, decoder and encoder-decoder attention."""
    from .plot import show_attention

    config = DecodeConfig(device=device, precision=precision, threads=threads)
    show_attention(checkpoint, source, config, SearchOptions(beam=beam, lenpen=lenpen), target=target, output=output, layer=layer, all_layers=all_layers,
                   terminal=terminal, tgt_lang=tgt_lang)
    if output is not None:
        typer.echo(f"wrote {output}", err=True)


@app.command()
@handles_user_errors
def export(
    checkpoint: Annotated[Path, typer.Argument(help="best.pt or last.pt from seqtool train.")],
    out_dir: Annotated[Path, typer.Argument(help="Directory to write (model files plus sentencepiece.model).")],
    *,
    fmt: Annotated[str, typer.Option("--format", help="Target toolkit: ctranslate2, or huggingface (transformers' MarianMTModel).")] = "ctranslate2",
    quantization: Annotated[Optional[str], typer.Option("--quantization", help="Stored weight type for CTranslate2 (int8, float16, ...; default float32).")] = None,
    force: Force = False,
):
    """Export a checkpoint for another toolkit (CTranslate2, transformers) to deploy or share it."""
    from .export import export as run

    path = run(checkpoint, out_dir, fmt, force=force, quantization=quantization)
    typer.echo(f"wrote {path}", err=True)


@app.command("import")
@handles_user_errors
def import_(
    directory: Annotated[Path, typer.Argument(help="A transformers Marian model directory (an OPUS-MT model saved with save_pretrained).")],
    *,
    output: Annotated[Path, typer.Option("--output", "-o", help="The seqtool checkpoint to write.")],
    src_lang: Annotated[str, typer.Option("--src-lang", help="Its source language (default: tokenizer_config.json's source_lang).")] = "",
    tgt_lang: Annotated[str, typer.Option("--tgt-lang", help="Its target language (default: tokenizer_config.json's target_lang).")] = "",
    force: Force = False,
):
    """Import a pretrained model in transformers' Marian format as a seqtool checkpoint."""
    from .interop import import_marian

    if output.exists() and not force:
        raise InputError(f"{output}: already exists; pass --force to replace it")
    import_marian(directory, output, src_lang, tgt_lang)
    typer.echo(f"wrote {output}", err=True)


@app.command()
@handles_user_errors
def score(
    *,
    ref: Annotated[list[Path], typer.Option("--ref", "-r", help="Reference file; repeat for several references.")],
    hyp: Annotated[Optional[Path], typer.Option("--hyp", help="Hypotheses (default: stdin).")] = None,
    metrics: Annotated[str, typer.Option("--metrics", "-m", help="Comma-separated: bleu, chrf, ter.")] = "bleu,chrf",
    tokenize: Annotated[Optional[str], typer.Option("--tokenize", help="BLEU tokenizer: 13a, intl, zh, char, none, ...")] = None,
    lowercase: Annotated[bool, typer.Option("--lowercase", "-lc")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
):
    """Score translations against references with sacrebleu (BLEU, chrF, TER)."""
    from .score import score_files

    names = [m.strip().lower() for m in metrics.split(",") if m.strip()]
    results = score_files(hyp, ref, names, tokenize, lowercase)  # hypotheses from stdin without --hyp
    if as_json:
        typer.echo(json.dumps({r.name: {"score": round(r.score, 4), "signature": r.signature, "detail": r.detail} for r in results}))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(show_edge=False)
    for column in ("metric", "score", "signature"):
        table.add_column(column)
    for r in results:
        table.add_row(r.name.upper() if r.name != "chrf" else "chrF", f"{r.score:.2f}", r.signature)
    Console(soft_wrap=True).print(table)


@app.command()
@handles_user_errors
def info(
    checkpoint: Annotated[Path, typer.Argument(help="A checkpoint: last.pt, best.pt, checkpoint_u<N>.pt or an average.")],
    *,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
):
    """Print a checkpoint's configs, size, parameters, tokenizer and training progress."""
    from .info import describe

    summary = describe(checkpoint)
    typer.echo(summary.to_json() if as_json else summary.to_text(), nl=as_json)


@app.command()
@handles_user_errors
def average(
    checkpoints: Annotated[list[Path], typer.Argument(help="Checkpoints of one model to average.")],
    *,
    output: Annotated[Path, typer.Option("--output", "-o", help="The averaged checkpoint.")],
    force: Force = False,
):
    """Average the weights of several checkpoints into one."""
    from .checkpoint import average as run

    if output.exists() and not force:
        raise InputError(f"{output}: already exists; pass --force to replace it")
    run(checkpoints, output)
    typer.echo(f"wrote {output} (average of {len(checkpoints)} checkpoints)", err=True)


def main() -> None:
    app()
