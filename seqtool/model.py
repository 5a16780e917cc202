"""The Transformer of "Attention Is All You Need", and the cache that makes decoding incremental.

Owns the network only: token ids in, logits out. It never sees text or files.

Shapes: B batch, S source length, T target length, D d_model, H heads, K = D / H per head,
V vocabulary. Surface (as the Annotated Transformer's):

    memory, src_pad = model.encode(src)                       # (B, S, D), (B, S)
    logits = model.decode(tgt_in, memory, src_pad)            # (B, T, V) teacher forcing
    cache = model.new_cache(memory, src_pad, group=beam)      # cross-attention K/V projected once
    logits = model.decode(tgt_in[:, -1:], memory, src_pad, cache=cache)   # one new position
    cache.reorder(index)                                      # beams moved / finished rows dropped
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig
from .kernels import dropout, linear, linear_relu, residual_dropout
from .cache import KVCache


def padded(rows: list[list[int]], pad_id: int, device: Optional[torch.device] = None) -> Tensor:
    """Token rows (each already with its BOS/EOS) as one right-padded (B, max length) tensor: how
    every batch the model takes is laid out (search's sources, forced decoding's targets)."""
    return nn.utils.rnn.pad_sequence([torch.tensor(r, dtype=torch.long) for r in rows], batch_first=True,
                                     padding_value=pad_id).to(device)


def sinusoidal_positions(n: int, d: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...), as in the paper."""
    position = torch.arange(n, dtype=torch.float32)[:, None]  # (n, 1)
    div = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))  # (d/2,)
    pe = torch.zeros(n, d)
    pe[:, 0::2] = torch.sin(position * div)
    pe[:, 1::2] = torch.cos(position * div)[:, : d // 2]
    return pe


class MultiHeadAttention(nn.Module):
    """softmax(Q K^T / sqrt(K)) V per head; heads concatenated and projected by W^O.

    forward = project -> attend -> merge heads. attention_path() picks how attention is computed (three
    equal computations, each the fastest where it is chosen). need_weights=True also returns the
    weights (B, H, Tq, Tk): the same projections, so pictures show what translation used.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float, cross: bool):
        super().__init__()
        self.h, self.k = n_heads, d_model // n_heads
        self.dropout = dropout
        self.cross = cross
        if cross:  # queries from the decoder, keys and values from the encoder output
            self.q_proj = nn.Linear(d_model, d_model)
            self.kv_proj = nn.Linear(d_model, 2 * d_model)
        else:  # one matrix product for Q, K and V
            self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def _heads(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.h, self.k).transpose(1, 2)  # (B, H, T, K)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        k, v = linear(memory, self.kv_proj).chunk(2, dim=-1)  # (B, S, D) each
        return self._heads(k), self._heads(v)

    def forward(
        self,
        x: Tensor,  # (B, T, D) queries (and keys/values for self-attention)
        memory: Optional[Tensor] = None,  # (B, S, D) encoder output, cross-attention only
        key_pad: Optional[Tensor] = None,  # (B, Tk) True at padding
        causal: bool = False,
        cache: Optional[KVCache] = None,
        layer: int = 0,
        need_weights: bool = False,
    ) -> tuple[Tensor, Optional[Tensor]]:
        B, T, D = x.shape
        q, k, v, G = self._project(x, memory, cache, layer)  # (B/G, H, G*T, K), (B/G, H, Tk, K) x 2
        path = self.attention_path(x, q.dtype, cache, need_weights)
        record = self.cross and cache is not None and cache.align_layer == layer  # the search keeps these weights
        if path == "step":
            out, probs = self._step_attention(q, k, v, cache.padding_bias(self.h) if self.cross else None)
            if record:
                cache.keep_attended(probs.view(B // G, self.h, G * T, -1), B, G)
            return self._merge_heads(out.to(x.dtype), B, T, G), None
        if record and path == "sdpa":
            path = "explicit"  # (SDPA gives no weights)
        out, weights = self._attend(q, k, v, key_pad, causal, explicit=path == "explicit", need_weights=need_weights or record)
        if path == "explicit":
            out = out.to(x.dtype)  # (float32 from a CPU decoding cache)
        if record:
            cache.keep_attended(weights, B, G)  # (still grouped)
        if G > 1 and weights is not None:
            weights = self._ungroup(weights, B, T, G)
        return self._merge_heads(out, B, T, G), weights if need_weights else None

    def _project(self, x: Tensor, memory: Optional[Tensor], cache: Optional[KVCache], layer: int):
        """Queries, keys and values by head, and G: the decoder rows per sentence that share one copy of
        the encoder's keys/values (their G*T queries then make one attention call)."""
        B, T, _ = x.shape
        G = 1
        if self.cross:
            q = self._heads(linear(x, self.q_proj))  # (B, H, T, K)
            if cache is None:
                return (q, *self.project_kv(memory), G)
            k, v = cache.cross_k[layer], cache.cross_v[layer]  # projected once per sentence by new_cache(): (B/G, H, S, K)
            G = cache.group
            if G > 1:
                q = q.view(B // G, G, self.h, T, self.k).transpose(1, 2).reshape(B // G, self.h, G * T, self.k)
            return q, k, v, G
        q, k, v = (self._heads(t) for t in linear(x, self.qkv_proj).chunk(3, dim=-1))  # (B, H, T, K)
        if cache is not None:
            k, v = cache.append(layer, k, v)  # (B, H, t+T, K)
        return q, k, v, G

    def attention_path(self, x: Tensor, dtype: torch.dtype, cache: Optional[KVCache], need_weights: bool) -> str:
        """Which of three computations of the same attention runs (each measured where it is chosen):

        - "step": a cached decoding step on CPU (one new query per row, or cross-attention): three
          batched products with the cache's additive padding bias, no mask built (_step_attention);
        - "explicit": softmax(QK^T/sqrt(K))V as plain matmuls, when the weights are wanted, for the
          rest of CPU decoding (2-3x faster there than SDPA's CPU kernel, built for long query
          blocks), for bf16 training on CPU (SDPA's CPU kernel, forward + backward, measured 2x
          slower for sentence-length sequences: 15 vs 7 ms per call at B=128, T=32), and for all
          encoding on CPU: SDPA's kernel walks the keys in blocks, so a sentence's encoding changed
          with the padded length of its batch (in bf16 the beam results differed for 2-8% of lines
          between batch compositions, bench/serve.py; in fp32 the scores' last bits). These
          matmuls give the same rows whatever the padding, at the same speed (800 lines, beam 5:
          bf16 6.10-6.24 s against 6.07-6.20 s, fp32 7.95-7.99 s against 8.08-8.10 s);
        - "sdpa": F.scaled_dot_product_attention (flash / memory-efficient kernels on GPUs; fp32
          training on CPU, where it is as fast as the matmuls or faster).
        """
        cpu = x.device.type == "cpu"
        T = x.size(1)
        if cache is not None and cpu and not (need_weights or self.training) and (self.cross or T == 1):
            return "step"
        if need_weights or (cpu and (cache is not None or not self.training or dtype == torch.bfloat16)):
            return "explicit"
        return "sdpa"

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, key_pad: Optional[Tensor], causal: bool, explicit: bool,
                need_weights: bool) -> tuple[Tensor, Optional[Tensor]]:
        """softmax(Q K^T / sqrt(K)) V with padding and (for self-attention) causal masking; the weights
        (B, H, Tq, Tk) too when asked for. q (B, H, Tq, K), k and v (B, H, Tk, K)."""
        T, Tk = q.size(2), k.size(2)
        allowed = None  # True = may attend, broadcast to (B, H, T, Tk)
        if key_pad is not None:
            allowed = ~key_pad[:, None, None, :]  # (B, 1, 1, Tk)
        if causal and T == 1:
            causal = False  # the newest position may see every earlier one
        elif causal and (Tk != T or explicit or allowed is not None):
            # SDPA's is_causal aligns the mask top-left; queries that follow cached keys need it
            # bottom-right: query i sees keys up to Tk - T + i.
            future_ok = torch.ones(T, Tk, dtype=torch.bool, device=q.device).tril(Tk - T)  # (T, Tk)
            allowed = future_ok if allowed is None else allowed & future_ok
            causal = False
        p = self.dropout if self.training else 0.0
        if not explicit:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=p, is_causal=causal), None
        q = q.to(k.dtype)  # a CPU decoding cache holds float32 keys/values
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.k)  # (B, H, T, Tk)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        probs = scores.softmax(dim=-1)  # (bf16 scores: torch's softmax sums in float32 inside)
        return dropout(probs, p, self.training) @ v, (probs if need_weights else None)  # (B, H, Tq, K)

    def _ungroup(self, y: Tensor, B: int, T: int, G: int) -> Tensor:
        """(B/G, H, G*T, .) back to one row per hypothesis (B, H, T, .)."""
        return y.view(B // G, self.h, G, T, -1).transpose(1, 2).reshape(B, self.h, T, -1)

    def _merge_heads(self, out: Tensor, B: int, T: int, G: int) -> Tensor:
        """Attention output (B, H, T, K) (grouped: (B/G, H, G*T, K)) -> heads concatenated and
        projected by W^O (B, T, D)."""
        if G > 1:  # (B/G, H, G, T, K) -> (B/G, G, T, H, K): one copy
            out = out.view(B // G, self.h, G, T, self.k).permute(0, 2, 3, 1, 4)
        else:
            out = out.transpose(1, 2)
        return linear(out.reshape(B, T, self.h * self.k), self.out_proj)

    def _step_attention(self, q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor]) -> tuple[Tensor, Tensor]:
        """The explicit path's attention for a cached decoding step on CPU, in three batched
        products over (rows x heads): scores scaled and (cross-attention) padding-masked by one
        baddbmm with the cache's additive bias, softmax, weighted values. The same numbers without
        building a mask, dividing and masking in separate passes, per layer and step.
        q (N, H, Tq, K), k and v (N, H, Tk, K), bias (N * H, 1, Tk) or None -> (N, H, Tq, K) and the
        weights (N * H, Tq, Tk)."""
        N, H, Tq, K = q.shape
        Tk = k.size(2)
        q3 = q.to(k.dtype).reshape(N * H, Tq, K)
        kt = k.reshape(N * H, Tk, K).transpose(1, 2)  # (N*H, K, Tk), a view
        if bias is None:
            scores = torch.bmm(q3, kt).div_(math.sqrt(K))  # (N*H, Tq, Tk)
        else:
            scores = torch.baddbmm(bias, q3, kt, alpha=1 / math.sqrt(K))
        probs = scores.softmax(dim=-1)
        return torch.bmm(probs, v.reshape(N * H, Tk, K)).view(N, H, Tq, K), probs


class FeedForward(nn.Module):
    """fc2(act(fc1(x))): relu as in the paper (one fused kernel where kernels.py has one), or an
    imported model's gelu or swish."""

    def __init__(self, d_model: int, d_ff: int, activation_dropout: float, activation: str = "relu"):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.activation_dropout = activation_dropout
        self.activation = activation

    def forward(self, x: Tensor) -> Tensor:
        if self.activation == "relu":
            h = linear_relu(x, self.fc1)  # (B, T, F)
        else:
            h = (F.gelu if self.activation == "gelu" else F.silu)(linear(x, self.fc1))
        return linear(dropout(h, self.activation_dropout, self.training), self.fc2)


class SubLayer(nn.Module):
    """Residual connection + layer norm around a sub-layer: post-norm LN(x + f(x)) as in the
    paper, or pre-norm x + f(LN(x)), which trains deep stacks more stably."""

    def __init__(self, d_model: int, dropout: float, pre_norm: bool):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = dropout
        self.pre_norm = pre_norm

    def forward(self, x: Tensor, f) -> tuple[Tensor, Optional[Tensor]]:
        y, weights = f(self.norm(x) if self.pre_norm else x)
        x = residual_dropout(x, y, self.dropout, self.training)
        return (x if self.pre_norm else self.norm(x)), weights


class EncoderLayer(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(c.d_model, c.n_heads, c.attention_dropout, cross=False)
        self.ffn = FeedForward(c.d_model, c.d_ff, c.activation_dropout, c.activation)
        self.sub1 = SubLayer(c.d_model, c.dropout, c.pre_norm)
        self.sub2 = SubLayer(c.d_model, c.dropout, c.pre_norm)

    def forward(self, x: Tensor, src_pad: Optional[Tensor], need_weights: bool = False):
        x, w = self.sub1(x, lambda h: self.self_attn(h, key_pad=src_pad, need_weights=need_weights))
        x, _ = self.sub2(x, lambda h: (self.ffn(h), None))
        return x, w


class DecoderLayer(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(c.d_model, c.n_heads, c.attention_dropout, cross=False)
        self.cross_attn = MultiHeadAttention(c.d_model, c.n_heads, c.attention_dropout, cross=True)
        self.ffn = FeedForward(c.d_model, c.d_ff, c.activation_dropout, c.activation)
        self.sub1 = SubLayer(c.d_model, c.dropout, c.pre_norm)
        self.sub2 = SubLayer(c.d_model, c.dropout, c.pre_norm)
        self.sub3 = SubLayer(c.d_model, c.dropout, c.pre_norm)

    def forward(self, x, memory, src_pad, cache, layer, need_weights=False):
        # Right-padded targets need no key padding mask here: a real position never sees a
        # later (padding) one under the causal mask, and padded positions are ignored by the loss.
        x, ws = self.sub1(x, lambda h: self.self_attn(h, causal=True, cache=cache, layer=layer, need_weights=need_weights))
        x, wc = self.sub2(x, lambda h: self.cross_attn(h, memory, key_pad=src_pad, cache=cache, layer=layer, need_weights=need_weights))
        x, _ = self.sub3(x, lambda h: (self.ffn(h), None))
        return x, ws, wc


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        c = self.config = config
        self.embed = nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_id)
        self.tgt_embed = self.embed if c.tie_embeddings else nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_id)
        self.register_buffer("positions", sinusoidal_positions(c.max_positions, c.d_model), persistent=False)
        self.encoder = nn.ModuleList(EncoderLayer(c) for _ in range(c.encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(c) for _ in range(c.decoder_layers))
        # Pre-norm leaves the residual stream unnormalised: normalise once at the end of each stack.
        self.encoder_norm = nn.LayerNorm(c.d_model) if c.pre_norm else nn.Identity()
        self.decoder_norm = nn.LayerNorm(c.d_model) if c.pre_norm else nn.Identity()
        self.output = nn.Linear(c.d_model, c.vocab_size, bias=c.output_bias)
        # Training on CPU in bf16 sets this: in whole-sequence passes (training, validation loss,
        # encoding) activations, and so every matmul, layer norm and residual, are bf16 from the
        # embedding on, while the parameters stay float32 master weights that each layer casts
        # per call. Unlike autocast, nothing flips between the two formats at every sub-layer.
        # Incremental decoding (validation BLEU) keeps float32 steps, which would otherwise cast
        # every weight at every step. Not saved: a loaded model computes in its weights' dtype.
        self.activation_dtype: Optional[torch.dtype] = None
        self.reset_parameters()
        if c.tie_embeddings:
            self.output.weight = self.embed.weight

    def reset_parameters(self) -> None:
        """fairseq's initialisation: embeddings N(0, D^-1/2), Xavier-uniform projections, zero biases,
        so the first loss is close to ln(V)."""
        c = self.config
        for emb in {self.embed, self.tgt_embed}:
            nn.init.normal_(emb.weight, mean=0.0, std=c.d_model ** -0.5)
            nn.init.zeros_(emb.weight[c.pad_id])
        for module in self.modules():
            if isinstance(module, MultiHeadAttention):
                # Q, K, V initialised as separate D x D matrices (gain 1/sqrt(2) as fairseq), even
                # where they are stored fused.
                fused = module.kv_proj if module.cross else module.qkv_proj
                for part in fused.weight.data.split(c.d_model, dim=0):
                    nn.init.xavier_uniform_(part, gain=1 / math.sqrt(2))
                if module.cross:
                    nn.init.xavier_uniform_(module.q_proj.weight, gain=1 / math.sqrt(2))
                    nn.init.zeros_(module.q_proj.bias)
                nn.init.zeros_(fused.bias)
                nn.init.xavier_uniform_(module.out_proj.weight)
                nn.init.zeros_(module.out_proj.bias)
            elif isinstance(module, FeedForward):
                for lin in (module.fc1, module.fc2):
                    nn.init.xavier_uniform_(lin.weight)
                    nn.init.zeros_(lin.bias)
        if not c.tie_embeddings:
            nn.init.normal_(self.output.weight, mean=0.0, std=c.d_model ** -0.5)
        if self.output.bias is not None:
            nn.init.zeros_(self.output.bias)

    def _embed(self, emb: nn.Embedding, tokens: Tensor, start: int = 0, incremental: bool = False) -> Tensor:
        T = tokens.size(1)
        if start + T > self.config.max_positions:
            raise ValueError(f"sequence of {start + T} positions exceeds max_positions {self.config.max_positions}")
        x = emb(tokens)
        if self.config.scale_embedding:
            x = x * math.sqrt(self.config.d_model)
        x = x + self.positions[start : start + T].to(emb.weight.dtype)  # (B, T, D)
        if self.activation_dtype is not None and not incremental:
            x = x.to(self.activation_dtype)  # the embedding's gradient still sums in float32
        return dropout(x, self.config.dropout, self.training)

    def encode(self, src: Tensor, need_weights: bool = False):
        """src (B, S) ids -> memory (B, S, D), src_pad (B, S) [, per-layer weights (B, H, S, S)]."""
        src_pad = src.eq(self.config.pad_id)  # (B, S)
        x = self._embed(self.embed, src)
        weights = []
        for layer in self.encoder:
            x, w = layer(x, src_pad, need_weights)
            weights.append(w)
        x = self.encoder_norm(x)
        return (x, src_pad, weights) if need_weights else (x, src_pad)

    def new_cache(self, memory: Tensor, src_pad: Tensor, group: int = 1) -> KVCache:
        """An empty cache with every layer's cross-attention keys/values projected once. With
        group G, each of the B sentences is decoded as G adjacent rows (beams): decode then takes
        B*G rows, and the keys/values are still stored once per sentence. On CPU they are stored
        in float32 whatever the model's precision: attention over a few query rows is a batch of
        tiny matrix products, which run several times slower in bf16 than in float32 there, and
        the casts of a 16-bit cache cost more than the memory they save."""
        store = torch.float32 if memory.device.type == "cpu" else memory.dtype
        cache = KVCache(src_pad=src_pad, group=group, dtype=store)
        for layer in self.decoder:
            k, v = layer.cross_attn.project_kv(memory)  # (B, H, S, K)
            # contiguous: as views into the fused K|V projection, every step's matmul would copy them
            cache.cross_k.append(k.to(store).contiguous())
            cache.cross_v.append(v.to(store).contiguous())
        return cache

    def decode_features(self, tgt_in: Tensor, memory: Tensor, src_pad: Tensor, cache: Optional[KVCache] = None,
                        need_weights: bool = False):
        """tgt_in (B, T) -> decoder output (B, T, D). With a cache, tgt_in holds only the new positions."""
        start = 0
        if cache is not None:
            start = cache.steps
            src_pad = cache.src_pad if cache.src_pad is not None else src_pad
        x = self._embed(self.tgt_embed, tgt_in, start, incremental=cache is not None)
        self_w, cross_w = [], []
        for i, layer in enumerate(self.decoder):
            x, ws, wc = layer(x, memory, src_pad, cache, i, need_weights)
            self_w.append(ws)
            cross_w.append(wc)
        if cache is not None:
            cache.steps += tgt_in.size(1)
        x = self.decoder_norm(x)
        return (x, self_w, cross_w) if need_weights else x

    def decode(self, tgt_in: Tensor, memory: Tensor, src_pad: Tensor, cache: Optional[KVCache] = None) -> Tensor:
        """Logits (B, T, V) for the next token after each position of tgt_in."""
        return linear(self.decode_features(tgt_in, memory, src_pad, cache), self.output)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        memory, src_pad = self.encode(src)
        return self.decode(tgt_in, memory, src_pad)
