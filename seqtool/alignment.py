"""Attention weights of a translation, and word alignments derived from them.

Owns fetching the weights for pictures: one teacher-forced pass of the model over a source and a
given target, through the need_weights path of the same MultiHeadAttention modules that translate
(model.encode / model.decode_features), so the weights are exactly what translation used. Also
turns encoder-decoder attention into fairseq-style hard alignments ("i-j": source token i,
target token j). Tensors and token ids only: no text, no files, no drawing (that is plot.py).

Translations' alignments (`translate --print-alignment`, markup and placeholders to place) are
not a second pass: the search records the alignment layer's weights as it decodes and carries
each hypothesis's hard alignment with its tokens (search.py); `pairs` gives them this module's form.

Target positions: the decoder reads `<s> y1 .. yn` and writes `y1 .. yn </s>`; row t of the
encoder-decoder weights is the attention used while writing the t-th output token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from .errors import ConfigError


@dataclass
class AttentionWeights:
    """Per layer, first layer first; H heads. Rows attend to columns; masked entries are exactly 0."""

    encoder: list[Tensor]  # each (B, H, S, S) encoder self-attention
    decoder: list[Tensor]  # each (B, H, T, T) decoder self-attention (zero above the diagonal)
    cross: list[Tensor]  # each (B, H, T, S) encoder-decoder attention (zero on source padding)


@torch.no_grad()
def force_decode(model, src: Tensor, tgt_in: Tensor) -> AttentionWeights:
    """Weights of every attention of the model while it reads src (B, S) and writes after tgt_in (B, T).

    tgt_in starts with BOS; right padding is allowed (its rows are meaningless, its columns are
    never attended to by real rows because of the causal mask).
    """
    memory, src_pad, enc_w = model.encode(src, need_weights=True)  # (B, S, D), (B, S), [(B, H, S, S)]
    _, self_w, cross_w = model.decode_features(tgt_in, memory, src_pad, need_weights=True)
    return AttentionWeights([w.float() for w in enc_w], [w.float() for w in self_w], [w.float() for w in cross_w])


def resolve_layer(layer: int, n_layers: int, option: str = "layer") -> int:
    """A 1-based layer number (0 = the last layer, fairseq's default alignment layer) -> 0-based index."""
    if layer == 0:
        return n_layers - 1
    if not 1 <= layer <= n_layers:
        raise ConfigError(f"{option} {layer}: the model has layers 1 to {n_layers}")
    return layer - 1


def hard_alignment(cross: Tensor, src_len: int, tgt_len: int) -> list[tuple[int, int]]:
    """fairseq's hard alignment: each target token j is aligned to the source token i it attends to most.

    cross (H, T, S): one layer's encoder-decoder weights of one sentence; heads are averaged.
    src_len / tgt_len count real tokens without EOS: EOS and padding are never aligned.
    """
    if src_len == 0 or tgt_len == 0:
        return []
    mean = cross.float().mean(dim=0)[:tgt_len, :src_len]  # (tgt_len, src_len)
    best = mean.argmax(dim=1).tolist()  # (tgt_len,)
    return [(i, j) for j, i in enumerate(best)]


def pairs(links: Sequence[int]) -> list[tuple[int, int]]:
    """A search's alignment (Hypothesis.alignment: the source position of each target token) as
    (source token, target token) pairs, the form hard_alignment gives."""
    return [(i, j) for j, i in enumerate(links)]


def format_alignment(pairs: Sequence[tuple[int, int]]) -> str:
    return " ".join(f"{i}-{j}" for i, j in pairs)
