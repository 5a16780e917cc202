"""Validation during training: the numbers that pick best.pt and stop a run early.

Owns one validation pass over the valid split: the label-smoothed loss and NLL per target token
(the training objective) and, with --eval-bleu, BLEU and chrF of the validation set decoded with
the very search `seqtool translate` uses (translate.Translator on the in-memory model, in float32
as translate runs by default), detokenized and scored by sacrebleu against the detokenized
references. Also owns early stopping: which value is "best" for --best-metric loss|bleu|chrf,
and how many validations passed without improving it (--patience). That state lives in the
trainer's progress dict, so last.pt carries it and a resumed run continues the count.

Validation draws no random numbers, so it never changes the course of training (exact resume).
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Optional, Protocol

import torch

from ..checkpoint import TrainingState
from ..config import DecodeConfig, ModelConfig, SearchOptions, TrainConfig
from ..data import ParallelDataset, collate, epoch_batches, tagged
from .loss import label_smoothed_nll
from ..score import score_lines
from ..tokenizer import Tokenizer


@dataclass
class ValidResult:
    loss: float  # label-smoothed cross-entropy per target token (nats); nan without a valid split
    nll: float  # plain negative log-likelihood per target token (nats)
    bleu: Optional[float] = None  # with --eval-bleu
    chrf: Optional[float] = None
    hypotheses: Optional[list[str]] = None  # detokenized, in valid-split order
    seconds: float = 0.0
    pairs: Optional[dict[str, "ValidResult"]] = None  # a multilingual run: each pair's (this result is their mean)

    @property
    def ppl(self) -> float:
        return math.exp(min(self.nll, 50)) if not math.isnan(self.nll) else float("nan")

    def value(self, metric: str) -> float:
        """The value of --best-metric in this result (nan when it was not measured)."""
        value = {"loss": self.loss, "bleu": self.bleu, "chrf": self.chrf}[metric]
        return float("nan") if value is None else float(value)


class Share(Protocol):
    """This process's part of a validation run by several (distributed.Group is one)."""

    rank: int
    world_size: int

    def sum_floats(self, values: list[float]) -> list[float]: ...

    def all_gather(self, value: Any) -> list: ...


@torch.no_grad()
def valid_loss(model, dataset: ParallelDataset, config: ModelConfig, max_tokens: int, label_smoothing: float,
               device: torch.device, autocast: Callable[[], ContextManager] = nullcontext,
               share: Optional[Share] = None) -> tuple[float, float]:
    """Label-smoothed loss and NLL per target token on `dataset`, batched as training batches are
    (pairs longer than the model's positions are left out, as in training). With `share`, each
    process computes every world_size-th batch and the sums are added up: every process gets the
    same figures, for a 1/world_size share of the work."""
    was_training = model.training
    model.eval()
    batches, _ = epoch_batches(dataset, max_tokens, config.max_positions, 0, 0, shuffle=False)
    if share is not None:
        batches = batches[share.rank::share.world_size]
    total_loss = total_nll = 0.0
    total_n = 0
    try:
        for ids in batches:
            b = collate(dataset, ids, config.pad_id, config.bos_id, config.eos_id, config.max_positions)
            with autocast():
                memory, src_pad = model.encode(b.src.to(device))  # (B, S, d), (B, S)
                feats = model.decode_features(b.tgt_in.to(device), memory, src_pad)  # (B, T, d)
                loss, nll, n = label_smoothed_nll(feats, model.output, b.tgt_out.to(device), config.pad_id, label_smoothing)
            total_loss += float(loss)
            total_nll += float(nll)
            total_n += n
    finally:
        model.train(was_training)
    if share is not None:
        total_loss, total_nll, total_n = share.sum_floats([total_loss, total_nll, float(total_n)])
    return total_loss / max(total_n, 1), total_nll / max(total_n, 1)


def search_options(cfg: TrainConfig) -> SearchOptions:
    """The `seqtool translate` search that reproduces --eval-bleu's hypotheses:
    `--beam B --lenpen L --max-len-a A --max-len-b N` (and translate's other defaults)."""
    return SearchOptions(beam=cfg.eval_bleu_beam, lenpen=cfg.eval_bleu_lenpen, max_len_a=cfg.eval_bleu_max_len_a,
                         max_len_b=cfg.eval_bleu_max_len_b)


def decode(model, tokenizer: Tokenizer, dataset: ParallelDataset, options: SearchOptions, device: torch.device,
           share: Optional[Share] = None, tag: Optional[int] = None) -> list[str]:
    """Translations of the valid split's source side, in split order, by translate.Translator (the
    model's own weights, fp32): the same cropping, length-sorted batching per chunk, search and
    detokenization as `seqtool translate` on the detokenized source file. With `share`, each
    process translates every world_size-th chunk (each exactly as translate would) and all get
    every translation. tag: the target-language tag put in front of each source (a multilingual model)."""
    from .. import pipeline
    from ..translate import Translator

    model = getattr(model, "module", model)  # DistributedDataParallel
    model = getattr(model, "_orig_mod", model)  # torch.compile
    was_training = model.training
    model.eval()
    try:
        translator = Translator(model, tokenizer, DecodeConfig(precision="fp32"), device, options=options)
        chunks: dict[int, list[str]] = {}
        n, size = len(dataset), translator.config.chunk_lines
        starts = range(0, n, size)  # translate's chunks: sorting and batching happen per chunk
        for start in starts[share.rank::share.world_size] if share is not None else starts:
            ids = [dataset.src[i].tolist() for i in range(start, min(start + size, n))]
            lines = [tokenizer.decode(seq) for seq in ids]
            segments = [pipeline.Segment(start + k, line, seq, origin=origin, tag=tag)
                        for k, (line, seq, origin) in enumerate(zip(lines, ids, pipeline.lines(start, lines, "valid line")))]
            chunks[start] = [t.texts[0].replace("\n", " ") if t.texts else "" for t in pipeline.run(translator, segments, options)]
    finally:
        model.train(was_training)
    if share is not None:
        chunks = {start: texts for part in share.all_gather(chunks) for start, texts in part.items()}
    return [text for start in starts for text in chunks[start]]  # as translate writes them, in split order


def references(tokenizer: Tokenizer, dataset: ParallelDataset) -> list[str]:
    """The detokenized target side of the valid split (what a test set's reference file holds)."""
    return [tokenizer.decode(dataset.tgt[i].tolist()) for i in range(len(dataset))]


def evaluate(model, dataset: ParallelDataset, tokenizer: Tokenizer, model_config: ModelConfig, cfg: TrainConfig,
             label_smoothing: float, device: torch.device,
             autocast: Callable[[], ContextManager] = nullcontext, share: Optional[Share] = None,
             tag: Optional[int] = None) -> ValidResult:
    """One validation: loss and NLL, and with cfg.eval_bleu also BLEU/chrF of decoded hypotheses.
    With `share` (several training processes) the work is split and every process gets the same result.
    tag: each source's target-language tag (one pair of a multilingual run)."""
    t0 = time.monotonic()
    led = dataset if tag is None else tagged(dataset, tag)
    loss, nll = valid_loss(model, led, model_config, cfg.max_tokens, label_smoothing, device, autocast, share)
    result = ValidResult(loss, nll)
    if cfg.eval_bleu:
        hyps = decode(model, tokenizer, dataset, search_options(cfg), device, share, tag)
        bleu, chrf = score_lines(hyps, [references(tokenizer, dataset)], ("bleu", "chrf"))
        result.bleu, result.chrf, result.hypotheses = bleu.score, chrf.score, hyps
    result.seconds = time.monotonic() - t0
    return result


def mean(results: dict[str, ValidResult]) -> ValidResult:
    """A multilingual run's validation: the mean of its pairs' figures (what picks best.pt), with each pair's."""
    values = list(results.values())

    def avg(name: str) -> Optional[float]:
        xs = [getattr(r, name) for r in values]
        return None if any(x is None for x in xs) else sum(xs) / len(xs)

    return ValidResult(avg("loss"), avg("nll"), avg("bleu"), avg("chrf"), seconds=sum(r.seconds for r in values),
                       pairs=results)


def pair_figures(result: ValidResult) -> Optional[dict]:
    """Each pair's figures for metrics.jsonl (None for a one-pair run)."""
    if not result.pairs:
        return None
    return {pair: {"loss": r.loss, "ppl": r.ppl, "bleu": r.bleu, "chrf": r.chrf} for pair, r in result.pairs.items()}


class EarlyStopping:
    """Best value of --best-metric and validations without improving it, kept in the run's
    TrainingState (saved in last.pt): best_metric_value, bad_validations and best_valid_loss."""

    def __init__(self, metric: str, patience: int, state: TrainingState):
        self.metric, self.patience, self.state = metric, patience, state
        self.higher_is_better = metric != "loss"
        if state.best_metric_value is None:
            state.best_metric_value = -math.inf if self.higher_is_better else math.inf

    @property
    def best(self) -> float:
        return self.state.best_metric_value

    def beats_best(self, result: ValidResult) -> bool:
        """Whether `result` is better than the best so far (nothing recorded)."""
        value = result.value(self.metric)
        return value > self.best if self.higher_is_better else value < self.best

    def update(self, result: ValidResult) -> bool:
        """Record one validation; True when it improved the best value (a nan never does)."""
        if result.loss < self.state.best_valid_loss:
            self.state.best_valid_loss = result.loss
        improved = self.beats_best(result)
        if improved:
            self.state.best_metric_value = result.value(self.metric)
            self.state.bad_validations = 0
        else:
            self.state.bad_validations += 1
        return improved

    @property
    def should_stop(self) -> bool:
        return bool(self.patience) and self.state.bad_validations >= self.patience


def summary_line(result: ValidResult, update: int, stopping: EarlyStopping) -> str:
    """The `valid | ...` log line: loss and ppl, bleu/chrf when measured, the best so far."""
    parts = [f"valid | update {update} | loss {result.loss:.3f} | ppl {result.ppl:.2f}"]
    if result.bleu is not None:
        parts.append(f"bleu {result.bleu:.2f} | chrf {result.chrf:.2f}")
    best = stopping.best
    parts.append(f"best {stopping.metric} {best:.3f}" if math.isfinite(best) else f"best {stopping.metric} -")
    if stopping.patience:
        parts.append(f"{stopping.state.bad_validations}/{stopping.patience} without improvement")
    for pair, r in (result.pairs or {}).items():
        parts.append(f"{pair} loss {r.loss:.3f}" + (f" bleu {r.bleu:.2f}" if r.bleu is not None else ""))
    parts.append(f"{result.seconds:.1f}s")
    return " | ".join(parts)
