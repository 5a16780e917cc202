"""The `seqtool` command line.

Thin by design: each command parses options, builds a config, calls ONE library function and
prints a summary. Heavy imports (torch) happen inside the commands, so `seqtool --help` is
instant. User mistakes become one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .config import DecodeConfig, ModelConfig, OptimConfig, Sampling, SearchOptions, ServeConfig, TokenizerConfig, TrainConfig, TranslateConfig
from .fields import split
from .options import command, options, print_version

app = typer.Typer(
    name="seqtool",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: no text taken for markup ([tensorboard]), no panels to wrap
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=print_version, is_eager=True, help="Print the version and exit.")] = False):
    """Train Transformer translation models on parallel text, translate, and score."""


Force = Annotated[bool, typer.Option("--force", help="Replace existing outputs.")]
Workers = Annotated[int, typer.Option("--workers", min=1, help="Processes that encode text in parallel.")]


@command(app, "train-tokenizer")
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
    path = train_tokenizer(files, model_prefix, config, force=force)
    typer.echo(f"wrote {path} and {model_prefix}.vocab ({config.vocab_size} pieces)", err=True)


@command(app)
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
    errors: Annotated[str, typer.Option("--errors", help="Invalid UTF-8: strict (stop) or replace (U+FFFD, with a warning).")] = "strict",
    force: Force = False,
    corpus: Annotated[Optional[list[str]], typer.Option("--corpus", help="SRC-TGT:PREFIX, repeatable: several pairs into one multilingual DATA_DIR (each pair in DATA_DIR/SRC-TGT, target tags after the tokenizer's pieces), for train.")] = None,
    valid_corpus: Annotated[Optional[list[str]], typer.Option("--valid-corpus", help="SRC-TGT:PREFIX, one per --corpus pair: its validation files.")] = None,
):
    """Encode parallel text into memory-mapped token arrays in DATA_DIR."""
    from .training.command import binarize_command

    for line in binarize_command(src, tgt, train, valid, test, tokenizer, out, workers, errors, force, corpus, valid_corpus):
        typer.echo(line, err=True)


@command(app)
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
    from .training.command import train_command

    result = train_command(data_dir, save_dir, arch, config_file, max_time, train_prefix, valid_prefix, corpus, valid_corpus,
                           finetune, teacher, distill_original, workers, force, given)
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


@command(app)
@options("translate", SearchOptions, Sampling, DecodeConfig, TranslateConfig)
def translate(
    *,
    checkpoint: Annotated[list[Path], typer.Option("--checkpoint", "-c", help="best.pt or last.pt from seqtool train; give it several times for an ensemble (probabilities averaged).")],
    input: Annotated[Optional[Path], typer.Option("--input", "-i", help="Read this file instead of stdin.")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write this file instead of stdout.")] = None,
    given: dict,
):
    """Translate stdin (or --input) line by line to stdout, in input order."""
    from .files import translate_command

    translate_command(checkpoint, input, output, given)


@command(app)
@options("serve", ServeConfig, SearchOptions, DecodeConfig)
def serve(
    *,
    checkpoint: Annotated[list[Path], typer.Option("--checkpoint", "-c", help="best.pt from seqtool train; several for an ensemble.")],
    cors: Annotated[Optional[list[str]], typer.Option("--cors", metavar="ORIGIN", help="An origin allowed to call the API from a browser (repeat for more; * for any); none by default.")] = None,
    given: dict,
):
    """Serve translations over HTTP (LibreTranslate's /translate, /v1/translate, /health, /metrics, a page at /)."""
    from .serving.pool import run
    from .serving.server import settings_given

    run(*settings_given(checkpoint, {**given, **({"cors": ",".join(cors)} if cors else {})}))


@command(app)
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

    search, decode, io, _ = split(given, SearchOptions, DecodeConfig, TranslateConfig)
    show_attention(checkpoint, source, DecodeConfig(precision=precision, **decode), SearchOptions(**search), target=target,
                   output=output, layer=layer, all_layers=all_layers, terminal=terminal, tgt_lang=io.get("tgt_lang", ""))
    if output is not None:
        typer.echo(f"wrote {output}", err=True)


@command(app)
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


@command(app, "import")
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

    import_marian(directory, output, src_lang, tgt_lang, force)
    typer.echo(f"wrote {output}", err=True)


@command(app)
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
    from .score import print_scores, score_files

    names = [m.strip().lower() for m in metrics.split(",") if m.strip()]
    print_scores(score_files(hyp, ref, names, tokenize, lowercase), as_json)  # hypotheses from stdin without --hyp


@command(app)
def info(
    checkpoint: Annotated[Path, typer.Argument(help="A checkpoint: last.pt, best.pt, checkpoint_u<N>.pt or an average.")],
    *,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
):
    """Print a checkpoint's configs, size, parameters, tokenizer and training progress."""
    from .info import describe

    summary = describe(checkpoint)
    typer.echo(summary.to_json() if as_json else summary.to_text(), nl=as_json)


@command(app)
def average(
    checkpoints: Annotated[list[Path], typer.Argument(help="Checkpoints of one model to average.")],
    *,
    output: Annotated[Path, typer.Option("--output", "-o", help="The averaged checkpoint.")],
    force: Force = False,
):
    """Average the weights of several checkpoints into one."""
    from .checkpoint import average as run

    run(checkpoints, output, force)
    typer.echo(f"wrote {output} (average of {len(checkpoints)} checkpoints)", err=True)


def main() -> None:
    app()
