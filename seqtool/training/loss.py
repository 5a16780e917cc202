"""The training loss: label-smoothed cross-entropy of the output layer, computed a block of rows at a time.

    loss_i = (1 - eps) nll_i + eps mean_j(-log p_ij) = lse_i - (1 - eps) z_iy - eps mean_j z_ij,
    z = h W^T + b (the output layer over the decoder's features h), p = softmax(z).

The (N, V) logits are the largest tensors of a training step: at 4,096 target tokens and 8,000
pieces one float32 copy is 131 MB, and the plain route (logits, softmax, their gradient, the
gradient's 16-bit copy) keeps three or four of them alive at the step's peak. Here the output
layer, the softmax and the gradient are computed together, ROWS_BYTES of probabilities at a time:
each block's gradient with respect to h and W is formed as soon as its probabilities are known
(p_ij - (1 - eps) [j = y_i]), and backward only scales what forward stored by the incoming
gradient. The logits never exist whole. Measured on the cpu-small protocol: see bench/results.md.

One softmax pass is the only exp over each block: lse_i comes back from the target's own
probability as z_iy - log p_iy (recomputed exactly for the rare rows where p_iy underflows).
The smoothing term's mean_j z_ij is linear in h_i, so it is h_i . mean_j(W_j) (+ mean bias): a
(N, D) x (D,) product left to autograd instead of a pass over the logits.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..kernels import matmul_t

ROWS_BYTES = 16 << 20  # float32 probabilities per block (16 MiB: under glibc's mmap ceiling, so reused)
MIN_ROWS = 64


def block_rows(vocab: int) -> int:
    """Rows per block: ROWS_BYTES of float32 probabilities, a multiple of 64 (and at least 64)."""
    return max(MIN_ROWS, (ROWS_BYTES // (4 * vocab)) // 64 * 64)


_SCRATCH: dict = {}


def _scratch(name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """A work tensor of `shape` kept between calls (its contents are not): the blocks' logits,
    probabilities and 16-bit gradients, the 16-bit weight. Fresh tensors of these sizes are fresh
    pages for the kernel to fault in and zero at their first write (glibc hands blocks this large
    back to the system): softmax into a new float32 (512, 8000) tensor took 9.6 ms, into a used
    one 1.1 ms; in bf16 training (2 threads), these buffers allocated once per call still spent
    ~2 ms per block copy faulting. Kept: ~40 MB for the cpu-small output layer."""
    n = math.prod(shape)
    key = (name, dtype, device)
    buf = _SCRATCH.get(key)
    if buf is None or buf.numel() < n:
        buf = _SCRATCH[key] = torch.empty(n, dtype=dtype, device=device)
    return buf[:n].view(shape)


class _LinearCrossEntropy(torch.autograd.Function):
    """(sum_i lse_i - (1 - eps) z_iy, sum_i nll_i) over the rows of h; gradients formed in forward."""

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, bias, target: Tensor, eps: float, want_grad: bool):
        # h (N, D) in the compute dtype; weight (V, D) and bias (V,) in theirs (float32 master weights
        # under bf16 activations are cast here); target (N,)
        low = h.dtype != torch.float32
        V, D = weight.shape
        w = _scratch("w", (V, D), h.dtype, h.device).copy_(weight) if low else weight.to(h.dtype)
        w_t = None  # (D, V), for g @ W
        if want_grad:
            w_t = _scratch("w_t", (D, V), h.dtype, h.device).copy_(w.t()) if low else w.t().contiguous()
        b = bias.to(h.dtype) if bias is not None else None
        N, rows = h.size(0), block_rows(V)
        loss = h.new_zeros((), dtype=torch.float32)
        nll = h.new_zeros((), dtype=torch.float32)
        if want_grad:
            grad_h = torch.empty(h.shape, dtype=torch.float32, device=h.device)  # (N, D)
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=h.device)  # (V, D)
            grad_b = torch.zeros(weight.size(0), dtype=torch.float32, device=h.device) if bias is not None else None
        first = min(rows, N)
        if low:  # the blocks' buffers, reused by every block and every call (see _scratch)
            logits16 = _scratch("logits16", (first, V), h.dtype, h.device)
            probs = _scratch("probs", (first, V), torch.float32, h.device)
            grad16 = _scratch("grad16", (first, V), h.dtype, h.device) if want_grad else None
        for r0 in range(0, N, rows):
            hc, y = h[r0:r0 + rows], target[r0:r0 + rows]  # (n, D), (n,)
            n = hc.size(0)
            z = torch.mm(hc, w.t(), out=logits16[:n]) if low else matmul_t(hc, w)  # (n, V)
            if b is not None:
                z += b
            p = probs[:n].copy_(z) if low else z  # float32 logits, softmaxed in place below
            z_y = z.gather(1, y[:, None]).squeeze(1).float()  # (n,)
            torch.softmax(p, dim=-1, out=p)  # (n, V) probabilities in float32
            p_y = p.gather(1, y[:, None]).squeeze(1)  # (n,)
            lse = z_y - p_y.log()  # (n,) log-sum-exp of each row
            tiny = p_y < 1e-30  # log(p_y) lost precision (or is -inf): those rows' log-sum-exp from their logits
            if bool(tiny.any()):
                zt = z[tiny] if low else matmul_t(hc[tiny], w) + (b if b is not None else 0)  # (float32 z became p)
                lse[tiny] = torch.logsumexp(zt.float(), dim=-1)
            block_nll = lse - z_y
            loss += (block_nll + eps * z_y).sum()
            nll += block_nll.sum()
            if want_grad:
                p[torch.arange(n, device=p.device), y] -= 1.0 - eps  # d loss / d z: (n, V)
                if grad_b is not None:
                    grad_b += p.sum(0)
                g = grad16[:n].copy_(p) if low else p
                grad_h[r0:r0 + rows] = matmul_t(g, w_t)  # g @ W: (n, D)
                grad_w += matmul_t(hc.t(), g.t()).t()  # (h^T g)^T = g^T h: (V, D); this orientation gives oneDNN long rows
            del z, p
        if want_grad:
            ctx.save_for_backward(grad_h, grad_w, grad_b)
            ctx.dtypes = (h.dtype, weight.dtype)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor):
        grad_h, grad_w, grad_b = ctx.saved_tensors  # gradients of the summed loss, formed in forward
        h_dtype, w_dtype = ctx.dtypes
        out_h = grad_h.mul_(grad_loss).to(h_dtype) if ctx.needs_input_grad[0] else None
        out_w = grad_w.mul_(grad_loss).to(w_dtype) if ctx.needs_input_grad[1] else None
        out_b = grad_b.mul_(grad_loss).to(w_dtype) if grad_b is not None and ctx.needs_input_grad[2] else None
        return out_h, out_w, out_b, None, None, None


def label_smoothed_nll(features: Tensor, output: nn.Linear, target: Tensor, pad_id: int, smoothing: float) -> tuple[Tensor, Tensor, int]:
    """Summed label-smoothed cross-entropy and summed NLL (no gradient) over non-pad target positions.

    The output layer runs on the non-pad positions only: padding costs no V-sized matmul.
    """
    keep = target.ne(pad_id).view(-1)  # (B*T,)
    h = features.reshape(-1, features.size(-1))[keep]  # (N, D)
    y = target.view(-1)[keep]  # (N,)
    want_grad = torch.is_grad_enabled() and (h.requires_grad or output.weight.requires_grad)
    loss, nll = _LinearCrossEntropy.apply(h, output.weight, output.bias, y, float(smoothing), want_grad)
    if smoothing:
        # () = sum_i mean_j z_ij, elementwise so autocast keeps it in float32
        mean_z = (h.sum(0).float() * output.weight.mean(0).float()).sum()
        if output.bias is not None:
            mean_z = mean_z + h.size(0) * output.bias.mean()
        loss = loss - smoothing * mean_z.float()
    return loss, nll.detach(), int(y.numel())
