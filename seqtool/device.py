"""Where a run computes and in which number format: the device choice, the one bfloat16 capability
check (hardware arithmetic, never emulation), and ``--precision auto`` for training and decoding.

What auto picks, and why (each measured; bench/results.md):

- CPU with bfloat16 instructions (AVX512-BF16 or AMX): bf16. cpu-small training ran at 4,443
  target tokens/s in bf16 against ~2,000 in fp32 (AMD EPYC, AVX512-BF16), and decoding (beam 5)
  1.1-1.3x faster than fp32 at -0.03 BLEU;
- CPU without them (AVX2, or AVX-512 without BF16): fp32. There bf16 is emulated: cpu-small
  training ran at 54 target tokens/s in bf16 against ~2,000 in fp32 (AVX2), so an explicit
  ``--precision bf16`` there gets a warning with that figure;
- CUDA: training in bf16 (fp16 with loss scaling on GPUs before Ampere); decoding in bf16 where
  the GPU has it (H200, beam 5, 256 lines: 0.47 s against fp32's 0.82 s once cuDNN attention was
  off, see sdpa_without_cudnn; BLEU within 0.01 of fp32 in bench/gpu.py), else fp32
  (fp16 decoding measured no faster than fp32).
"""

from __future__ import annotations

from typing import Callable

import torch

from . import log
from .errors import ConfigError

AVX2_BF16_SLOWDOWN = "cpu-small training measured 54 target tokens/s in bf16 against ~2,000 in fp32 on an AVX2 CPU"


def pick_device(name: str) -> torch.device:
    """--device auto|cpu|cuda|cuda:N -> a device that exists here (a clear error when CUDA is asked for but absent)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is available (this torch build or machine has none); use --device cpu")
    return torch.device(name)


def cpu_capability() -> str:
    """torch's name for the vector instructions it dispatches to here (e.g. AVX2, AVX512)."""
    get = getattr(torch.backends.cpu, "get_cpu_capability", None)
    return get() if get is not None else "unknown"


def _cpu_flag(name: str) -> bool:
    check: Callable[[], bool] | None = getattr(torch.cpu, name, None)  # private probes, present since torch 2.1
    try:
        return bool(check()) if check is not None else False
    except RuntimeError:
        return False


def cpu_bf16_instructions() -> str:
    """The CPU's bfloat16 instructions ("AMX", "AVX512-BF16"), or "" when bf16 would be emulated."""
    if _cpu_flag("_is_amx_tile_supported"):
        return "AMX"
    if _cpu_flag("_is_avx512_bf16_supported"):
        return "AVX512-BF16"
    return ""


def sdpa_without_cudnn() -> None:
    """Training and decoding on CUDA: scaled_dot_product_attention without its cuDNN backend. SDPA
    picks cuDNN's attention for bf16/fp16 on recent GPUs, and cuDNN builds an execution plan for
    every new shape. Token-budget batches bring a new (rows, length) shape at most updates, and
    decoding one at every step (the cache grows) and batch, so the GPU sat idle while plans were
    built: base-preset bf16 training ran at 41,464 target tokens/s with cuDNN attention and
    132,783 without it on an H200 (bench/gpu_train_profile.py, 80 updates), and bf16 beam search
    was 12x slower than fp32 (bench/gpu.py; 3.4x on random weights, bench/gpu_decode_profile.py).
    The memory-efficient and flash kernels need no plan. Process-wide, like the thread count."""
    enable = getattr(torch.backends.cuda, "enable_cudnn_sdp", None)
    if enable is not None:
        enable(False)


def cuda_has_bf16(device: torch.device) -> bool:
    """bfloat16 arithmetic in hardware (Ampere and later, and ROCm), not emulated. (torch's
    is_bf16_supported() also counts emulation, which is how a T4 would pass it.)"""
    if torch.version.hip:
        return True
    return torch.cuda.get_device_capability(device)[0] >= 8


def has_bf16(device: torch.device) -> bool:
    return cuda_has_bf16(device) if device.type == "cuda" else bool(cpu_bf16_instructions())


def resolve_precision(name: str, device: torch.device, purpose: str) -> str:
    """--precision (auto, fp32, bf16, fp16) for `purpose` "train" or "translate" on `device`:
    auto resolved (and the choice logged with its reason); bf16 on a GPU without it refused; bf16
    on a CPU without bf16 instructions allowed with a warning that says what it costs."""
    if name == "auto":
        name, why = auto_precision(device, purpose)
        log.info(announce(name, why))
        return name
    if name == "bf16" and device.type == "cuda" and not cuda_has_bf16(device):
        major, minor = torch.cuda.get_device_capability(device)
        raise ConfigError(f"--precision bf16: this GPU (compute capability {major}.{minor}) has no bfloat16 arithmetic; "
                          "use --precision fp16 (or auto)")
    if name == "bf16" and device.type == "cpu" and not cpu_bf16_instructions():
        log.warn(f"--precision bf16: this CPU ({cpu_capability()}) has no bfloat16 instructions (AVX512-BF16 or AMX), "
                 f"so bf16 is emulated and many times slower than fp32 ({AVX2_BF16_SLOWDOWN}); use --precision fp32 or auto")
    return name


def announce(name: str, why: str) -> str:
    return f"--precision auto: {name} ({why})"


def auto_precision(device: torch.device, purpose: str) -> tuple[str, str]:
    """What --precision auto means for `purpose` ("train" or "translate") on `device`, and why."""
    if device.type == "cuda":
        if purpose == "translate":
            if cuda_has_bf16(device):
                return "bf16", "this GPU has bfloat16 arithmetic"
            return "fp32", "this GPU has no bfloat16 arithmetic, and fp16 decoding measured no faster than fp32"
        if cuda_has_bf16(device):
            return "bf16", "this GPU has bfloat16 arithmetic"
        return "fp16", "this GPU has no bfloat16 arithmetic; fp16 with loss scaling"
    instructions = cpu_bf16_instructions()
    if instructions:
        return "bf16", f"this CPU has {instructions} instructions"
    return "fp32", f"this CPU ({cpu_capability()}) has no bfloat16 instructions: bf16 would be emulated"
