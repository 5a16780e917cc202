"""Typed configuration for every step of the data path.

Owns the dataclasses that a checkpoint stores (so a model rebuilds from its file alone), their
validation, the model presets, and reading an optional TOML config file. Every config is plain
data: ``to_dict`` gives JSON/TOML-safe values, ``from_dict`` rejects unknown keys.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .errors import ConfigError, FieldError


class _Config:
    """Shared to_dict/from_dict for the dataclasses below."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = ""):
        """The config of these settings; unknown keys and values of the wrong type are refused,
        naming `where` (e.g. "run.toml: [train]") and the key."""
        return cls(**checked_settings(cls, data, where or cls.__name__))

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


def checked_settings(cls, data: dict[str, Any], where: str) -> dict[str, Any]:
    """data's keys must be fields of the dataclass cls and its values of their types (an int is a
    valid float; a list of the right length a valid tuple, returned as one)."""
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls) if f.init}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    out = {}
    for key, value in data.items():
        if not _conforms(value, hints[key]):
            raise ConfigError(f"{where}: {key} = {value!r}: expected {_describe(hints[key])}")
        nested = [a for a in (typing.get_args(hints[key]) or (hints[key],)) if isinstance(a, type) and issubclass(a, _Config)]
        if nested and isinstance(value, dict):  # a config inside a config (SearchOptions.sampling)
            value = nested[0].from_dict(value, f"{where}: {key}")
        elif typing.get_origin(hints[key]) is tuple:
            value = tuple(value)
        elif hints[key] is str and isinstance(value, os.PathLike):
            value = str(value)
        out[key] = value
    return out


def _conforms(value: Any, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, (str, os.PathLike))
    if origin is tuple:
        return isinstance(value, (list, tuple)) and len(value) == len(args) and all(map(_conforms, value, args))
    if isinstance(hint, type) and issubclass(hint, _Config):
        return isinstance(value, (dict, hint))
    return True  # anything else is the dataclass's own check


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is tuple:
        return f"a list of {len(args)} " + ("numbers" if all(a in (int, float) for a in args) else "values")
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "nothing"}.get(hint, str(hint))


INT64 = 2 ** 63


def setting(default: Any, help: str = "", *, ge: Any = None, gt: Any = None, le: Any = None, lt: Any = None,
            option: str = "") -> Any:
    """A config field with what every front end needs to know of it, declared once: its default,
    its help, its bounds (every number must also be finite and, for an int, fit int64) and, where
    the command line names it otherwise than --field-name, its option."""
    return field(default=default, metadata={"help": help, "ge": ge, "gt": gt, "le": le, "lt": lt, "option": option})


def field_info(cls, name: str) -> dict[str, Any]:
    """A field's metadata (help, bounds, option) and its default: what the CLI and the server's
    request models take from it."""
    f = next(f for f in fields(cls) if f.name == name)
    return {"help": "", "ge": None, "gt": None, "le": None, "lt": None, "option": "", **f.metadata, "default": f.default}


def _options(cls) -> dict[str, str]:
    """How the command line names each field: its `option`, else the class's naming."""
    return {f.name: f.metadata.get("option") or cls.NAMING.format(f.name.replace("_", "-") if cls.NAMING.startswith("--") else f.name)
            for f in fields(cls)}


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int) and abs(value) >= 2 ** 16 and value & (value - 1) == 0:
        return f"2^{value.bit_length() - 1}"
    return f"{value:.3g}" if isinstance(value, int) and abs(value) >= 10 ** 15 else f"{value:,}" if isinstance(value, int) and abs(value) >= 10_000 else str(value)


def _check_bounds(config) -> None:
    """Every numeric field finite and within its declared bounds: one FieldError naming it."""
    for f in fields(config):
        value = getattr(config, f.name)
        for v in value if isinstance(value, tuple) else (value,):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            problem = None
            m = f.metadata
            low = (m["ge"], ">=") if m.get("ge") is not None else (m["gt"], ">") if m.get("gt") is not None else None
            high = (m["le"], "<=") if m.get("le") is not None else (m["lt"], "<") if m.get("lt") is not None else None
            if isinstance(v, float) and not math.isfinite(v):
                problem = "a finite number"
            elif not ((low is None or (v >= low[0] if low[1] == ">=" else v > low[0])) and
                      (high is None or (v <= high[0] if high[1] == "<=" else v < high[0]))):
                if low and high:
                    problem = f"in {'[' if low[1] == '>=' else '('}{_number(low[0])}, {_number(high[0])}{']' if high[1] == '<=' else ')'}"
                else:
                    problem = " ".join((bound := low or high)[1:] + (_number(bound[0]),))
            elif isinstance(v, int) and not -INT64 <= v < INT64:
                problem = "in [-2^63, 2^63)"
            if problem:
                raise FieldError(f"`{f.name}` must be {problem}, got {_number(v)}", _options(type(config)))


class _Validated(_Config):
    """Bounds first (declared with each field), then the config's own rules across fields."""

    NAMING: typing.ClassVar[str] = "--{}"  # a field without an option of its own: --field-name

    def __post_init__(self):
        _check_bounds(self)
        self.validate()

    def validate(self) -> None:
        pass

    def _check(self, condition: bool, template: str) -> None:
        """A rule across fields: its message names them in backquotes (`beam`) for FieldError."""
        if not condition:
            raise FieldError(template, _options(type(self)))


@dataclass(frozen=True)
class TokenizerConfig(_Validated):
    vocab_size: int = setting(8000, ge=8, lt=2 ** 31)
    model_type: str = "bpe"
    character_coverage: float = setting(1.0, gt=0.0, le=1.0)
    # sentencepiece keeps a uniform sample of this many lines (seeded), so memory is bounded by the
    # setting, not by the corpus; 0 = every line
    input_sentence_size: int = setting(1_000_000, ge=0)
    byte_fallback: bool = False
    threads: int = setting(2, ge=1, le=1024)
    seed: int = setting(1, ge=0, lt=2 ** 32)

    def validate(self):
        self._check(self.model_type in ("bpe", "unigram"), f"`model_type` must be bpe or unigram, got {self.model_type!r}")


@dataclass(frozen=True)
class ModelConfig(_Validated):
    NAMING: typing.ClassVar[str] = "model.{}"  # most have no option: named as in the checkpoint and TOML file
    vocab_size: int = setting(8000, ge=1, lt=2 ** 31)
    d_model: int = setting(256, ge=1, le=2 ** 16)
    n_heads: int = setting(4, ge=1, le=2 ** 10)
    d_ff: int = setting(1024, ge=1, le=2 ** 18)
    encoder_layers: int = setting(3, ge=1, le=1024)
    decoder_layers: int = setting(3, ge=1, le=1024)
    dropout: float = setting(0.1, ge=0.0, lt=1.0, option="--dropout")
    attention_dropout: float = setting(0.0, ge=0.0, lt=1.0)
    activation_dropout: float = setting(0.0, ge=0.0, lt=1.0)
    max_positions: int = setting(1024, ge=2, le=2 ** 20)
    pre_norm: bool = False  # post-norm, as in the paper
    tie_embeddings: bool = True  # one joint vocabulary: source, target and output share weights
    pad_id: int = setting(0, ge=0)
    bos_id: int = setting(2, ge=0)
    eos_id: int = setting(3, ge=0)
    # the last `language_tags` ids name a target language in front of the source (languages.py): never generated
    language_tags: int = setting(0, ge=0)
    # what an imported model (interop.py: transformers' Marian format) may differ in; seqtool trains the first of each
    activation: str = "relu"  # the feed-forward's: relu, gelu (erf) or swish (x * sigmoid(x))
    scale_embedding: bool = True  # embeddings x sqrt(d_model) before the positions are added
    output_bias: bool = False  # a bias on the output logits (Marian's final_logits_bias)

    def validate(self):
        self._check(self.d_model % self.n_heads == 0, f"`d_model` {self.d_model} is not divisible by `n_heads` {self.n_heads}")
        self._check(self.vocab_size > max(self.pad_id, self.bos_id, self.eos_id), "`vocab_size` too small for the special ids")
        self._check(self.vocab_size - self.language_tags > max(self.pad_id, self.bos_id, self.eos_id),
                    "`language_tags` leave too few ids for the tokenizer's pieces")
        self._check(self.activation in ACTIVATIONS, f"`activation` must be one of {', '.join(ACTIVATIONS)}, got {self.activation!r}")


ACTIVATIONS = ("relu", "gelu", "swish")

PRESETS: dict[str, dict[str, int]] = {
    "tiny": dict(d_model=128, n_heads=4, d_ff=512, encoder_layers=2, decoder_layers=2),
    "small": dict(d_model=256, n_heads=4, d_ff=1024, encoder_layers=3, decoder_layers=3),
    "base": dict(d_model=512, n_heads=8, d_ff=2048, encoder_layers=6, decoder_layers=6),
    "big": dict(d_model=1024, n_heads=16, d_ff=4096, encoder_layers=6, decoder_layers=6),
    # a distillation student (train --teacher): small's width, a deeper encoder than decoder (Kasai et al., ICLR
    # 2021, "Deep Encoder, Shallow Decoder": the encoder runs once per sentence, the decoder at every output
    # token). Measured (bench/students.py, bible es-en, 20 minutes, 2 CPU threads): 4+1 trains 3,426 updates and
    # scores 19.74 BLEU greedy at 3.5x the teacher's beam-5 speed; 6+2 trains 2,383 updates, 17.67 BLEU, 2.1x.
    # On a CPU the deep encoder is not free (its FLOPs are a sentence's, not a GPU's one parallel pass).
    "student": dict(d_model=256, n_heads=4, d_ff=1024, encoder_layers=4, decoder_layers=1),
}


@dataclass(frozen=True)
class OptimConfig(_Validated):
    lr: float = setting(1e-3, gt=0.0, le=100.0)  # the peak
    # linear warmup from 0 over N updates (at most 10% of a horizon), or over a share 0 < F < 1 of it
    warmup: float = setting(1000, ge=0)
    # auto: linear decay to 0 at the horizon when the run has one, else inverse-sqrt (schedule.py)
    lr_schedule: str = "auto"
    betas: tuple[float, float] = setting((0.9, 0.98), ge=0.0, lt=1.0)
    eps: float = setting(1e-8, gt=0.0, le=1.0)
    weight_decay: float = setting(0.0, ge=0.0, le=100.0)
    clip_norm: float = setting(1.0, ge=0.0)  # 0 disables clipping
    label_smoothing: float = setting(0.1, ge=0.0, lt=1.0)

    def validate(self):
        object.__setattr__(self, "betas", tuple(self.betas))
        self._check(self.warmup < 1 or float(self.warmup).is_integer(),
                    f"`warmup` is a number of updates or a share of the horizon below 1, got {self.warmup}")
        self._check(self.lr_schedule in ("auto", "inverse-sqrt", "linear", "cosine", "wsd"),
                    f"`lr_schedule` must be auto, inverse-sqrt, linear, cosine or wsd, got {self.lr_schedule!r}")


LENPEN = dict(ge=0.0, le=10.0)  # score = log-prob / length^lenpen: beyond 10 every score rounds to 0 or -inf
MAX_LEN_A = dict(ge=0.0, le=1000.0)
MAX_LEN_B = dict(ge=0, le=1_000_000)


@dataclass(frozen=True)
class TrainConfig(_Validated):
    max_tokens: int = setting(4096, ge=1)  # batch cost = sentences x max(padded source, padded target length)
    max_updates: int = setting(0, ge=0)  # 0 = no limit
    max_epochs: int = setting(0, ge=0)
    max_time: float = setting(0.0, ge=0.0)  # seconds; 0 = no limit
    validate_interval_updates: int = setting(0, ge=0)  # 0 = once per epoch only
    log_interval: float = setting(10.0, ge=0.0)  # seconds between plain log lines when stderr is not a terminal
    precision: str = "auto"  # auto: bf16 where the GPU or CPU has bf16 arithmetic, fp16 on older GPUs, else fp32 (device.py)
    device: str = "auto"
    seed: int = setting(1, ge=0, lt=2 ** 32)
    threads: int = setting(0, ge=0, le=4096)  # 0 = torch's default
    src_lang: str = setting("", option="--src")
    tgt_lang: str = setting("", option="--tgt")
    # several --corpus pairs: each pair's share of an epoch is its share of the lines to the power 1/T
    # (languages.temperature_shares; Arivazhagan et al., 2019); one pair ignores it. 1 by measurement
    # (bench/multilingual.py, 2026-12-07, bible es-en + loc en-de, 20 minutes; against two bilingual
    # models of 10 minutes: T=1 -0.22 and -0.04 mean test BLEU, T=2 -2.04, the paper's T=5 -5.19): in
    # a run of about two epochs every share taken from the large pair costs more than the small one
    # wins. T=5 pays where many small pairs train for long.
    lang_temperature: float = setting(1.0, "Several --corpus pairs: each pair's share of an epoch is its share of the lines to the "
                                           "power 1/T (1: as the data is; large: every pair alike).", gt=0.0, le=1e6, option="--lang-temperature")
    # validation (validate.py): BLEU/chrF by decoding with translate's search, best.pt, early stopping
    eval_bleu: bool = False
    eval_bleu_beam: int = setting(4, ge=1, le=1024)
    eval_bleu_lenpen: float = setting(1.0, **LENPEN)
    eval_bleu_max_len_a: float = setting(1.2, **MAX_LEN_A)  # max output length = a * source length + b, as in translate;
    eval_bleu_max_len_b: int = setting(10, **MAX_LEN_B)  # tighter than translate's default so early validations stay quick
    best_metric: str = "loss"  # loss (lower is better), bleu or chrf (higher is better)
    patience: int = setting(0, ge=0)  # stop after this many validations without improvement; 0 = never
    # checkpoints (train.py) and logs (metrics.py)
    save_interval_updates: int = setting(0, ge=0)  # also write last.pt every N updates; 0 = at validations only
    keep_last: int = setting(0, ge=0)  # keep the newest K update-numbered copies checkpoint_u<N>.pt; 0 = none
    tensorboard_dir: str = setting("", option="--tensorboard")  # also write TensorBoard scalars here
    update_freq: int = setting(1, ge=1)  # micro-batches accumulated per update (per rank)
    dist_timeout: float = setting(600.0, gt=0.0)  # seconds a rank waits for the others before the job fails (distributed.py)
    compile: bool = False  # torch.compile the model; falls back to eager where it cannot
    # an exponential moving average of the weights (ema.py), validated at the end of the run and
    # kept as best.pt when it is better; 0 = off (the default: with the learning rate decaying to 0
    # at the horizon it never won in 8 measured runs of 4-20 minutes, bench/results.md)
    ema_decay: float = setting(0.0, ge=0.0, lt=1.0)

    def validate(self):
        self._check(self.best_metric in ("loss", "bleu", "chrf"), f"`best_metric` must be loss, bleu or chrf, got {self.best_metric!r}")
        self._check(self.best_metric == "loss" or self.eval_bleu,
                    f"`best_metric` {self.best_metric} needs `eval_bleu` (validation must decode to score {self.best_metric})")
        self._check(self.eval_bleu_max_len_b >= 1 or self.eval_bleu_max_len_a > 0, "`eval_bleu_max_len_a`/-b allow no output token")
        self._check(self.keep_last == 0 or self.save_interval_updates > 0,
                    "`keep_last` keeps the copies written every `save_interval_updates` N; give `save_interval_updates` too")
        self._check(self.precision in ("auto", "fp32", "bf16", "fp16"), f"`precision` must be auto, fp32, bf16 or fp16, got {self.precision!r}")
        self._check(self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:"),
                    f"`device` must be auto, cpu or cuda, got {self.device!r}")


@dataclass(frozen=True)
class Sampling(_Validated):
    """--sampling's shape: draw from softmax(log p / temperature) among the top-k tokens and the
    nucleus of mass top-p; the same seed gives the same samples (search.py)."""
    topk: int = setting(0, "Sample among the k most probable tokens (0 = all).", ge=0, lt=2 ** 31)
    topp: float = setting(1.0, "Sample among the most probable tokens whose mass reaches p (nucleus; 1.0 = all).", gt=0.0, le=1.0)
    temperature: float = setting(1.0, "Sample from softmax(log p / T): below 1 sharper, above 1 flatter.", gt=0.0, le=1000.0)
    seed: int = setting(1, "The same seed gives the same samples, whatever the batching.", ge=0, lt=2 ** 63)


@dataclass(frozen=True)
class SearchOptions(_Validated):
    """What one request asks of search (search.search takes it; a server takes one per request):
    beam, length penalty, n-best, output length, and sampling instead of search. How the process
    decodes (device, precision, threads, workers, batching, I/O) is DecodeConfig's."""
    beam: int = setting(5, "Beam size (1 = greedy).", ge=1, le=1024)
    lenpen: float = setting(1.0, "Length penalty: score = log-prob / length^lenpen.", **LENPEN)
    nbest: int = setting(1, "Hypotheses per segment, best first.", ge=1, le=1024)
    max_len_a: float = setting(0.0, "Max output length = a * source length + b.", **MAX_LEN_A)
    max_len_b: int = setting(200, "Max output length = a * source length + b.", **MAX_LEN_B)
    min_len: int = setting(1, ge=0, le=1_000_000)
    max_len: int = setting(0, "The longest output in tokens, whatever max_len_a and max_len_b say (0: only the model's positions).", ge=0, le=1_000_000)
    sampling: Sampling | None = None  # sample nbest translations instead of searching (beam unused)
    no_repeat_ngram_size: int = setting(0, "No n-gram of this many tokens appears twice in an output (a target prefix counts); 0 = off.",
                                        ge=0, le=1_000_000)
    loop_guard: int = setting(4, "No phrase of 1 to 8 tokens appears this many times in a row in an output, unless its source has "
                                 "such a run (constraints may still ask for one); 0 = off.", ge=0, le=64)

    def validate(self):
        if self.sampling is None:
            self._check(self.nbest <= self.beam, f"`nbest` must be between 1 and `beam` ({self.beam}), got {self.nbest}")
        self._check(self.max_len_b >= 1 or self.max_len_a > 0, "`max_len_a`/`max_len_b` allow no output token")
        self._check(self.loop_guard != 1, "`loop_guard` counts copies of a phrase in a row: 0 (off) or at least 2, got 1")


@dataclass(frozen=True)
class DecodeConfig(_Validated):
    """How a process decodes: device, number formats, threads, worker processes, batching and whether
    it computes alignments. What one request asks of search is SearchOptions'; what `translate`
    reads and writes besides the lines is TranslateConfig's."""
    max_tokens: int = setting(0, "Source-token budget of a batch (0 = only --batch-size limits it).", ge=0)
    batch_size: int = setting(64, "Sentences per batch.", ge=1)
    device: str = setting("auto", "auto, cpu, cuda or cuda:N.")
    precision: str = setting("auto", "auto (bf16 on CPUs with AVX512-BF16/AMX, else fp32), fp32, bf16 or fp16 (CUDA).")
    quantize: str = setting("none", "int8: dynamic int8 quantization of the linear layers (CPU).")
    threads: int = setting(0, "CPU threads for torch (0 = torch's default).", ge=0, le=4096)
    workers: int = setting(1, "CPU decoding processes, each on --threads/N threads, decoding batches in parallel: more "
                              "throughput for files (CTranslate2's inter_threads).", ge=1, le=1024)
    chunk_lines: int = setting(2048, ge=1)  # lines read, sorted and batched together
    alignments: bool = False  # hard alignments from encoder-decoder attention with every hypothesis (alignment.py)
    alignment_layer: int = setting(0, "Decoder layer (1-based) whose attention, averaged over heads, gives alignments; 0 = the last.",
                                   ge=0, le=1024)

    def validate(self):
        self._check(self.threads == 0 or self.threads >= self.workers,
                    f"`workers` {self.workers} needs at least one thread each; got `threads` {self.threads}")
        self._check(self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:"),
                    f"`device` must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        self._check(self.precision in ("auto", "fp32", "bf16", "fp16"), f"`precision` must be auto, fp32, bf16 or fp16, got {self.precision!r}")
        self._check(self.quantize in ("none", "int8"), f"`quantize` must be none or int8, got {self.quantize!r}")
        self._check(self.quantize == "none" or self.precision in ("auto", "fp32"),
                    f"`quantize` {self.quantize} computes in int8/float32; drop `precision` {self.precision}")


@dataclass(frozen=True)
class TranslateConfig(_Validated):
    """What `seqtool translate` reads and writes besides its lines: files read line for line with the
    input, and the output's format. `check(options)` holds the rules across it and the search."""
    print_scores: bool = setting(False, "index<TAB>score<TAB>translation.")
    print_alignment: bool = setting(False, "Add a 4th field: source-target token pairs 'i-j' from encoder-decoder attention.")
    errors: str = setting("replace", "Invalid UTF-8: strict (stop) or replace (U+FFFD, with a warning).")
    score_reference: bool = setting(False, "Score the references of --target instead of translating: index<TAB>score<TAB>reference<TAB>sum<TAB>average.")
    target: str = setting("", "With --score-reference: one reference per input line.")
    target_prefix: str = setting("", "One prefix per input line (an empty line: none): the translation starts with it and goes on from there.")
    constraints: str = setting("", 'One JSON list per input line of phrases its translation must contain; a list inside is "one of these forms" (an empty line: none).')
    glossary: str = setting("", "TSV: source term<TAB>target term[<TAB>other forms]; a source term found in a line (whole words) makes its target a constraint.")
    glossary_ignore_case: bool = setting(False, "Find --glossary source terms whatever their case.")
    split_sentences: str = setting("auto", "auto: a line holding several sentences that is longer than the model's training "
                                           "lines is translated sentence by sentence and joined back with its own whitespace; "
                                           "always: every line so; never: lines whole.")
    format: str = setting("auto", "auto: html for .html/.htm/.xhtml files, markdown for .md/.markdown, text otherwise "
                                  "(stdin: text); text: one segment per line; html or markdown: the input is one document, "
                                  "the output one document (markup kept, text translated).")
    keep_attributes: bool = setting(False, "html: leave the values of title, alt, placeholder and aria-label untranslated.")
    src_lang: str = setting("", "The input's language: checked against the model's, and for a multilingual model, with "
                                "--tgt-lang, whether the pair was trained (a zero-shot pair is translated, with a warning).")
    tgt_lang: str = setting("", "The language to translate into: required for a model trained into several (it lists them).")

    def validate(self):
        self._check(self.errors in ("strict", "replace"), f"`errors` must be strict or replace, got {self.errors!r}")
        self._check(self.split_sentences in ("auto", "always", "never"),
                    f"`split_sentences` must be auto, always or never, got {self.split_sentences!r}")
        self._check(self.format.lower() in ("auto", "text", "html", "markdown"),
                    f"`format` must be auto, text, html or markdown, got {self.format!r}")
        self._check(self.format.lower() in ("auto", "text") or not (self.target_prefix or self.constraints or self.score_reference or self.print_scores
                                                  or self.print_alignment),
                    f"`format` {self.format} translates a document; `target_prefix`, `constraints`, `score_reference`, "
                    "`print_scores` and `print_alignment` are per line (format text)")
        self._check(self.split_sentences != "always" or not (self.target_prefix or self.constraints or self.score_reference
                                                             or self.print_alignment),
                    "`split_sentences` always cuts lines into sentences; `target_prefix`, `constraints`, `score_reference` and "
                    "`print_alignment` are per line: use `split_sentences` auto or never")
        self._check(self.score_reference == bool(self.target),
                    "`score_reference` needs `target` FILE (one reference per input line)" if self.score_reference
                    else "`target` FILE gives the references of `score_reference`; add `score_reference`")
        self._check(not ((self.target_prefix or self.constraints or self.glossary) and self.score_reference),
                    "`score_reference` scores whole references; drop `target_prefix`, `constraints` and `glossary`")
        self._check(not (self.score_reference and self.print_alignment),
                    "`score_reference` prints one line per input line; drop `print_alignment`")

    def check(self, options: SearchOptions) -> None:
        """The rules across this and the run's search options."""
        self._check(not ((self.constraints or self.glossary) and options.sampling is not None),
                    "`constraints` and `glossary` are kept by beam search; drop `sampling`")
        self._check(self.format.lower() in ("auto", "text") or options.nbest == 1,
                    f"`format` {self.format.lower()} translates a document into one document; drop `nbest`")
        if self.score_reference:
            self._check(options.sampling is None, "`score_reference` scores the given references; drop `sampling`")
            self._check(options.nbest == 1, "`score_reference` prints one line per input line; drop `nbest`")


@dataclass(frozen=True)
class ServeConfig(_Validated):
    """`seqtool serve`'s server settings (the model's are a DecodeConfig). The caps bound what one
    request may cost, checked before any work on it: 413 for its size, 422 for its search."""
    host: str = setting("127.0.0.1", "Address to listen on (0.0.0.0: every interface).")
    port: int = setting(5000, "TCP port (0: a free one, logged).", ge=0, le=65535)
    max_batch_tokens: int = setting(4096, "Source tokens of pending segments decoded together.", ge=1)
    max_wait_ms: float = setting(10.0, "The longest the oldest pending segment waits for others to join its batch.", ge=0.0, le=3_600_000.0)
    queue_limit: int = setting(4096, "Pending segments; beyond, requests get 503 with Retry-After (413 for a request larger than it).", ge=1)
    request_timeout: float = setting(60.0, "Seconds before a request gets 504 (its segments are dropped, also from a running batch).", gt=0.0, le=86_400.0)
    max_lines: int = setting(256, "Segments per request (413 beyond).", ge=1)
    max_chars: int = setting(100_000, "Characters per request, segments, prefixes, constraints and glossary together (413 beyond; a body over 8x this plus 64 KiB is refused unread).", ge=1, le=2 ** 30)
    max_beam: int = setting(16, "The largest beam a request may ask for (422 beyond).", ge=1, le=1024)
    max_nbest: int = setting(16, "The most hypotheses or samples per segment a request may ask for (422 beyond).", ge=1, le=1024)
    max_len: int = setting(512, "The longest output in tokens a request may ask for: max_len_b, or max_len_a * source length + max_len_b (422 beyond).", ge=1, le=1_000_000)
    max_glossary: int = setting(1000, "Glossary entries per request (413 beyond).", ge=0)
    max_constraints: int = setting(64, "Constraint phrases per segment, its glossary matches included (413 beyond).", ge=0)
    api_keys: str = setting("", "A file of API keys, one per line (# comments): each request needs one, as api_key or Authorization: Bearer (403 otherwise).")
    req_limit: int = setting(0, "Requests per minute per API key (or client address without --api-keys); 429 with Retry-After beyond; 0 = no limit.", ge=0)
    cors: str = setting("", "Origins allowed to call the API from a browser, comma-separated (* any); none by default.")
    alignments: bool = setting(False, "Answer alignment requests of /v1/translate.")
    workers: int = setting(1, "Server processes on the port, one model each (threads split among them).", ge=1, le=1024)
    header_timeout: float = setting(10.0, "Seconds a client has to send a request's head once connected (or after its last answer); 408 and closed beyond.", gt=0.0, le=3600.0)
    body_timeout: float = setting(30.0, "Seconds a client has to send a request's body after its head; 408 and closed beyond.", gt=0.0, le=3600.0)
    keep_alive_timeout: float = setting(5.0, "Seconds an idle kept-alive connection stays open.", gt=0.0, le=3600.0)
    max_connections: int = setting(1000, "Open connections per server process (within the descriptor limit); a new one past it closes the longest-idle or slowest one, else gets 503.", ge=1, le=1_000_000)



def model_config_for(arch: str, **overrides: Any) -> ModelConfig:
    if arch not in PRESETS:
        raise ConfigError(f"--arch must be one of {', '.join(PRESETS)}, got {arch!r}")
    values: dict[str, Any] = dict(PRESETS[arch])
    values.update({k: v for k, v in overrides.items() if v is not None})
    return ModelConfig(**values)


def config_diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Human-readable differences between two nested config dicts."""
    out: list[str] = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_diff(a, b, f"{prefix}{key}.")
        elif (list(a) if isinstance(a, (list, tuple)) else a) != (list(b) if isinstance(b, (list, tuple)) else b):
            out.append(f"{prefix}{key}: saved {a!r}, now {b!r}")
    return out


@dataclass
class RunPaths:
    """Where train writes; kept here so cli and train agree on names."""

    save_dir: Path
    last: Path = field(init=False)
    best: Path = field(init=False)
    config: Path = field(init=False)
    metrics: Path = field(init=False)

    def __post_init__(self):
        self.save_dir = Path(self.save_dir)
        self.last = self.save_dir / "last.pt"
        self.best = self.save_dir / "best.pt"
        self.config = self.save_dir / "config.json"
        self.metrics = self.save_dir / "metrics.jsonl"
