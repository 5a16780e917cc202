"""Typed configuration for every step of the data path.

Owns the dataclasses that a checkpoint stores (so a model rebuilds from its file alone), their
validation, the model presets, and reading an optional TOML config file. Every config is plain
data: ``to_dict`` gives JSON/TOML-safe values, ``from_dict`` rejects unknown keys.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .errors import ConfigError


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
        if typing.get_origin(hints[key]) is tuple:
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
    return True  # anything else is the dataclass's own check


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is tuple:
        return f"a list of {len(args)} " + ("numbers" if all(a in (int, float) for a in args) else "values")
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "nothing"}.get(hint, str(hint))


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


@dataclass(frozen=True)
class TokenizerConfig(_Config):
    vocab_size: int = 8000
    model_type: str = "bpe"
    character_coverage: float = 1.0
    # sentencepiece keeps a uniform sample of this many lines (seeded), so memory is bounded by the
    # setting, not by the corpus; 0 = every line
    input_sentence_size: int = 1_000_000
    byte_fallback: bool = False
    threads: int = 2
    seed: int = 1

    def __post_init__(self):
        _check(self.vocab_size >= 8, f"--vocab-size must be at least 8, got {self.vocab_size}")
        _check(self.model_type in ("bpe", "unigram"), f"--model-type must be bpe or unigram, got {self.model_type!r}")
        _check(0.0 < self.character_coverage <= 1.0, f"--character-coverage must be in (0, 1], got {self.character_coverage}")
        _check(self.input_sentence_size >= 0, "--input-sentence-size must be >= 0")


@dataclass(frozen=True)
class ModelConfig(_Config):
    vocab_size: int = 8000
    d_model: int = 256
    n_heads: int = 4
    d_ff: int = 1024
    encoder_layers: int = 3
    decoder_layers: int = 3
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    max_positions: int = 1024
    pre_norm: bool = False  # post-norm, as in the paper
    tie_embeddings: bool = True  # one joint vocabulary: source, target and output share weights
    pad_id: int = 0
    bos_id: int = 2
    eos_id: int = 3

    def __post_init__(self):
        _check(self.d_model % self.n_heads == 0, f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        _check(self.encoder_layers >= 1 and self.decoder_layers >= 1, "need at least one encoder and one decoder layer")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            value = getattr(self, name)
            _check(0.0 <= value < 1.0, f"{name} must be in [0, 1), got {value}")
        _check(self.max_positions >= 2, "max_positions must be >= 2")
        _check(self.vocab_size > max(self.pad_id, self.bos_id, self.eos_id), "vocab_size too small for the special ids")


PRESETS: dict[str, dict[str, int]] = {
    "tiny": dict(d_model=128, n_heads=4, d_ff=512, encoder_layers=2, decoder_layers=2),
    "small": dict(d_model=256, n_heads=4, d_ff=1024, encoder_layers=3, decoder_layers=3),
    "base": dict(d_model=512, n_heads=8, d_ff=2048, encoder_layers=6, decoder_layers=6),
    "big": dict(d_model=1024, n_heads=16, d_ff=4096, encoder_layers=6, decoder_layers=6),
}


@dataclass(frozen=True)
class OptimConfig(_Config):
    lr: float = 1e-3  # the peak
    # linear warmup from 0 over N updates (at most 10% of a horizon), or over a share 0 < F < 1 of it
    warmup: float = 1000
    # auto: linear decay to 0 at the horizon when the run has one, else inverse-sqrt (schedule.py)
    lr_schedule: str = "auto"
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-8
    weight_decay: float = 0.0
    clip_norm: float = 1.0  # 0 disables clipping
    label_smoothing: float = 0.1

    def __post_init__(self):
        object.__setattr__(self, "betas", tuple(self.betas))
        _check(self.lr > 0, f"--lr must be > 0, got {self.lr}")
        _check(self.warmup >= 0, f"--warmup must be >= 0 (updates, or a share of the horizon below 1), got {self.warmup}")
        _check(self.warmup < 1 or float(self.warmup).is_integer(),
               f"--warmup is a number of updates or a share of the horizon below 1, got {self.warmup}")
        _check(self.lr_schedule in ("auto", "inverse-sqrt", "linear", "cosine", "wsd"),
               f"--lr-schedule must be auto, inverse-sqrt, linear, cosine or wsd, got {self.lr_schedule!r}")
        _check(self.clip_norm >= 0, "--clip-norm must be >= 0")
        _check(0.0 <= self.label_smoothing < 1.0, f"--label-smoothing must be in [0, 1), got {self.label_smoothing}")


@dataclass(frozen=True)
class TrainConfig(_Config):
    max_tokens: int = 4096  # batch cost = sentences x max(padded source, padded target length)
    max_updates: int = 0  # 0 = no limit
    max_epochs: int = 0
    max_time: float = 0.0  # seconds; 0 = no limit
    validate_interval_updates: int = 0  # 0 = once per epoch only
    log_interval: float = 10.0  # seconds between plain log lines when stderr is not a terminal
    precision: str = "auto"  # auto: bf16 where the GPU or CPU has bf16 arithmetic, fp16 on older GPUs, else fp32 (device.py)
    device: str = "auto"
    seed: int = 1
    threads: int = 0  # 0 = torch's default
    src_lang: str = ""
    tgt_lang: str = ""
    # validation (validate.py): BLEU/chrF by decoding with translate's search, best.pt, early stopping
    eval_bleu: bool = False
    eval_bleu_beam: int = 4
    eval_bleu_lenpen: float = 1.0
    eval_bleu_max_len_a: float = 1.2  # max output length = a * source length + b, as in translate;
    eval_bleu_max_len_b: int = 10  # tighter than translate's default so early validations stay quick
    best_metric: str = "loss"  # loss (lower is better), bleu or chrf (higher is better)
    patience: int = 0  # stop after this many validations without improvement; 0 = never
    # checkpoints (train.py) and logs (metrics.py)
    save_interval_updates: int = 0  # also write last.pt every N updates; 0 = at validations only
    keep_last: int = 0  # keep the newest K update-numbered copies checkpoint_u<N>.pt; 0 = none
    tensorboard_dir: str = ""  # also write TensorBoard scalars here
    update_freq: int = 1  # micro-batches accumulated per update (per rank)
    dist_timeout: float = 600.0  # seconds a rank waits for the others before the job fails (distributed.py)
    compile: bool = False  # torch.compile the model; falls back to eager where it cannot
    # an exponential moving average of the weights (ema.py), validated at the end of the run and
    # kept as best.pt when it is better; 0 = off (the default: with the learning rate decaying to 0
    # at the horizon it never won in 8 measured runs of 4-20 minutes, bench/results.md)
    ema_decay: float = 0.0

    def __post_init__(self):
        _check(self.best_metric in ("loss", "bleu", "chrf"), f"--best-metric must be loss, bleu or chrf, got {self.best_metric!r}")
        _check(self.best_metric == "loss" or self.eval_bleu,
               f"--best-metric {self.best_metric} needs --eval-bleu (validation must decode to score {self.best_metric})")
        _check(self.eval_bleu_beam >= 1, f"--eval-bleu-beam must be >= 1, got {self.eval_bleu_beam}")
        _check(self.eval_bleu_max_len_b >= 1 or self.eval_bleu_max_len_a > 0, "--eval-bleu-max-len-a/-b allow no output token")
        _check(self.patience >= 0, f"--patience must be >= 0, got {self.patience}")
        _check(self.save_interval_updates >= 0 and self.keep_last >= 0, "--save-interval-updates and --keep-last must be >= 0")
        _check(self.keep_last == 0 or self.save_interval_updates > 0,
               "--keep-last keeps the copies written every --save-interval-updates N; give --save-interval-updates too")
        _check(self.max_tokens >= 1, f"--max-tokens must be >= 1, got {self.max_tokens}")
        _check(self.precision in ("auto", "fp32", "bf16", "fp16"), f"--precision must be auto, fp32, bf16 or fp16, got {self.precision!r}")
        _check(self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:"),
               f"--device must be auto, cpu or cuda, got {self.device!r}")
        _check(self.update_freq >= 1, f"--update-freq must be >= 1, got {self.update_freq}")
        _check(self.dist_timeout > 0, f"--dist-timeout must be > 0 seconds, got {self.dist_timeout}")
        _check(self.max_updates >= 0 and self.max_epochs >= 0 and self.max_time >= 0, "limits must be >= 0")
        _check(0.0 <= self.ema_decay < 1.0, f"--ema-decay must be in [0, 1) (0 = off), got {self.ema_decay}")
        _check(0 <= self.seed < 2 ** 32, f"--seed must be between 0 and 2^32 - 1, got {self.seed}")


@dataclass(frozen=True)
class Sampling(_Config):
    """--sampling's shape: draw from softmax(log p / temperature) among the top-k tokens and the
    nucleus of mass top-p; the same seed gives the same samples (search.py)."""
    topk: int = 0  # 0 = the whole vocabulary
    topp: float = 1.0  # nucleus mass; 1.0 = no nucleus truncation
    temperature: float = 1.0
    seed: int = 1

    def __post_init__(self):
        _check(self.topk >= 0, f"--topk must be >= 0 (0 = all tokens), got {self.topk}")
        _check(0.0 < self.topp <= 1.0, f"--topp must be in (0, 1], got {self.topp}")
        _check(self.temperature > 0.0, f"--temperature must be > 0, got {self.temperature}")
        _check(0 <= self.seed < 2 ** 63, f"--seed must be between 0 and 2^63 - 1, got {self.seed}")


@dataclass(frozen=True)
class SearchOptions(_Config):
    """What one request asks of search (search.search takes it; a server takes one per request):
    beam, length penalty, n-best, output length, and sampling instead of search. How the process
    decodes (device, precision, threads, workers, batching, I/O) is DecodeConfig's."""
    beam: int = 5
    lenpen: float = 1.0
    nbest: int = 1
    max_len_a: float = 0.0
    max_len_b: int = 200
    min_len: int = 1
    sampling: Sampling | None = None  # sample nbest translations instead of searching (beam unused)

    def __post_init__(self):
        _check(self.beam >= 1, f"--beam must be >= 1, got {self.beam}")
        if self.sampling is not None:
            _check(self.nbest >= 1, f"--nbest must be >= 1, got {self.nbest}")
        else:
            _check(1 <= self.nbest <= self.beam, f"--nbest must be between 1 and --beam ({self.beam}), got {self.nbest}")
        _check(self.max_len_b >= 1 or self.max_len_a > 0, "--max-len-a/--max-len-b allow no output token")
        _check(self.max_len_a >= 0, f"--max-len-a must be >= 0, got {self.max_len_a}")
        _check(self.min_len >= 0, f"min_len must be >= 0, got {self.min_len}")


@dataclass(frozen=True)
class DecodeConfig(_Config):
    beam: int = 5
    lenpen: float = 1.0
    nbest: int = 1
    max_len_a: float = 0.0
    max_len_b: int = 200
    max_tokens: int = 0  # 0 = only --batch-size limits a batch
    batch_size: int = 64
    print_scores: bool = False
    print_alignment: bool = False  # hard alignment from encoder-decoder attention (alignment.py)
    alignment_layer: int = 0  # 1-based decoder layer for --print-alignment; 0 = the last
    device: str = "auto"
    precision: str = "auto"  # auto (device.py): bf16 on CPUs with bf16 instructions, else fp32; bf16 / fp16 (CUDA): weights cast once, see precision.py
    quantize: str = "none"  # int8: dynamic quantization of the linear layers (CPU)
    threads: int = 0
    workers: int = 1  # CPU decoding processes, batches in parallel, threads / workers threads each (workers.py)
    chunk_lines: int = 2048  # lines read, sorted and batched together
    errors: str = "replace"  # invalid UTF-8 in the input: replace (with a warning) or strict (stop)
    # --sampling: draw nbest samples per line instead of searching (search.py); --beam is unused
    sampling: bool = False
    topk: int = 0  # sample among the k most probable tokens; 0 = all
    topp: float = 1.0  # ... and among the nucleus of this probability mass; 1.0 = all
    temperature: float = 1.0
    seed: int = 1  # same seed, same samples (whatever the batching: see search.py)
    score_reference: bool = False  # score the lines of `target` instead of translating (reference_score.py)
    target: str = ""  # --target FILE: one reference per input line
    target_prefix: str = ""  # --target-prefix FILE: one prefix per input line that its translation starts with ("" none)
    constraints: str = ""  # --constraints FILE: one JSON list of phrases per input line that its translation must contain (terms.py)
    glossary: str = ""  # --glossary FILE.tsv: source term TAB target term(s); a term found in a line constrains its translation
    glossary_ignore_case: bool = False

    def __post_init__(self):
        self.search_options()  # validates the per-request part (beam, nbest, lengths, sampling)
        _check(self.sampling or (self.topk == 0 and self.topp == 1.0 and self.temperature == 1.0),
               "--topk, --topp and --temperature shape --sampling; add --sampling")
        _check(self.score_reference == bool(self.target),
               "--score-reference needs --target FILE (one reference per input line)" if self.score_reference
               else "--target FILE gives the references of --score-reference; add --score-reference")
        _check(not ((self.target_prefix or self.constraints or self.glossary) and self.score_reference),
               "--score-reference scores whole references; drop --target-prefix, --constraints and --glossary")
        _check(not ((self.constraints or self.glossary) and self.sampling), "--constraints and --glossary are kept by beam search; drop --sampling")
        if self.score_reference:
            _check(not self.sampling, "--score-reference scores the given references; drop --sampling")
            _check(self.nbest == 1 and not self.print_alignment,
                   "--score-reference prints one line per input line; drop --nbest and --print-alignment")
        _check(self.batch_size >= 1, "--batch-size must be >= 1")
        _check(self.workers >= 1, f"--workers must be >= 1, got {self.workers}")
        _check(self.threads == 0 or self.threads >= self.workers,
               f"--workers {self.workers} needs at least one thread each; got --threads {self.threads}")
        _check(self.max_tokens >= 0, "--max-tokens must be >= 0")
        _check(self.alignment_layer >= 0, f"--alignment-layer must be >= 0 (0 = the last layer), got {self.alignment_layer}")
        _check(self.precision in ("auto", "fp32", "bf16", "fp16"), f"--precision must be auto, fp32, bf16 or fp16, got {self.precision!r}")
        _check(self.errors in ("strict", "replace"), f"--errors must be strict or replace, got {self.errors!r}")
        _check(self.quantize in ("none", "int8"), f"--quantize must be none or int8, got {self.quantize!r}")
        _check(self.quantize == "none" or self.precision in ("auto", "fp32"),
               f"--quantize {self.quantize} computes in int8/float32; drop --precision {self.precision}")

    def search_options(self) -> SearchOptions:
        """The per-request part of these settings: what search() takes."""
        sampling = Sampling(self.topk, self.topp, self.temperature, self.seed) if self.sampling else None
        return SearchOptions(self.beam, self.lenpen, self.nbest, self.max_len_a, self.max_len_b, sampling=sampling)


@dataclass(frozen=True)
class ServeConfig(_Config):
    """`seqtool serve`'s server settings (the model's are a DecodeConfig)."""
    host: str = "127.0.0.1"
    port: int = 5000
    max_batch_tokens: int = 4096  # source tokens of pending segments decoded in one call
    max_wait_ms: float = 10.0  # the longest the oldest pending segment waits for others to join its batch
    queue_limit: int = 4096  # pending segments; a request that would pass it gets 503 with Retry-After
    request_timeout: float = 60.0  # seconds; then 504 and the request's pending segments are dropped
    max_lines: int = 256  # segments per request (413 beyond)
    max_chars: int = 100_000  # characters per request (413 beyond)
    alignments: bool = False  # answer alignment requests (a forced pass per batch when asked)
    workers: int = 1  # server processes on the port, one model each (servepool.py)

    def __post_init__(self):
        _check(0 <= self.port < 65536, f"--port must be between 0 and 65535, got {self.port}")
        _check(self.max_batch_tokens >= 1, f"--max-batch-tokens must be >= 1, got {self.max_batch_tokens}")
        _check(self.max_wait_ms >= 0, f"--max-wait-ms must be >= 0, got {self.max_wait_ms}")
        _check(self.queue_limit >= 1, f"--queue-limit must be >= 1, got {self.queue_limit}")
        _check(self.request_timeout > 0, f"--request-timeout must be > 0, got {self.request_timeout}")
        _check(self.max_lines >= 1 and self.max_chars >= 1, "--max-lines and --max-chars must be >= 1")
        _check(self.workers >= 1, f"--workers must be >= 1, got {self.workers}")


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
