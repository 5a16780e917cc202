"""The model's measured CPU kernels: linear layers in float32 through oneDNN instead of the BLAS
default, the feed-forward's linear + ReLU as one kernel wherever one exists, and dropout drawn as
15-bit integers (with the residual add fused).

torch routes a float32 `F.linear` on CPU to MKL's sgemm, which runs AVX2 code on AMD processors;
oneDNN (bundled with torch, reached through `torch.ops.mkldnn._linear_pointwise`) picks its kernel
by the instruction set and uses AVX-512 there. On the 2-core AMD EPYC of our benchmarks that is
1.4-2.6x faster for the shapes of training and decoding, with float32 (not reduced-precision)
arithmetic. Everywhere else (CUDA, autocast to bf16/fp16, a quantized or wrapped layer, a torch
without oneDNN) `linear` is plain `layer(x)`.

`linear_relu` is relu(linear(x, layer)) with the ReLU applied by the matrix product's own output
stage when decoding on CPU (oneDNN's post-op in float32, in place after an Int8Linear's product):
the same numbers without a separate pass over (and allocation of) the (rows, d_ff)
activations (1.9% of int8 beam search's time in a profile of the test set).
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_pointwise = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
ONEDNN = _pointwise is not None and torch.backends.mkldnn.is_available()


def limit_primitive_cache(capacity: int = 64, lru_capacity: int = 64) -> None:
    """Training: keep at most `capacity` oneDNN primitives instead of 1024, and at most
    `lru_capacity` entries in ideep's own LRU cache (LRU_CACHE_CAPACITY) instead of 1024.

    oneDNN keeps every primitive it creates (one per operand shape, each with its buffers).
    Training creates new ones with every batch's row count, so the default cache held 1.2 GB of
    peak RSS in a cpu-small run (150 updates: 4.45 GB against 3.55 GB capped) and saved no
    measurable time. ideep (the layer between torch and oneDNN) caches more per call in its LRU
    cache, keyed by what changes with every update under autocast (a fresh 16-bit copy of each
    weight): in a cpu-small bf16 run the heap's live bytes between updates grew by ~0.7 MB an
    update (255 -> 450 MB in 300 updates) until 1,024 entries; with 64 they stay at ~220 MB, and the
    run needs no periodic heap trim (bench/results.md). Decoding keeps both defaults: its weights
    and row counts repeat. Both are read once, at the first primitive, so call this before any; a
    user's own settings win."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(capacity))
    os.environ.setdefault("LRU_CACHE_CAPACITY", str(lru_capacity))


def _mm(a: Tensor, b_t: Tensor) -> Tensor:
    """a @ b_t.T (oneDNN reads either operand through its strides, so .t() views cost no copy)."""
    return _pointwise(a, b_t, None, "none", [], "")


def matmul_t(a: Tensor, b_t: Tensor) -> Tensor:
    """a @ b_t.T: through oneDNN for float32 on CPU (as `linear`), else torch's matmul (which autocast sees)."""
    if ONEDNN and a.device.type == "cpu" and a.dtype == b_t.dtype == torch.float32 and not torch.is_autocast_enabled("cpu"):
        return _mm(a, b_t)
    return a @ b_t.t()


class _OneDNNLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias):  # (..., K), (N, K), (N,)
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _pointwise(x, weight, bias, "none", [], "")  # (..., N)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        N, K = weight.shape
        g = grad.reshape(-1, N)  # (M, N)
        x2 = x.reshape(-1, K)  # (M, K)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _mm(g, weight.t().contiguous()).view(x.shape)  # g @ W: (M, K)
        if ctx.needs_input_grad[1]:
            # g^T @ x, computed in whichever orientation gives oneDNN the long output rows
            # (measured: 3x faster for the 8000-way output layer, slower for narrow layers).
            grad_w = _mm(x2.t(), g.t()).t() if N >= K else _mm(g.t(), x2.t())  # (N, K)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g.sum(0)
        return grad_x, grad_w, grad_b


def _plain(x: Tensor, layer: nn.Module) -> bool:
    """A plain nn.Linear (no subclass, no hooks) called outside autocast: safe to compute directly."""
    return (
        type(layer) is nn.Linear
        and not torch.is_autocast_enabled(x.device.type)
        and not (layer._forward_hooks or layer._forward_pre_hooks)  # hooks need the module call
    )


class Int8Linear(nn.Module):
    """A linear layer in int8 arithmetic for CPU decoding: int8 weights with one scale per output
    channel, int8 activations with one scale per row, int32 products (torch._int_mm), then
    float32: y = (q_x @ q_W^T) * s_row * s_col + b (CTranslate2's scheme).

    Every row is quantized by its own maximum, and an integer product is exact, so a row's output
    does not depend on the other rows of the call: a sentence translates the same whatever shares
    its batch (torch's dynamic quantization scales the whole input by one maximum, so a long
    neighbour changed a sentence's rounding). Weights stay (in, out), as _int_mm reads them."""

    def __init__(self, weight: Tensor, bias: Optional[Tensor]):
        super().__init__()
        w = weight.detach().float()
        scale = w.abs().amax(dim=1).clamp_min(1e-30) / 127  # (out,)
        self.register_buffer("weight_t", torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8).t().contiguous())
        self.register_buffer("weight_scale", scale)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.in_features, self.out_features = w.shape[1], w.shape[0]

    @classmethod
    def from_linear(cls, layer: nn.Linear) -> "Int8Linear":
        return cls(layer.weight, layer.bias)

    def forward(self, x: Tensor, relu: bool = False) -> Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features).float()  # (M, in)
        if x2.size(0) == 0:
            return x2.new_zeros(*shape[:-1], self.out_features)
        scale = x2.abs().amax(dim=1, keepdim=True).clamp_min_(1e-30).div_(127)  # (M, 1)
        q = torch.div(x2, scale).round_().clamp_(-127, 127).to(torch.int8)
        acc = torch._int_mm(q, self.weight_t)  # (M, out) int32
        # converted in place, one buffer: at 256 rows a 58,101-wide output is 60 MB, and a second one
        # cost 2 ms a step (an elementwise copy reads each element before it writes it; a test checks)
        y = acc.view(torch.float32).copy_(acc).mul_(scale).mul_(self.weight_scale)  # (M, out)
        if self.bias is not None:
            y.add_(self.bias)
        if relu:
            y.relu_()
        return y.view(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per channel x per row"


def log_softmax_(x: Tensor) -> Tensor:
    """x.float().log_softmax(-1), computed in place when x is a float32 CPU tensor outside
    autograd (the caller gives x up): the next-token logits of a 58,101-id vocabulary at 256 rows
    took 9.5 ms into a new tensor and 4.1 ms in place (2 threads). torch's CPU kernel reads a row
    whole before it writes it (tests/test_kernels.py checks the values against log_softmax's)."""
    if x.dtype == torch.float32 and x.device.type == "cpu" and x.is_contiguous() and not x.requires_grad:
        return torch.log_softmax(x, dim=-1, out=x)
    return x.float().log_softmax(dim=-1)


def linear_relu(x: Tensor, layer: nn.Module) -> Tensor:
    """relu(layer(x)); one fused kernel for an int8 layer, or a float32 one on CPU without autograd."""
    if not torch.is_grad_enabled() and x.device.type == "cpu":
        if type(layer) is Int8Linear and not (layer._forward_hooks or layer._forward_pre_hooks):
            return layer(x, relu=True)
        if ONEDNN and _plain(x, layer) and x.dtype == layer.weight.dtype == torch.float32:
            return _pointwise(x.contiguous(), layer.weight, layer.bias, "relu", [], "")
    return F.relu(linear(x, layer))


def linear(x: Tensor, layer: nn.Module) -> Tensor:
    """layer(x), through oneDNN when layer is a plain float32 nn.Linear on CPU outside autocast
    and without hooks; with the weights cast to x's dtype when a plain layer's differ from it."""
    if not _plain(x, layer):
        return layer(x)
    if ONEDNN and x.device.type == "cpu" and x.dtype == layer.weight.dtype == torch.float32:
        x = x.contiguous()
        if torch.is_grad_enabled() and (x.requires_grad or layer.weight.requires_grad):
            return _OneDNNLinear.apply(x, layer.weight, layer.bias)
        return _pointwise(x, layer.weight, layer.bias, "none", [], "")
    if x.dtype != layer.weight.dtype:
        # bf16 activations with float32 (master) weights: the weights are cast for this call, and
        # the cast is differentiable, so their gradients arrive in float32 (see Transformer.activation_dtype)
        bias = layer.bias.to(x.dtype) if layer.bias is not None else None
        return F.linear(x, layer.weight.to(x.dtype), bias)
    return layer(x)


# ---- dropout -------------------------------------------------------------------------------
def _keep_mask(like: Tensor, p: float) -> Tensor:
    """0 or 1/(1-p) per element, in like's dtype: dropout's multiplier. Drawn as 15-bit integers:
    on CPU torch.rand in float32 is 1.4x slower than int16 random_ (and bernoulli_ 3x slower
    still), and exact in any dtype, where a bf16 torch.rand rounds its draws and dropped 10.2%
    instead of 10%. The integers come four to an int64 random_ draw (63 random bits: each 16-bit
    lane masked to its low 15), which halves the generator's calls: 1.7 ms against 2.9 ms for a
    (170, 24, 256) mask on 2 threads. p is rounded to a multiple of 1/32768 and the scale uses
    the rounded value, so the expectation stays exactly x."""
    drop = round(p * 32768)
    n = like.numel()
    bits = torch.empty((n + 3) // 4, dtype=torch.int64, device=like.device).random_().view(torch.int16)[:n]
    keep = bits.bitwise_and_(0x7FFF).view(like.shape) >= drop
    return keep.to(like.dtype).mul_(32768 / (32768 - drop))


def residual_dropout(x: Tensor, y: Tensor, p: float, training: bool) -> Tensor:
    """x + dropout(y) in one fused multiply-add. On CPU this is ~2.5x faster forward+backward
    than F.dropout followed by an add (bernoulli_ sampling is slow there); same distribution."""
    if not training or p == 0.0:
        return x + y
    return torch.addcmul(x, y, _keep_mask(y, p))  # (B, T, D)


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    if not training or p == 0.0:
        return x
    return x * _keep_mask(x, p)
