"""Ensembles: several checkpoints translating as one model.

Owns combining models at decoding time and loading the checkpoints of an ensemble. At every step
the next-token distribution is the mean of the members' probabilities, returned as log-probabilities:
log(1/M sum_m p_m) = logsumexp_m(log p_m) - log M. `Ensemble` offers the decoder interface that
search.py and reference_score.py use (`config`, `encode`, `new_cache`, `decode`, and a cache with
`reorder`), so greedy search, beam search, sampling and reference scoring run an ensemble exactly
as they run one model. Each member keeps its own KV cache; `EnsembleCache.reorder` moves them
all together, so beams and finished sentences stay aligned across members.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch import Tensor

from . import checkpoint, precision
from .config import ModelConfig
from .errors import InputError


class EnsembleCache:
    """One KV cache per member, reordered together."""

    def __init__(self, caches: list):
        self.caches = caches

    @property
    def steps(self) -> int:
        return self.caches[0].steps

    def record(self, layer: int) -> None:
        """Attention weights come from one network: the first member's (KVCache.record)."""
        self.caches[0].record(layer)

    @property
    def attended(self) -> Optional[Tensor]:
        return self.caches[0].attended

    def reorder(self, index: Tensor, cross: bool = True, group: Optional[int] = None) -> None:
        for cache in self.caches:
            cache.reorder(index, cross, group)


class Ensemble:
    """Models with one vocabulary, decoding as one: their probabilities averaged at every position."""

    def __init__(self, models: Sequence, names: Optional[Sequence[str]] = None):
        if not models:
            raise ValueError("an ensemble needs at least one model")
        names = list(names) if names is not None else [f"model {i + 1}" for i in range(len(models))]
        first = models[0].config
        for model, name in zip(models[1:], names[1:]):
            c = model.config
            ours = (c.vocab_size, c.pad_id, c.bos_id, c.eos_id)
            theirs = (first.vocab_size, first.pad_id, first.bos_id, first.eos_id)
            if ours != theirs:
                raise InputError(f"{name}: vocabulary (size, pad, bos, eos) {ours} differs from {names[0]}'s {theirs}; "
                                 "an ensemble's models must share one vocabulary")
        self.models = list(models)
        # The shortest member decides how long inputs and outputs may be.
        self.config: ModelConfig = first.replace(max_positions=min(m.config.max_positions for m in models))
        self.log_m = math.log(len(models))

    def encode(self, src: Tensor) -> tuple[list[Tensor], Tensor]:
        """src (B, S) -> each member's memory [(B, S, D_m)], src_pad (B, S) (the same for all: one pad id)."""
        outputs = [model.encode(src) for model in self.models]
        return [memory for memory, _ in outputs], outputs[0][1]

    def new_cache(self, memory: list[Tensor], src_pad: Tensor, group: int = 1) -> EnsembleCache:
        return EnsembleCache([model.new_cache(m, src_pad, group) for model, m in zip(self.models, memory)])

    def decode(self, tgt_in: Tensor, memory: Optional[list[Tensor]], src_pad: Optional[Tensor],
               cache: Optional[EnsembleCache] = None) -> Tensor:
        """log of the mean of the members' next-token probabilities (B, T, V), float32.

        These are normalised log-probabilities; search applies log_softmax to what `decode`
        returns, which leaves them unchanged (up to rounding)."""
        lprobs = []
        for i, model in enumerate(self.models):
            logits = model.decode(tgt_in, None if memory is None else memory[i], src_pad,
                                  None if cache is None else cache.caches[i])  # (B, T, V)
            lprobs.append(logits.float().log_softmax(dim=-1))
        return torch.logsumexp(torch.stack(lprobs), dim=0) - self.log_m  # (B, T, V)


@dataclass
class Header:
    """A model's settings without its weights (ids, positions): all that the parent of decoding
    workers needs, as it decodes nothing itself."""

    config: ModelConfig


def load_header(paths: Sequence[Path]) -> tuple[Header, bytes, dict]:
    """The first checkpoint's ModelConfig, the tokenizer bytes the checkpoints share (checked as
    load() checks them) and the first one's training configs; no model is built, and each file's
    tensors are dropped as it is read."""
    configs, tokenizer, first = _read(paths, lambda ckpt: ModelConfig.from_dict(ckpt["model_config"]))
    return Header(configs[0]), tokenizer, first


def load(paths: Sequence[Path], device: torch.device, precision_name: str = "fp32", quantize: str = "none"):
    """The model of one checkpoint, or the Ensemble of several, each in its decoding precision;
    and the tokenizer bytes they share. Checkpoints whose tokenizers differ are refused, naming
    both files (their token ids would mean different pieces)."""
    models, tokenizer, configs = _read(paths, lambda ckpt: precision.prepare(checkpoint.load_model(ckpt, device), device, precision_name, quantize))
    if len(models) == 1:
        return models[0], tokenizer, configs
    return Ensemble(models, [str(p) for p in paths]), tokenizer, configs


def _read(paths: Sequence[Path], take) -> tuple[list, bytes, dict]:
    """take(checkpoint) of each file, one checkpoint's tensors in memory at a time, the shared
    tokenizer and the first file's training configs (model, optim, train: its languages);
    checkpoints whose tokenizers differ are refused, naming both files (their token ids would mean
    different pieces)."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise InputError("give at least one --checkpoint")
    out, first, configs = [], b"", {}
    for i, path in enumerate(paths):
        ckpt = checkpoint.load(path)
        ours = checkpoint.tokenizer_bytes(ckpt)
        if i == 0:  # (and the length profile of its training source, for --split-sentences auto)
            first, configs = ours, {**dict(ckpt.get("configs") or {}), "source_lengths": dict(ckpt.get("source_lengths") or {})}
        elif ours != first:
            raise InputError(f"{path}: its tokenizer differs from {paths[0]}'s; the checkpoints of an ensemble must "
                             "share one tokenizer (train them on one DATA_DIR)")
        out.append(take(ckpt))
        del ckpt
    return out, first, configs
