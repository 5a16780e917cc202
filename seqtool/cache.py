"""The decoder's cache for incremental decoding: what each decoding step keeps of the steps before.

Shapes: B rows (sentences x group), H heads, S source length, K = D / H per head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor


@dataclass
class KVCache:
    """Per decoder layer: self-attention keys/values so far, and the encoder's projected keys/values.

    Rows are decoder rows: sentences x `group` (beams, or samples), a sentence's rows adjacent.
    The cross-attention keys/values are kept once per sentence, not once per row: a sentence's
    beams attend to them as one group of queries, so each step reads them once instead of
    `group` times. `reorder(index, group=G)` regroups: beam search decodes its first step with one
    row per sentence (every beam starts from the same BOS) and then makes G rows of each.

    The self-attention keys/values of a layer are a view (B, H, capacity, K) into a flat buffer,
    positions [:steps] filled; a step writes its position in place (no torch.cat copy of the
    whole history per step). `reorder(index)` keeps row index[i] as row i: beam search calls it
    every step with the parent of each surviving hypothesis, and with a shorter index when
    finished sentences leave the batch (then `cross=True`, as the sentences change too).

    The self-attention rows are gathered lazily: reorder only records the index (composing it
    with one not yet applied), and each layer gathers its own keys/values at its next `append`,
    right before its attention reads them. The gathered copy (megabytes per layer) is then still
    in the CPU's caches when the matrix products read it; gathering every layer at once, as
    reorder did before, left them to come back from memory (int8 beam search, interleaved A/Bs
    on the noisy 2-core benchmark machine: +8% to +18% in the median). The gather goes into a
    second flat buffer (the two swap roles, so no step allocates) laid out with capacity
    steps + 1, exactly what the next step fills: attention then reads whole contiguous
    (B, H, t, K) blocks, which CPU batched matmul reads about 2x faster than views with spare
    capacity in between (measured at 320 rows, 30 positions). Without reorders (greedy), a full
    buffer grows by GROW positions. An index that splits a sentence's group (a sample that ends
    before its siblings) turns the cross keys/values into one copy per row (group 1).
    """

    cross_k: list[Tensor] = field(default_factory=list)  # each (B / group, H, S, K)
    cross_v: list[Tensor] = field(default_factory=list)
    src_pad: Optional[Tensor] = None  # (B / group, S) True at padding
    group: int = 1  # decoder rows per sentence
    dtype: Optional[torch.dtype] = None  # of the stored keys/values (see Transformer.new_cache)
    steps: int = 0  # target positions already consumed
    self_k: list[Tensor] = field(default_factory=list)  # each (B, H, capacity, K), a view into flat_k
    self_v: list[Tensor] = field(default_factory=list)
    flat_k: list[Tensor] = field(default_factory=list)  # 1-D storage behind self_k
    flat_v: list[Tensor] = field(default_factory=list)
    spare_k: list[Tensor] = field(default_factory=list)  # 1-D storage that reorder gathers into
    spare_v: list[Tensor] = field(default_factory=list)
    pending: Optional[Tensor] = None  # a reorder not yet applied to the self-attention keys/values
    unsettled: list[int] = field(default_factory=list)  # layers it has not been applied to
    key_bias: Optional[Tensor] = None  # (B / group * H, 1, S) 0 or -inf at padding; see padding_bias
    align_layer: Optional[int] = None  # the decoder layer (0-based) whose cross-attention `attended` follows
    align_bias: Optional[Tensor] = None  # (B / group, S) 0 at the source's tokens, -inf at its EOS and padding
    attended: Optional[Tensor] = None  # (B, T) per row and new position, the source token that layer attended to most

    GROW = 32  # positions added when a buffer is full: at most 32 unused positions per row

    @staticmethod
    def _view(flat: Tensor, shape: tuple[int, ...]) -> tuple[Tensor, Tensor]:
        """`shape` viewed over the front of `flat`, which is replaced by a larger one if too small."""
        n = math.prod(shape)
        if flat.numel() < n:
            flat = flat.new_empty(n + n // 4)  # room for a few more positions before the next allocation
        return flat, flat[:n].view(shape)

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store the new positions' keys/values (B, H, T, K); return all so far (B, H, steps + T, K)."""
        B, H, T, K = k.shape
        t = self.steps
        if self.pending is not None and layer in self.unsettled:
            self._settle(layer)
        if layer == len(self.self_k):  # first call for this layer
            empty = k.new_empty(0, dtype=self.dtype or k.dtype)
            for flats, views in ((self.flat_k, self.self_k), (self.flat_v, self.self_v)):
                flat, view = self._view(empty, (B, H, t + T + self.GROW, K))
                flats.append(flat)
                views.append(view)
            self.spare_k.append(empty)
            self.spare_v.append(empty)
        elif t + T > self.self_k[layer].size(2):  # full: copy into a larger buffer
            for flats, views, spares in ((self.flat_k, self.self_k, self.spare_k), (self.flat_v, self.self_v, self.spare_v)):
                old = views[layer]
                spare, view = self._view(spares[layer], (B, H, t + T + self.GROW, K))
                view[:, :, :t] = old[:, :, :t]
                spares[layer], flats[layer], views[layer] = flats[layer], spare, view
        kb, vb = self.self_k[layer], self.self_v[layer]
        kb[:, :, t : t + T] = k  # (cast to the cache's dtype)
        vb[:, :, t : t + T] = v
        return kb[:, :, : t + T], vb[:, :, : t + T]

    def record(self, layer: int) -> None:
        """At every decoder call, keep in `attended` which source token decoder layer `layer`'s
        encoder-decoder attention, summed over heads, weighted most for each row and new position,
        EOS and padding never (fairseq's hard alignment): the weights the search itself used
        (search.py's alignments). Rows are right-padded sources ending in EOS (src_pad)."""
        self.align_layer = layer
        eos = (~self.src_pad).sum(1, keepdim=True) - 1  # (B / group, 1) the EOS's position
        bias = torch.zeros(self.src_pad.shape, dtype=torch.float32, device=self.src_pad.device)
        self.align_bias = bias.masked_fill_(self.src_pad, float("-inf")).scatter_(1, eos, float("-inf"))

    def keep_attended(self, weights: Tensor, rows: int, group: int) -> None:
        """weights (B / G, H, G*T, S) of the recorded layer (G rows of a sentence sharing its source,
        grouped as attention computes them) -> attended (B, T), B = rows."""
        best = (weights.float().sum(1) + self.align_bias[:, None, :]).argmax(dim=-1)  # (B / G, G*T)
        self.attended = best.view(rows, -1)

    def reorder(self, index: Tensor, cross: bool = True, group: Optional[int] = None) -> None:
        if self.self_k:  # gathered lazily, layer by layer, by the next append (see the class docstring)
            self.pending = index if self.pending is None else self.pending.index_select(0, index)
            self.unsettled = list(range(len(self.self_k)))
        if cross:
            self._reorder_cross(index, group or self.group)

    def _settle(self, layer: int) -> None:
        """Apply the pending reorder to one layer's keys/values, into a buffer with room for the next step."""
        index, t = self.pending, self.steps
        n = index.numel()
        for flats, views, spares in ((self.flat_k, self.self_k, self.spare_k), (self.flat_v, self.self_v, self.spare_v)):
            src = views[layer]
            spare, dst = self._view(spares[layer], (n, src.size(1), t + 1, src.size(3)))  # room for the next step
            torch.index_select(src[:, :, :t], 0, index, out=dst[:, :, :t])
            spares[layer], flats[layer], views[layer] = flats[layer], spare, dst
        self.unsettled.remove(layer)
        if not self.unsettled:
            self.pending = None

    def padding_bias(self, heads: int) -> Optional[Tensor]:
        """(B / group * heads, 1, S): 0 where the source may be attended, -inf at its padding; added
        to the cross-attention scores of a decoding step. Built once per set of sentences instead
        of a mask per layer and step."""
        if self.src_pad is None:
            return None
        if self.key_bias is None:
            bias = torch.zeros(self.src_pad.shape, dtype=self.dtype, device=self.src_pad.device)
            self.key_bias = bias.masked_fill_(self.src_pad, float("-inf"))[:, None, :].repeat_interleave(heads, dim=0)
        return self.key_bias

    def _reorder_cross(self, index: Tensor, group: int) -> None:
        """Cross keys/values for the new rows, one copy per `group` new rows when each such group
        comes from one sentence (beam search's first step turns 1 row per sentence into `group`)."""
        sentence = index // self.group  # (n,) the sentence each new row belongs to
        self.group = group
        if group > 1:
            whole = index.numel() % group == 0 and bool((sentence.view(-1, group) == sentence.view(-1, group)[:, :1]).all())
            if whole:  # every new group of rows comes from one sentence: keep one copy per sentence
                sentence = sentence.view(-1, group)[:, 0]
            else:  # rows leave one at a time: one copy of the cross keys/values per row from now on
                self.group = 1
        self.cross_k = [k.index_select(0, sentence) for k in self.cross_k]
        self.cross_v = [v.index_select(0, sentence) for v in self.cross_v]
        if self.src_pad is not None:
            self.src_pad = self.src_pad.index_select(0, sentence)
        if self.align_bias is not None:
            self.align_bias = self.align_bias.index_select(0, sentence)
        self.key_bias = None
