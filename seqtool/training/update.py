"""One optimizer update: forward and backward over the micro-batches of an update, then one step.

Owns the arithmetic of training around the model:

- the optimizer: AdamW with one fused kernel for all parameters where torch has it (CUDA, and CPU
  in recent torch), else the multi-tensor (foreach) implementation;
- the number format (``--precision auto`` is resolved by device.py) and how 16-bit computation is arranged: autocast
  on GPUs, bf16 activations end to end on CPU (activation_dtype says why). Either way parameters,
  gradients and optimizer state stay float32 (master weights); only the computation runs in 16 bits;
- fp16's dynamic loss scaling, done in the order that keeps clipping meaningful: scale the loss,
  backward, unscale the gradients, clip their norm (in true units), step (the scaler skips the
  step when a gradient is inf/nan), then back off or grow the scale. Skipped steps are counted,
  and when they keep coming (or the scale falls below a floor) training stops with what to change
  instead of a bare "minimum loss scale reached";
- gradient accumulation: every micro-batch but the last runs under DDP's ``no_sync()``, so the
  gradient all-reduce happens once per update;
- ``--compile``: torch.compile of the training forward, falling back to eager with a warning
  where torch cannot compile (no compiler, unsupported platform, a compilation error);
- turning a CUDA out-of-memory error into advice on what to lower.

The loss of a micro-batch is summed over its target tokens and multiplied by the caller's
``loss_scale`` (world size / target tokens of the whole update on all ranks): DDP averages
gradients over ranks, so the result is the gradient of the mean loss per target token.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor, nn

from .. import log
from ..errors import ConfigError, ResourceError
from ..config import OptimConfig
from .loss import label_smoothed_nll
from ..model import Transformer

# torch.OutOfMemoryError (torch >= 2.5) is this same class; the cuda name exists in every torch.
OutOfMemoryError = torch.cuda.OutOfMemoryError

MAX_CONSECUTIVE_OVERFLOWS = 20  # fp16 steps skipped in a row before training is declared diverged
MIN_LOSS_SCALE = 1e-4  # fairseq's floor: below it the gradients overflow fp16 without any scaling


class Diverged(ConfigError):
    """fp16 gradients keep overflowing: the fix is a setting (learning rate, clipping, bf16)."""


class OutOfMemory(ResourceError):
    """The device ran out of memory: the fix is a smaller batch, precision or model."""


def activation_dtype(device: torch.device, precision: str) -> Optional[torch.dtype]:
    """bf16 on CPU trains with bf16 activations end to end (Transformer.activation_dtype) instead of
    autocast: CPU autocast runs layer norms, residuals and dropout in float32 and casts the
    activations to bf16 and back around every linear layer, and those casts took more time than
    the bf16 matmuls saved. GPUs keep autocast, where casts are cheap next to the matmuls."""
    return torch.bfloat16 if precision == "bf16" and device.type == "cpu" else None


def autocast(device: torch.device, precision: str):
    """The context the forward runs in: nothing for fp32 (and CPU bf16, see activation_dtype), else
    autocast to bf16/fp16 (weights stay fp32)."""
    if precision == "fp32" or activation_dtype(device, precision) is not None:
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def build_optimizer(params, optim: OptimConfig) -> torch.optim.Optimizer:
    """AdamW (decoupled weight decay; the same as Adam at the default weight decay 0)."""
    params = list(params)  # the fallback needs them again
    kwargs = dict(lr=optim.lr, betas=optim.betas, eps=optim.eps, weight_decay=optim.weight_decay)
    try:  # one fused kernel for all parameters (CUDA; CPU in torch >= 2.4)
        return torch.optim.AdamW(params, fused=True, **kwargs)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(params, foreach=True, **kwargs)


class TrainingLoss(nn.Module):
    """The training forward as one module call, so DDP and torch.compile wrap one thing: summed
    label-smoothed loss and summed NLL over the non-pad target tokens of a batch."""

    def __init__(self, model: Transformer, label_smoothing: float):
        super().__init__()
        self.model = model
        self.label_smoothing = label_smoothing

    def forward(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> tuple[Tensor, Tensor]:
        memory, src_pad = self.model.encode(src)  # (B, S, D), (B, S)
        features = self.model.decode_features(tgt_in, memory, src_pad)  # (B, T, D)
        loss, nll, _ = label_smoothed_nll(features, self.model.output, tgt_out, self.model.config.pad_id, self.label_smoothing)
        return loss, nll  # () each, float32


def compile_module(module: nn.Module) -> Optional[Callable]:
    """torch.compile(module), or None (with a warning) where torch.compile is unavailable. Most
    failures only show at the first call (compilation is lazy); Updater handles those."""
    try:
        return torch.compile(module)
    except Exception as error:  # e.g. a Python version dynamo does not support yet
        log.warn(f"--compile: torch.compile is not available here ({_first_line(error)}); training without it")
        return None


def _is_compiler_error(error: BaseException) -> bool:
    exc = getattr(getattr(torch, "_dynamo", None), "exc", None)
    base = getattr(exc, "TorchDynamoException", None)
    return base is not None and isinstance(error, base)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:160]}" if text else type(error).__name__


class Updater:
    """Runs updates: micro-batches forward/backward, unscale, clip, step, loss-scale bookkeeping.

    `loss_fn` is the TrainingLoss; `ddp` its DistributedDataParallel wrapper when several processes
    train (then gradients are all-reduced on the last micro-batch of each update only).
    """

    def __init__(self, loss_fn: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device, precision: str,
                 clip_norm: float, *, ddp: Optional[nn.Module] = None, compile: bool = False,
                 init_scale: float = 2.0 ** 16, max_overflows: int = MAX_CONSECUTIVE_OVERFLOWS,
                 min_scale: float = MIN_LOSS_SCALE):
        self.optimizer = optimizer
        self.device, self.precision, self.clip_norm = device, precision, clip_norm
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.eager: nn.Module = ddp if ddp is not None else loss_fn
        self.no_sync = ddp.no_sync if ddp is not None else contextlib.nullcontext
        self.compiled = compile_module(self.eager) if compile else None
        self._compiled_ran = False
        self.scaler = torch.amp.GradScaler(device.type, init_scale=init_scale, enabled=precision == "fp16")
        self.max_overflows, self.min_scale = max_overflows, min_scale
        self.skipped = 0  # updates skipped because fp16 gradients overflowed (all of the run)
        self.consecutive_skips = 0
        self.grad_norm: Optional[Tensor] = None  # total gradient norm before clipping, true units

    def _forward(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> tuple[Tensor, Tensor]:
        if self.compiled is not None:
            try:
                out = self.compiled(src, tgt_in, tgt_out)
                self._compiled_ran = True
                return out
            except OutOfMemoryError:
                raise
            except Exception as error:
                # The first call compiles; later calls recompile for new shapes. A failure there
                # is the compiler's; any other error after a successful call is a real one.
                if self._compiled_ran and not _is_compiler_error(error):
                    raise
                log.warn(f"--compile: torch.compile failed ({_first_line(error)}); training without it")
                self.compiled = None
        return self.eager(src, tgt_in, tgt_out)

    def step(self, batches: Sequence[tuple[Tensor, Tensor, Tensor]], loss_scale: float) -> tuple[Tensor, Tensor]:
        """One update over micro-batches (src, tgt_in, tgt_out) already on the device; returns the
        summed loss and NLL of this process as tensors (no host sync)."""
        total_loss: Tensor | float = 0.0
        total_nll: Tensor | float = 0.0
        for j, (src, tgt_in, tgt_out) in enumerate(batches):
            last = j == len(batches) - 1
            with contextlib.nullcontext() if last else self.no_sync():  # one all-reduce per update
                with autocast(self.device, self.precision):
                    loss, nll = self._forward(src, tgt_in, tgt_out)
                self.scaler.scale(loss * loss_scale).backward()
            total_loss = total_loss + loss.detach()
            total_nll = total_nll + nll
        if self.clip_norm > 0:
            self.scaler.unscale_(self.optimizer)  # clip in true units, not in loss-scaled ones
            self.grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.clip_norm, foreach=True)
        if self.scaler.is_enabled():
            before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)  # skipped when a gradient is inf/nan
            self.scaler.update()  # backs off after an overflow, grows after a clean stretch
            skipped = self.scaler.get_scale() < before
        else:
            self.optimizer.step()
            skipped = False
        self.optimizer.zero_grad(set_to_none=True)
        self._count(skipped)
        return total_loss, total_nll  # type: ignore[return-value]

    def _count(self, skipped: bool) -> None:
        if not skipped:
            self.consecutive_skips = 0
            return
        self.skipped += 1
        self.consecutive_skips += 1
        scale = self.scaler.get_scale()
        if self.consecutive_skips >= self.max_overflows or scale < self.min_scale:
            lr = self.optimizer.param_groups[0]["lr"]
            clip = f"now {self.clip_norm:g}" if self.clip_norm > 0 else "now off"
            raise Diverged(
                f"fp16 training diverged: the gradients were inf/nan in {self.consecutive_skips} updates in a row "
                f"(loss scale now {scale:.3g}; {self.skipped} updates skipped in all), so the model stopped learning. "
                f"Lower --lr (learning rate now {lr:.3g}), set --clip-norm (e.g. 1.0; {clip}), or use --precision bf16"
            )


def out_of_memory_advice(device: torch.device, max_tokens: int, update_freq: int, precision: str) -> str:
    """One line saying what to lower after the device ran out of memory in training."""
    half = max(1, max_tokens // 2)
    tips = [f"lower --max-tokens (now {max_tokens}; --max-tokens {half} --update-freq {2 * update_freq} "
            f"keeps the effective batch)"]
    if precision != "bf16":
        tips.append("use --precision bf16" + (" (or fp16 on GPUs without bf16)" if precision == "fp32" else ""))
    tips.append("or pick a smaller --arch")
    return f"{device}: out of memory while training; " + ", ".join(tips)
