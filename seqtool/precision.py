"""Number formats for decoding: a loaded fp32 model made ready to translate in bf16, fp16 or int8.

Owns the choice of arithmetic at inference time (training's mixed precision lives in train.py):

- ``--precision bf16`` (CPU and CUDA) / ``fp16`` (CUDA only): the weights are cast once, so every
  linear layer runs in 16 bits; on CUDA the attention and the key/value cache do too, while on CPU
  the decoding cache and its attention stay float32 (model.new_cache says why). search.py turns
  the logits back to float32 before the log-softmax, so scores and ranking stay float32.
- ``--quantize int8`` (CPU only): dynamic quantization of every linear layer (weights int8 per
  output channel, activations quantized per call), through torch's fbgemm/oneDNN kernels. The
  output projection, tied to the embedding, gets its own int8 copy; the embedding stays float32.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from .errors import ConfigError
from .device import cuda_has_bf16

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
    """Every nn.Linear replaced by a dynamically quantized one (int8 weights, per output channel)."""
    try:
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
    except ImportError:
        raise ConfigError("--quantize int8: this torch build has no dynamic quantization; use --precision bf16") from None
    engines = torch.backends.quantized.supported_engines
    if not any(e in engines for e in ("x86", "fbgemm", "onednn")):
        raise ConfigError(f"--quantize int8: no x86 int8 kernels in this torch build (engines: {', '.join(engines)})")
    with warnings.catch_warnings():
        # torch marks torch.ao.quantization deprecated in favour of the separate torchao package
        # (not a seqtool dependency); its fbgemm/oneDNN kernels are torch's own int8 path on x86,
        # and users should not see a warning about our choice on every run.
        warnings.simplefilter("ignore")
        # Tied weights: quantize_dynamic packs a copy of output.weight; the embedding is untouched.
        return quantize_dynamic(model, {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True)
