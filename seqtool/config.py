"""Typed configuration for every step of the data path.

Owns the dataclasses that a checkpoint stores (so a model rebuilds from its file alone), their
validation, the model presets, and reading an optional TOML config file. Every config is plain
data: ``to_dict`` gives JSON/TOML-safe values, ``from_dict`` rejects unknown keys.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .fields import _Validated, setting


@dataclass(frozen=True)
class TokenizerConfig(_Validated):
    vocab_size: int = setting(8000, ge=8, lt=2 ** 31, help='Pieces of the tokenizer (raw files: the one train makes).', scope="tokenizer train")
    model_type: str = setting("bpe", "bpe or unigram.", scope="tokenizer")
    character_coverage: float = setting(1.0, gt=0.0, le=1.0, help='Share of characters covered.', scope="tokenizer")
    # sentencepiece keeps a uniform sample of this many lines (seeded), so memory is bounded by the
    # setting, not by the corpus; 0 = every line
    input_sentence_size: int = setting(1_000_000, ge=0, help='The tokenizer trains on a uniform sample of this many lines (0 = all; memory grows with it).', scope="tokenizer train")
    byte_fallback: bool = setting(False, "Unknown characters become bytes, not <unk>.", scope="tokenizer")
    threads: int = setting(2, ge=1, le=1024, help='sentencepiece threads.', scope="tokenizer")
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
    dropout: float = setting(0.1, ge=0.0, lt=1.0, option="--dropout", help='Dropout on embeddings and sublayer outputs.', scope="train")
    attention_dropout: float = setting(0.0, ge=0.0, lt=1.0)
    activation_dropout: float = setting(0.0, ge=0.0, lt=1.0)
    max_positions: int = setting(1024, ge=2, le=2 ** 20)
    pre_norm: bool = setting(False, "Layer norm before each sublayer (pre) or after it (post, the paper's).", option="--pre-norm/--post-norm", scope="train")
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
    lr: float = setting(1e-3, gt=0.0, le=100.0, help='Peak learning rate.', scope="train")  # the peak
    # linear warmup from 0 over N updates (at most 10% of a horizon), or over a share 0 < F < 1 of it
    warmup: float = setting(1000, ge=0, help='Linear warmup: N updates (at most 10% of the horizon), or a share of the horizon below 1 (e.g. 0.05).', scope="train")
    # auto: linear decay to 0 at the horizon when the run has one, else inverse-sqrt (schedule.py)
    lr_schedule: str = setting("auto", "auto (linear decay to 0 at the horizon of --max-updates/--max-epochs/--max-time when there is one, else inverse-sqrt), inverse-sqrt, linear, cosine or wsd (warmup-stable-decay, the last 20%).", scope="train")
    betas: tuple[float, float] = setting((0.9, 0.98), ge=0.0, lt=1.0)
    eps: float = setting(1e-8, gt=0.0, le=1.0)
    weight_decay: float = setting(0.0, ge=0.0, le=100.0)
    clip_norm: float = setting(1.0, ge=0.0, help='Gradient norm clip (0 = off).', scope="train")  # 0 disables clipping
    label_smoothing: float = setting(0.1, ge=0.0, lt=1.0, help="Label smoothing of the loss (the paper's 0.1).", scope="train")

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
    max_tokens: int = setting(4096, ge=1, help='Token budget of a batch: sentences x the longer of its padded source and target.', scope="train")  # batch cost = sentences x max(padded source, padded target length)
    max_updates: int = setting(0, ge=0, help='Stop after N updates (0 = no limit).', scope="train")  # 0 = no limit
    max_epochs: int = setting(0, ge=0, help='Stop after N epochs (0 = no limit).', scope="train")
    max_time: float = setting(0.0, ge=0.0)  # seconds; 0 = no limit
    validate_interval_updates: int = setting(0, ge=0, help='Also validate every N updates (0 = once per epoch).', scope="train")  # 0 = once per epoch only
    log_interval: float = setting(10.0, ge=0.0)  # seconds between plain log lines when stderr is not a terminal
    precision: str = setting("auto", "auto (bf16 on GPUs and CPUs with bfloat16 arithmetic: AVX512-BF16 or AMX; fp16 on older GPUs; else fp32), fp32, bf16 or fp16 (with loss scaling).", scope="train")
    device: str = setting("auto", "auto, cpu, cuda or cuda:N.", scope="train")
    seed: int = setting(1, ge=0, lt=2 ** 32, help='Random seed of initialisation, batches and dropout.', scope="train")
    threads: int = setting(0, ge=0, le=4096, help="CPU threads for torch (0 = torch's default).", scope="train")  # 0 = torch's default
    src_lang: str = setting("", option="--src", help='Source language suffix: reads PREFIX.SRC (or PREFIX.SRC.gz).', scope="train")
    tgt_lang: str = setting("", option="--tgt", help='Target language suffix: reads PREFIX.TGT (or PREFIX.TGT.gz).', scope="train")
    # several --corpus pairs: each pair's share of an epoch is its share of the lines to the power 1/T
    # (languages.temperature_shares; Arivazhagan et al., 2019); one pair ignores it. 1 by measurement
    # (bench/multilingual.py, 2026-12-07, bible es-en + loc en-de, 20 minutes; against two bilingual
    # models of 10 minutes: T=1 -0.22 and -0.04 mean test BLEU, T=2 -2.04, the paper's T=5 -5.19): in
    # a run of about two epochs every share taken from the large pair costs more than the small one
    # wins. T=5 pays where many small pairs train for long.
    lang_temperature: float = setting(1.0, "Several --corpus pairs: each pair's share of an epoch is its share of the lines to the "
                                           "power 1/T (1: as the data is; large: every pair alike).", gt=0.0, le=1e6, option="--lang-temperature", scope="train")
    # validation (validate.py): BLEU/chrF by decoding with translate's search, best.pt, early stopping
    eval_bleu: bool = setting(False, "Validation also decodes the valid set (translate's search) and scores BLEU and chrF.", option="--eval-bleu/--no-eval-bleu", scope="train")
    eval_bleu_beam: int = setting(4, ge=1, le=1024, help='Beam size of --eval-bleu.', scope="train")
    eval_bleu_lenpen: float = setting(1.0, **LENPEN, help='Length penalty of --eval-bleu.', scope="train")
    eval_bleu_max_len_a: float = setting(1.2, **MAX_LEN_A, help="--eval-bleu's max output length = a * source length + b.", scope="train")  # max output length = a * source length + b, as in translate;
    eval_bleu_max_len_b: int = setting(10, **MAX_LEN_B, help="--eval-bleu's max output length = a * source length + b.", scope="train")  # tighter than translate's default so early validations stay quick
    best_metric: str = setting("loss", "What best.pt is best at: loss, bleu or chrf (bleu and chrf need --eval-bleu).", scope="train")
    patience: int = setting(0, ge=0, help='Stop after N validations without improving --best-metric (0 = never).', scope="train")  # stop after this many validations without improvement; 0 = never
    # checkpoints (train.py) and logs (metrics.py)
    save_interval_updates: int = setting(0, ge=0, help='Also write last.pt every N updates (0 = at validations only).', scope="train")  # also write last.pt every N updates; 0 = at validations only
    keep_last: int = setting(0, ge=0, help='Keep the newest K copies checkpoint_u<UPDATES>.pt written every --save-interval-updates.', scope="train")  # keep the newest K update-numbered copies checkpoint_u<N>.pt; 0 = none
    tensorboard_dir: str = setting("", option="--tensorboard", help="Also log to TensorBoard in this directory (pip install 'seqtool[tensorboard]').", scope="train", metavar="DIR")  # also write TensorBoard scalars here
    update_freq: int = setting(1, ge=1, help='Batches of --max-tokens accumulated into one update (per process).', scope="train")  # micro-batches accumulated per update (per rank)
    dist_timeout: float = setting(600.0, gt=0.0, help='Seconds a process waits for the others under torchrun before the job fails.', scope="train")  # seconds a rank waits for the others before the job fails (distributed.py)
    compile: bool = setting(False, "torch.compile the model (eager where it cannot).", option="--compile/--no-compile", scope="train")
    # an exponential moving average of the weights (ema.py), validated at the end of the run and
    # kept as best.pt when it is better; 0 = off (the default: with the learning rate decaying to 0
    # at the horizon it never won in 8 measured runs of 4-20 minutes, bench/results.md)
    ema_decay: float = setting(0.0, ge=0.0, lt=1.0, help='Keep an exponential moving average of the weights with this decay; at the end of the run it becomes best.pt when validation says it is better (0 = off: with --lr-schedule auto it never won in our runs; try 0.999 with inverse-sqrt).', scope="train")

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
    topk: int = setting(0, "Sample among the k most probable tokens (0 = all).", ge=0, lt=2 ** 31, scope="translate request")
    topp: float = setting(1.0, "Sample among the most probable tokens whose mass reaches p (nucleus; 1.0 = all).", gt=0.0, le=1.0, scope="translate request")
    temperature: float = setting(1.0, "Sample from softmax(log p / T): below 1 sharper, above 1 flatter.", gt=0.0, le=1000.0, scope="translate request")
    seed: int = setting(1, "The same seed gives the same samples, whatever the batching.", ge=0, lt=2 ** 63, scope="translate request")


@dataclass(frozen=True)
class SearchOptions(_Validated):
    """What one request asks of search (search.search takes it; a server takes one per request):
    beam, length penalty, n-best, output length, and sampling instead of search. How the process
    decodes (device, precision, threads, workers, batching, I/O) is DecodeConfig's."""
    beam: int = setting(5, "Beam size (1 = greedy).", ge=1, le=1024, scope="translate serve request attention", short="-b")
    lenpen: float = setting(1.0, "Length penalty: score = log-prob / length^lenpen.", **LENPEN, scope="translate serve request attention")
    nbest: int = setting(1, "Hypotheses per segment, best first.", ge=1, le=1024, scope="translate request")
    # fairseq's and CTranslate2's flat 200/256 crop a long source's translation; a = 1 lets every output run
    # b tokens past its source's length (a long line with --split-sentences never, a document's long block)
    max_len_a: float = setting(1.0, "Max output length = a * source length + b.", **MAX_LEN_A, scope="translate serve request")
    max_len_b: int = setting(200, "Max output length = a * source length + b.", **MAX_LEN_B, scope="translate serve request")
    min_len: int = setting(1, "The shortest output in tokens: the end of sentence is barred before it (the length cap still ends an output).",
                           ge=0, le=1_000_000, scope="translate serve request")
    max_len: int = setting(0, "The longest output in tokens, whatever max_len_a and max_len_b say (0: only the model's positions).", ge=0, le=1_000_000)
    sampling: Sampling | None = setting(None, "Draw --nbest random translations per line instead of searching (--beam unused).", scope="translate")
    no_repeat_ngram_size: int = setting(0, "No n-gram of this many tokens appears twice in an output (a target prefix counts); 0 = off.",
                                        ge=0, le=1_000_000, scope="translate serve request")
    loop_guard: int = setting(4, "No phrase of 1 to 8 tokens appears this many times in a row in an output, unless its source has "
                                 "such a run (constraints may still ask for one); 0 = off.", ge=0, le=64, scope="translate serve request")

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
    max_tokens: int = setting(0, "Source-token budget of a batch (0 = only --batch-size limits it).", ge=0, scope="translate")
    batch_size: int = setting(64, "Sentences per batch.", ge=1, scope="translate serve")
    device: str = setting("auto", "auto, cpu, cuda or cuda:N.", scope="translate serve attention")
    precision: str = setting("auto", "auto (bf16 on CPUs with AVX512-BF16/AMX, else fp32), fp32, bf16 or fp16 (CUDA).", scope="translate serve")
    quantize: str = setting("none", "int8: dynamic int8 quantization of the linear layers (CPU).", scope="translate serve")
    threads: int = setting(0, "CPU threads for torch (0 = torch's default).", ge=0, le=4096, scope="translate serve attention")
    workers: int = setting(1, "CPU decoding processes, each on --threads/N threads, decoding batches in parallel: more "
                              "throughput for files (CTranslate2's inter_threads).", ge=1, le=1024, scope="translate")
    chunk_lines: int = setting(2048, ge=1)  # lines read, sorted and batched together
    alignments: bool = False  # hard alignments from encoder-decoder attention with every hypothesis (alignment.py)
    alignment_layer: int = setting(0, "Decoder layer (1-based) whose attention, averaged over heads, gives alignments; 0 = the last.",
                                   ge=0, le=1024, scope="translate")

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
    print_scores: bool = setting(False, "index<TAB>score<TAB>translation.", scope="translate")
    print_alignment: bool = setting(False, "Add a 4th field: source-target token pairs 'i-j' from encoder-decoder attention.", scope="translate")
    errors: str = setting("replace", "Invalid UTF-8: strict (stop) or replace (U+FFFD, with a warning).", scope="translate")
    score_reference: bool = setting(False, "Score the references of --target instead of translating: index<TAB>score<TAB>reference<TAB>sum<TAB>average.", scope="translate")
    target: str = setting("", "With --score-reference: one reference per input line.", scope="translate", metavar="FILE")
    target_prefix: str = setting("", "One prefix per input line (an empty line: none): the translation starts with it and goes on from there.", scope="translate", metavar="FILE")
    constraints: str = setting("", 'One JSON list per input line of phrases its translation must contain; a list inside is "one of these forms" (an empty line: none).', scope="translate", metavar="FILE")
    glossary: str = setting("", "TSV: source term<TAB>target term[<TAB>other forms]; a source term found in a line (whole words) makes its target a constraint.", scope="translate", metavar="FILE")
    glossary_ignore_case: bool = setting(False, "Find --glossary source terms whatever their case.", scope="translate")
    split_sentences: str = setting("auto", "auto: a line holding several sentences that is longer than the model's training "
                                           "lines is translated sentence by sentence and joined back with its own whitespace; "
                                           "always: every line so; never: lines whole.", scope="translate")
    format: str = setting("auto", "auto: html for .html/.htm/.xhtml files, markdown for .md/.markdown, text otherwise "
                                  "(stdin: text); text: one segment per line; html or markdown: the input is one document, "
                                  "the output one document (markup kept, text translated).", scope="translate")
    keep_attributes: bool = setting(False, "html: leave the values of title, alt, placeholder and aria-label untranslated.", scope="translate")
    src_lang: str = setting("", "The input's language: checked against the model's, and for a multilingual model, with "
                                "--tgt-lang, whether the pair was trained (a zero-shot pair is translated, with a warning).", scope="translate")
    tgt_lang: str = setting("", "The language to translate into: required for a model trained into several (it lists them).", scope="translate attention")

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
    host: str = setting("127.0.0.1", "Address to listen on (0.0.0.0: every interface).", scope="serve")
    port: int = setting(5000, "TCP port (0: a free one, logged).", ge=0, le=65535, scope="serve")
    max_batch_tokens: int = setting(4096, "Source tokens of pending segments decoded together.", ge=1, scope="serve")
    max_wait_ms: float = setting(10.0, "The longest the oldest pending segment waits for others to join its batch.", ge=0.0, le=3_600_000.0, scope="serve")
    queue_limit: int = setting(4096, "Pending segments; beyond, requests get 503 with Retry-After (413 for a request larger than it).", ge=1, scope="serve")
    request_timeout: float = setting(60.0, "Seconds before a request gets 504 (its segments are dropped, also from a running batch).", gt=0.0, le=86_400.0, scope="serve")
    max_lines: int = setting(256, "Segments per request (413 beyond).", ge=1, scope="serve")
    max_chars: int = setting(100_000, "Characters per request, segments, prefixes, constraints and glossary together (413 beyond; a body over 8x this plus 64 KiB is refused unread).", ge=1, le=2 ** 30, scope="serve")
    max_beam: int = setting(16, "The largest beam a request may ask for (422 beyond).", ge=1, le=1024, scope="serve")
    max_nbest: int = setting(16, "The most hypotheses or samples per segment a request may ask for (422 beyond).", ge=1, le=1024, scope="serve")
    max_len: int = setting(512, "The longest output in tokens a request may ask for: max_len_b, or max_len_a * source length + max_len_b (422 beyond).", ge=1, le=1_000_000, scope="serve")
    max_glossary: int = setting(1000, "Glossary entries per request (413 beyond).", ge=0, scope="serve")
    max_constraints: int = setting(64, "Constraint phrases per segment, its glossary matches included (413 beyond).", ge=0, scope="serve")
    api_keys: str = setting("", "A file of API keys, one per line (# comments): each request needs one, as api_key or Authorization: Bearer (403 otherwise).", scope="serve", metavar="FILE")
    req_limit: int = setting(0, "Requests per minute per API key (or client address without --api-keys); 429 with Retry-After beyond; 0 = no limit.", ge=0, scope="serve")
    cors: str = setting("", "Origins allowed to call the API from a browser, comma-separated (* any); none by default.")
    alignments: bool = setting(False, "Answer alignment requests of /v1/translate.", scope="serve")
    workers: int = setting(1, "Server processes on the port, one model each (threads split among them).", ge=1, le=1024, scope="serve")
    header_timeout: float = setting(10.0, "Seconds a client has to send a request's head once connected (or after its last answer); 408 and closed beyond.", gt=0.0, le=3600.0, scope="serve")
    body_timeout: float = setting(30.0, "Seconds a client has to send a request's body after its head; 408 and closed beyond.", gt=0.0, le=3600.0, scope="serve")
    keep_alive_timeout: float = setting(5.0, "Seconds an idle kept-alive connection stays open.", gt=0.0, le=3600.0, scope="serve")
    max_connections: int = setting(1000, "Open connections per server process (within the descriptor limit); a new one past it closes the longest-idle or slowest one, else gets 503.", ge=1, le=1_000_000, scope="serve")



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
