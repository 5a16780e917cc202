"""--precision auto and the bf16 capability check, with the CPU's instructions mocked."""

import pytest
import torch

from seqtool import device

CPU = torch.device("cpu")


@pytest.fixture
def cpu_flags(monkeypatch):
    """Make torch report the given CPU: flags(amx=..., avx512_bf16=..., capability=...)."""
    def set_flags(amx=False, avx512_bf16=False, capability="AVX2"):
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    return set_flags


@pytest.mark.parametrize("purpose", ["train", "translate"])
@pytest.mark.parametrize("flags, expected, reason", [
    (dict(amx=True, avx512_bf16=True, capability="AVX512"), "bf16", "this CPU has AMX instructions"),
    (dict(avx512_bf16=True, capability="AVX512"), "bf16", "this CPU has AVX512-BF16 instructions"),
    (dict(capability="AVX512"), "fp32", "this CPU (AVX512) has no bfloat16 instructions"),
    (dict(capability="AVX2"), "fp32", "this CPU (AVX2) has no bfloat16 instructions"),
])
@pytest.mark.unit
def test_auto_picks_bf16_only_where_the_cpu_has_bf16_instructions(cpu_flags, capsys, purpose, flags, expected, reason):
    cpu_flags(**flags)
    assert device.resolve_precision("auto", CPU, purpose) == expected
    assert f"--precision auto: {expected} ({reason}" in capsys.readouterr().err  # the log says what and why


@pytest.mark.parametrize("purpose", ["train", "translate"])
@pytest.mark.unit
def test_bf16_asked_for_on_an_avx2_cpu_is_warned_about_with_the_cost(cpu_flags, capsys, purpose):
    cpu_flags(capability="AVX2")
    assert device.resolve_precision("bf16", CPU, purpose) == "bf16"  # the user's choice stands
    err = capsys.readouterr().err
    assert "this CPU (AVX2) has no bfloat16 instructions" in err and "54 target tokens/s" in err
    cpu_flags(avx512_bf16=True, capability="AVX512")
    device.resolve_precision("bf16", CPU, purpose)
    assert capsys.readouterr().err == ""  # nothing to warn about where bf16 is native


@pytest.mark.integration
def test_translate_resolves_auto_once_and_warns_on_emulated_bf16(cpu_flags, tiny_checkpoint, capsys):
    from seqtool.translate import Translator

    cpu_flags(capability="AVX2")
    t = Translator.load(tiny_checkpoint, device="cpu", beam=1, max_len_a=0.0, max_len_b=4)
    assert t.config.precision == "fp32" and next(t.model.parameters()).dtype == torch.float32
    cpu_flags(amx=True, avx512_bf16=True, capability="AVX512")
    t = Translator.load(tiny_checkpoint, device="cpu", beam=1, max_len_a=0.0, max_len_b=4)
    assert t.config.precision == "bf16" and next(t.model.parameters()).dtype == torch.bfloat16
    t = Translator.load(tiny_checkpoint, device="cpu", beam=1, max_len_a=0.0, max_len_b=4, quantize="int8")
    assert t.config.precision == "fp32"  # int8 computes in int8 and float32
    capsys.readouterr()
    cpu_flags(capability="AVX2")
    Translator.load(tiny_checkpoint, device="cpu", beam=1, max_len_a=0.0, max_len_b=4, precision="bf16")
    assert "has no bfloat16 instructions" in capsys.readouterr().err


@pytest.mark.unit
def test_this_machine_reports_its_capability():
    assert device.cpu_capability() in ("AVX2", "AVX512", "DEFAULT", "ZVECTOR", "NO AVX", "VSX") or device.cpu_capability()
    assert device.cpu_bf16_instructions() in ("", "AMX", "AVX512-BF16")


@pytest.mark.unit
def test_sdpa_without_cudnn_turns_the_backend_off_process_wide():
    """Training and decoding on CUDA call this (cuDNN builds an attention plan per new shape); the
    switch is torch's global one, so it can be checked without a GPU."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        device.sdpa_without_cudnn()
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
