"""Number formats for decoding: a loaded fp32 model made ready to translate in bf16, fp16 or int8.

Owns the choice of arithmetic at inference time (training's mixed precision lives in train.py):

- ``--precision bf16`` (CPU and CUDA) / ``fp16`` (CUDA only): the weights are cast once, so every
  linear layer runs in 16 bits; on CUDA the attention and the key/value cache do too, while on CPU
  the decoding cache and its attention stay float32 (model.new_cache says why). search.py turns
  the logits back to float32 before the log-softmax, so scores and ranking stay float32.
- ``--quantize int8`` (CPU only): every linear layer in int8 (weights per output channel,
  activations per row, kernels.Int8Linear), so a sentence's result does not depend on the rows
  beside it. The output projection, tied to the embedding, gets its own int8 copy; the embedding
  stays float32.
"""

from __future__ import annotations

import torch
from torch import nn

from .errors import ConfigError
from .device import cuda_has_bf16
from .kernels import Int8Linear

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def check(device: torch.device, precision: str, quantize: str) -> None:
    """Refuse what cannot run on `device`, with the reason, before any weight is touched.
    (Values and combinations that never work are refused by DecodeConfig already.)"""
    if precision == "fp16" and device.type == "cpu":
        raise ConfigError("--precision fp16 needs a CUDA device (CPU has no fast float16 arithmetic); use --precision bf16 on CPU")
    if precision == "bf16" and device.type == "cuda" and not cuda_has_bf16(device):
        raise ConfigError("--precision bf16: this GPU has no bfloat16 arithmetic; use --precision fp16")
    if quantize == "int8" and device.type != "cpu":
        raise ConfigError(f"--quantize int8 runs on CPU only; on {device.type} use --precision bf16 or fp16")


def prepare(model: nn.Module, device: torch.device, precision: str = "fp32", quantize: str = "none") -> nn.Module:
    """The model (already on `device`, in eval mode) converted for decoding; may return a new module."""
    check(device, precision, quantize)
    if quantize == "int8":
        return quantize_int8(model)
    if precision != "fp32":
        model = model.to(DTYPES[precision])
    return model


def quantize_int8(model: nn.Module) -> nn.Module:
    """Every nn.Linear replaced, in place, by a kernels.Int8Linear (int8 weights per output channel,
    activations per row). The output projection, tied to the embedding, gets its own int8 copy."""
    if not hasattr(torch, "_int_mm"):
        raise ConfigError("--quantize int8: this torch build has no int8 matrix product (torch._int_mm); use --precision bf16")
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, Int8Linear.from_linear(child))
    return model
