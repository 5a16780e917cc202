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

from .config import DecodeConfig, ModelConfig, OptimConfig, Sampling, SearchOptions, ServeConfig, TokenizerConfig, TrainConfig, TranslateConfig
from .fields import scoped
from .errors import ConfigError, InputError
from .exits import handles_user_errors
from .options import Command, options, split

app = typer.Typer(
    name="seqtool",
    help="Train Transformer translation models on parallel text, translate, and score.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: no text taken for markup ([tensorboard]), no panels to wrap
    context_settings={"help_option_names": ["-h", "--help"]},
)

def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"seqtool {version('seqtool')}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")] = False):
    """Train Transformer translation models on parallel text, translate, and score."""


# ---- options shared by several commands, defined once -------------------------------------
Force = Annotated[bool, typer.Option("--force", help="Replace existing outputs.")]
Workers = Annotated[int, typer.Option("--workers", min=1, help="Processes that encode text in parallel.")]
Errors = Annotated[str, typer.Option("--errors", help="Invalid UTF-8: strict (stop) or replace (U+FFFD, with a warning).")]


@app.command("train-tokenizer", cls=Command)
@handles_user_errors
@options("tokenizer", TokenizerConfig)
def train_tokenizer_cmd(
    files: Annotated[list[Path], typer.Argument(help="Text files (plain or .gz); one joint vocabulary over all of them.")],
    *,
    model_prefix: Annotated[str, typer.Option("--model-prefix", help="Writes PREFIX.model and PREFIX.vocab.")],
    force: Force = False,
    given: dict,
):
    """Train a sentencepiece tokenizer (BPE or unigram) on raw text."""
    from .tokenizer import train_tokenizer

    config = TokenizerConfig(**given)
    if Path(f"{model_prefix}.model").exists() and not force:
        raise InputError(f"{model_prefix}.model already exists; pass --force to replace it")
    path = train_tokenizer(files, model_prefix, config)
    typer.echo(f"wrote {path} and {model_prefix}.vocab ({config.vocab_size} pieces)", err=True)


@app.command(cls=Command)
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


@app.command(cls=Command)
@handles_user_errors
@options("train", ModelConfig, OptimConfig, TrainConfig, TokenizerConfig, toml=False)
def train(
    data_dir: Annotated[Optional[Path], typer.Argument(help="DATA_DIR from binarize (or give raw files with --src/--tgt/--train/--valid).")] = None,
    *,
    save_dir: Annotated[Path, typer.Option("--save-dir", help="Where last.pt, best.pt, config.json and metrics.jsonl go.")],
    arch: Annotated[Optional[str], typer.Option("--arch", show_default="small", help="tiny, small, base, big, or student (a deep encoder and a shallow decoder, for distillation).")] = None,
    config_file: Annotated[Optional[Path], typer.Option("--config", metavar="FILE", help="A TOML file with [model], [optim] and [train] tables of field names (and an arch key); the command line wins.")] = None,
    max_time: Annotated[Optional[str], typer.Option("--max-time", metavar="DURATION", help="Wall-clock limit, e.g. 20m, 1.5h (no limit unless given).")] = None,
    train_prefix: Annotated[Optional[str], typer.Option("--train", metavar="PREFIX", help="Raw training files: PREFIX.SRC and PREFIX.TGT.")] = None,
    valid_prefix: Annotated[Optional[str], typer.Option("--valid", metavar="PREFIX", help="Raw validation files.")] = None,
    corpus: Annotated[Optional[list[str]], typer.Option("--corpus", metavar="SRC-TGT:PREFIX", help="Repeatable: train one model on several pairs (PREFIX.SRC and PREFIX.TGT, plain or .gz), the target language a tag in front of the source; one joint tokenizer.")] = None,
    valid_corpus: Annotated[Optional[list[str]], typer.Option("--valid-corpus", metavar="SRC-TGT:PREFIX", help="One per --corpus pair: its validation files (loss, BLEU and chrF per pair; best.pt by their mean).")] = None,
    finetune: Annotated[Optional[Path], typer.Option("--finetune", help="Start from this checkpoint's weights, model and tokenizer, with fresh optimizer, schedule and progress.")] = None,
    teacher: Annotated[Optional[list[Path]], typer.Option("--teacher", help="Distil this checkpoint (repeat for an ensemble): train on its translations of the training source (beam search as translate does it; cached in SAVE_DIR/distill, its time apart from --max-time). The checkpoint then decodes greedily by default.")] = None,
    distill_original: Annotated[Optional[bool], typer.Option("--distill-original/--teacher-only", help="With --teacher: train on the original targets too, each source twice (the default: measured 1.3 BLEU better for a 20-minute student), or on the teacher's translations only.", show_default=False)] = None,
    workers: Workers = 1,
    force: Annotated[bool, typer.Option("--force", help="Start a new run in a SAVE_DIR that holds another (replaces its checkpoints).")] = False,
    given: dict,
):
    """Train a Transformer on DATA_DIR, or directly on raw parallel files."""
    from .settings import parse_duration, train_settings
    from .training.train import RawData, TrainJob, train as run

    tokenizer = TokenizerConfig(**{k: given.pop(k) for k in scoped(TokenizerConfig, "train") if k in given})
    src_lang, tgt_lang = given.get("src_lang"), given.get("tgt_lang")
    options = {**given, **({"max_time": parse_duration(max_time)} if max_time is not None else {})}
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


@app.command(cls=Command)
@handles_user_errors
@options("translate", SearchOptions, Sampling, DecodeConfig, TranslateConfig)
def translate(
    *,
    checkpoint: Annotated[list[Path], typer.Option("--checkpoint", "-c", help="best.pt or last.pt from seqtool train; give it several times for an ensemble (probabilities averaged).")],
    input: Annotated[Optional[Path], typer.Option("--input", "-i", help="Read this file instead of stdin.")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write this file instead of stdout.")] = None,
    given: dict,
):
    """Translate stdin (or --input) line by line to stdout, in input order."""
    from .translate import translate_command

    translate_command(checkpoint, input, output, given)


@app.command(cls=Command)
@handles_user_errors
@options("serve", ServeConfig, SearchOptions, DecodeConfig)
def serve(
    *,
    checkpoint: Annotated[list[Path], typer.Option("--checkpoint", "-c", help="best.pt from seqtool train; several for an ensemble.")],
    cors: Annotated[Optional[list[str]], typer.Option("--cors", metavar="ORIGIN", help="An origin allowed to call the API from a browser (repeat for more; * for any); none by default.")] = None,
    given: dict,
):
    """Serve translations over HTTP (LibreTranslate's /translate, /v1/translate, /health, /metrics, a page at /)."""
    from .serving.server import serve as one, settings_given

    arguments = settings_given(checkpoint, {**given, **({"cors": ",".join(cors)} if cors else {})})
    if arguments[-1].workers > 1:
        from .serving.pool import run
    run(*arguments) if arguments[-1].workers > 1 else one(*arguments)


@app.command(cls=Command)
@handles_user_errors
@options("attention", SearchOptions, DecodeConfig, TranslateConfig)
def attention(
    source: Annotated[str, typer.Argument(help="The source sentence.")],
    *,
    checkpoint: Annotated[Path, typer.Option("--checkpoint", "-c", help="best.pt or last.pt from seqtool train.")],
    target: Annotated[Optional[str], typer.Option("--target", "-t", help="Force-decode this translation instead of searching for one.")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Picture to write: .png, .svg or .pdf (needs matplotlib).")] = None,
    layer: Annotated[int, typer.Option("--layer", help="Layer to draw, 1-based (0 = the last).")] = 0,
    all_layers: Annotated[bool, typer.Option("--all-layers", help="Draw every layer.")] = False,
    terminal: Annotated[bool, typer.Option("--terminal", help="Print encoder-decoder attention as a heatmap on stdout.")] = False,
    precision: Annotated[str, typer.Option("--precision", help="fp32 (the weights drawn as trained), bf16 or fp16 (CUDA); auto as translate's.")] = "fp32",
    given: dict,
):
    """Draw the attention of one sentence: every head of the encoder, decoder and encoder-decoder attention."""
    from .plot import show_attention

    search, decode, io = split(given, SearchOptions, DecodeConfig, TranslateConfig)
    show_attention(checkpoint, source, DecodeConfig(precision=precision, **decode), SearchOptions(**search), target=target,
                   output=output, layer=layer, all_layers=all_layers, terminal=terminal, tgt_lang=io.get("tgt_lang", ""))
    if output is not None:
        typer.echo(f"wrote {output}", err=True)


@app.command(cls=Command)
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


@app.command("import", cls=Command)
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


@app.command(cls=Command)
@handles_user_errors
def score(
    *,
    ref: Annotated[list[Path], typer.Option("--ref", "-r", help="Reference file; repeat for several references.")],
    hyp: Annotated[Optional[Path], typer.Option("--hyp", help="Hypotheses (default: stdin).")] = None,
    metrics: Annotated[str, typer.Option("--metrics", "-m", help="Comma-separated: bleu, chrf, ter.")] = "bleu,chrf",
    tokenize: Annotated[Optional[str], typer.Option("--tokenize", help="BLEU tokenizer: 13a, intl, zh, char, none, ...")] = None,
    lowercase: Annotated[bool, typer.Option("--lowercase", "-lc", help="Score case-insensitively.")] = False,
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


@app.command(cls=Command)
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


@app.command(cls=Command)
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
