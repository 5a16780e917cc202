"""The oneDNN float32 linear path gives F.linear's values and gradients."""

import os
import pytest
import torch

from seqtool import kernels as lin

pytestmark = pytest.mark.unit


@pytest.mark.skipif(not lin.ONEDNN, reason="this torch build has no oneDNN")
@pytest.mark.parametrize("shape,n_out,bias", [((7, 16), 24, True), ((3, 5, 16), 40, False), ((2, 4, 64), 8, True)])
def test_onednn_linear_matches_f_linear(shape, n_out, bias, monkeypatch):
    torch.manual_seed(0)
    layer = torch.nn.Linear(shape[-1], n_out, bias=bias).double().float()
    x = torch.randn(*shape, requires_grad=True)
    calls = []
    real = lin._pointwise
    monkeypatch.setattr(lin, "_pointwise", lambda *a: calls.append(1) or real(*a))
    y = lin.linear(x, layer)
    assert calls, "the oneDNN path was not taken"
    g = torch.randn_like(y)
    mine = torch.autograd.grad(y, [x, *layer.parameters()], g)
    ref_y = torch.nn.functional.linear(x, layer.weight, layer.bias)
    ref = torch.autograd.grad(ref_y, [x, *layer.parameters()], g)
    torch.testing.assert_close(y, ref_y)
    for a, b in zip(mine, ref):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b)


def test_other_layers_and_autocast_take_the_module_path():
    layer = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert lin.linear(x, layer).dtype == torch.bfloat16  # autocast's bf16 matmul, not ours
    doubled = torch.nn.Linear(8, 4).double()
    assert lin.linear(x.double(), doubled).dtype == torch.float64


def test_training_caps_onednn_and_ideep_caches_but_a_user_setting_wins(monkeypatch):
    from seqtool.kernels import limit_primitive_cache

    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        monkeypatch.delenv(name, raising=False)
    limit_primitive_cache()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "64"
    assert os.environ["LRU_CACHE_CAPACITY"] == "64"
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "7")
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "9")
    limit_primitive_cache()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "7"
    assert os.environ["LRU_CACHE_CAPACITY"] == "9"


def test_linear_relu_fuses_the_relu_into_the_matrix_product_and_gives_the_same_numbers(monkeypatch):
    from seqtool.precision import quantize_int8

    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 32)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        if lin.ONEDNN:  # float32 on CPU: oneDNN's ReLU post-op
            ops = []
            real = lin._pointwise
            monkeypatch.setattr(lin, "_pointwise", lambda *a: ops.append(a[3]) or real(*a))
            fused = lin.linear_relu(x, layer)
            assert ops == ["relu"]
            assert torch.equal(fused, torch.relu(lin.linear(x, layer)))
        # int8: the ReLU applied in place after the product, the same numbers as the layer + ReLU
        quantized = quantize_int8(torch.nn.Sequential(torch.nn.Linear(16, 32)))[0]
        assert type(quantized) is lin.Int8Linear
        assert torch.equal(lin.linear_relu(x, quantized), torch.relu(quantized(x)))
        assert (lin.linear_relu(x, quantized) >= 0).all()
    # with autograd (training) it is relu(linear(x)) and gradients flow
    x.requires_grad_(True)
    y = lin.linear_relu(x, layer)
    y.sum().backward()
    torch.testing.assert_close(y, torch.relu(torch.nn.functional.linear(x, layer.weight, layer.bias)))
    assert x.grad is not None and layer.weight.grad is not None


def test_log_softmax_in_place_gives_log_softmax_values_and_leaves_others_alone():
    torch.manual_seed(0)
    x = torch.randn(37, 58101) * 5
    x[:, ::11] = float("-inf")  # banned tokens
    want = x.log_softmax(dim=-1)
    mine = x.clone()
    got = lin.log_softmax_(mine)
    assert got.data_ptr() == mine.data_ptr() and torch.equal(got, want)  # in place, the same values
    half = x[:, :100].to(torch.bfloat16)  # another dtype: a new float32 tensor, the input untouched
    kept = half.clone()
    assert torch.equal(lin.log_softmax_(half), half.float().log_softmax(dim=-1)) and torch.equal(half, kept)
    grad = torch.randn(3, 7, requires_grad=True)  # autograd's tensors are never changed in place
    assert torch.equal(lin.log_softmax_(grad), grad.log_softmax(dim=-1))
