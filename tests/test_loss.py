"""The training loss (loss.py): label-smoothed cross-entropy formed a block of rows at a time must equal
torch's cross_entropy over the whole logits, in value and in gradient, whatever the block size."""

import pytest
import torch

from seqtool.training import loss as loss_mod
from seqtool.training.loss import label_smoothed_nll

pytestmark = pytest.mark.unit


@pytest.fixture(params=[1 << 30, 4 * 13 * 64], ids=["one block", "blocks of 64 rows"])
def blocks(request, monkeypatch):
    monkeypatch.setattr(loss_mod, "ROWS_BYTES", request.param)
    return request.param


def _reference(feats, out, target, smoothing):
    keep = target.ne(0)
    logits = out(feats)[keep]
    return (torch.nn.functional.cross_entropy(logits, target[keep], label_smoothing=smoothing, reduction="sum"),
            torch.nn.functional.cross_entropy(logits, target[keep], reduction="sum"))


def test_label_smoothed_loss_ignores_padding_and_matches_torch():
    torch.manual_seed(0)
    out = torch.nn.Linear(8, 11, bias=False)
    feats = torch.randn(2, 4, 8)
    target = torch.tensor([[5, 6, 7, 0], [4, 0, 0, 0]])
    loss, nll, n = label_smoothed_nll(feats, out, target, 0, 0.1)
    assert n == 4
    keep = target.ne(0)
    logits = out(feats)[keep]
    ref = torch.nn.functional.cross_entropy(logits, target[keep], label_smoothing=0.1, reduction="sum")
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(nll, torch.nn.functional.cross_entropy(logits, target[keep], reduction="sum"))


def test_hand_written_loss_gradient_matches_autograd(blocks):
    torch.manual_seed(0)
    out = torch.nn.Linear(8, 13, bias=False)
    feats = torch.randn(3, 5, 8, requires_grad=True)
    target = torch.tensor([[5, 6, 7, 0, 0], [4, 12, 1, 9, 0], [3, 3, 3, 3, 3]])
    loss, _, _ = label_smoothed_nll(feats, out, target, 0, 0.1)
    loss.backward()
    mine = feats.grad.clone(), out.weight.grad.clone()
    feats.grad = None
    out.weight.grad = None
    keep = target.ne(0)
    ref = torch.nn.functional.cross_entropy(out(feats)[keep], target[keep], label_smoothing=0.1, reduction="sum")
    ref.backward()
    torch.testing.assert_close(mine[0], feats.grad)
    torch.testing.assert_close(mine[1], out.weight.grad)


@pytest.mark.parametrize("bias", [False, True])
def test_loss_stays_exact_when_the_target_probability_underflows(bias, blocks):
    torch.manual_seed(0)
    out = torch.nn.Linear(8, 13, bias=bias)
    feats = torch.randn(2, 3, 8, requires_grad=True)
    with torch.no_grad():
        out.weight[5] += 40.0 * feats.detach()[0, 0]  # token 5 dominates position (0, 0): p(target) ~ 0
    target = torch.tensor([[6, 6, 7], [4, 12, 0]])
    loss, nll, n = label_smoothed_nll(feats, out, target, 0, 0.1)
    keep = target.ne(0)
    logits = out(feats)[keep]
    ref = torch.nn.functional.cross_entropy(logits, target[keep], label_smoothing=0.1, reduction="sum")
    assert float(nll) > 100  # beyond float32's smallest probability
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(nll, torch.nn.functional.cross_entropy(logits, target[keep], reduction="sum"))
    g_mine = torch.autograd.grad(loss, (feats, out.weight))
    g_ref = torch.autograd.grad(ref, (feats, out.weight))
    for a, b in zip(g_mine, g_ref):
        torch.testing.assert_close(a, b)



@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_blocks_add_up_to_the_whole_loss_and_its_gradients(bias, smoothing, blocks):
    # 300 rows: several 64-row blocks and a short last one
    torch.manual_seed(1)
    out = torch.nn.Linear(16, 13, bias=bias)
    feats = torch.randn(30, 10, 16, requires_grad=True)
    target = torch.randint(1, 13, (30, 10))
    target[::3, 7:] = 0  # padding inside the batch
    loss, nll, n = label_smoothed_nll(feats, out, target, 0, smoothing)
    ref_loss, ref_nll = _reference(feats, out, target, smoothing)
    assert n == int(target.ne(0).sum())
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(nll, ref_nll)
    params = (feats, out.weight) + ((out.bias,) if bias else ())
    mine = torch.autograd.grad(3.0 * loss, params)  # the incoming gradient scales what forward formed
    ref = torch.autograd.grad(3.0 * ref_loss, params)
    for a, b in zip(mine, ref):  # float32 sums over 300 rows in another order: a few ulps of a weight's gradient (~10)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert feats.grad is None and out.weight.grad is None


def test_no_gradient_work_without_autograd(blocks):
    torch.manual_seed(0)
    out = torch.nn.Linear(8, 13)
    feats = torch.randn(4, 6, 8)
    target = torch.randint(1, 13, (4, 6))
    with torch.no_grad():
        loss, nll, _ = label_smoothed_nll(feats, out, target, 0, 0.1)
    assert not loss.requires_grad
    ref_loss, ref_nll = _reference(feats, out, target, 0.1)
    torch.testing.assert_close(loss, ref_loss.detach())


def test_bf16_activations_with_float32_weights_give_float32_weight_gradients(blocks):
    # CPU bf16 training: bf16 features, float32 master weights (cast inside), float32 loss
    torch.manual_seed(0)
    out = torch.nn.Linear(16, 50, bias=False)
    feats32 = torch.randn(20, 16)
    feats = feats32.to(torch.bfloat16).requires_grad_()
    target = torch.randint(1, 50, (20,)).view(4, 5)
    loss, nll, _ = label_smoothed_nll(feats.view(4, 5, 16), out, target, 0, 0.1)
    assert loss.dtype == nll.dtype == torch.float32
    ref_loss, _ = _reference(feats.detach().float().view(4, 5, 16), out, target, 0.1)
    torch.testing.assert_close(loss, ref_loss, atol=0.05 * float(ref_loss.detach().abs()) / 20, rtol=0.02)
    loss.backward()
    assert feats.grad.dtype == torch.bfloat16 and out.weight.grad.dtype == torch.float32
    ref_feats = feats.detach().float().requires_grad_()
    out.weight.grad = None
    _reference(ref_feats.view(4, 5, 16), out, target, 0.1)[0].backward()
    torch.testing.assert_close(feats.grad.float(), ref_feats.grad, atol=3e-2, rtol=3e-2)


def test_bf16_loss_stays_exact_when_the_target_probability_underflows(blocks):
    # the bf16 path keeps its 16-bit logits; rows whose target probability underflows take their
    # log-sum-exp from them, so the loss is that of the bf16 logits (computed here in float64)
    torch.manual_seed(0)
    out = torch.nn.Linear(8, 13, bias=False)
    feats = torch.randn(2, 3, 8).to(torch.bfloat16)
    with torch.no_grad():
        out.weight[5] += 40.0 * feats[0, 0].float()
    target = torch.tensor([[6, 6, 7], [4, 12, 3]])
    with torch.no_grad():
        loss, nll, _ = label_smoothed_nll(feats, out, target, 0, 0.0)
        logits = (feats.view(-1, 8) @ out.weight.to(torch.bfloat16).t()).double()  # the bf16 products, exactly
        ref = torch.nn.functional.cross_entropy(logits, target.view(-1), reduction="sum")
    assert float(nll) > 100
    assert float(nll) == pytest.approx(float(ref), rel=1e-5)
    assert float(loss) == pytest.approx(float(ref), rel=1e-5)


def test_reused_block_buffers_leave_no_trace_between_calls(blocks):
    # the blocks' buffers outlive a call (loss.py's _scratch): a larger call, then a smaller one,
    # then the larger again give what fresh buffers give
    torch.manual_seed(2)
    out = torch.nn.Linear(16, 40, bias=False)
    calls = [(torch.randn(6, 9, 16), torch.randint(1, 40, (6, 9))), (torch.randn(2, 3, 16), torch.randint(1, 40, (2, 3)))]
    for dtype in (torch.bfloat16, torch.float32):
        results = []
        for feats, target in calls + calls[:1]:
            f = feats.to(dtype).requires_grad_()
            loss, nll, _ = label_smoothed_nll(f, out, target, 0, 0.1)
            results.append((loss.item(), nll.item(), torch.autograd.grad(loss, (f, out.weight))))
        assert results[0][:2] == results[2][:2]
        for a, b in zip(results[0][2], results[2][2]):
            assert torch.equal(a, b)
        loss_mod._SCRATCH.clear()  # fresh buffers give the same numbers
        f = calls[1][0].to(dtype).requires_grad_()
        loss, nll, _ = label_smoothed_nll(f, out, calls[1][1], 0, 0.1)
        assert (loss.item(), nll.item()) == results[1][:2]


def test_block_rows_fill_the_byte_budget_in_multiples_of_64():
    assert loss_mod.block_rows(8000) == (16 << 20) // (4 * 8000) // 64 * 64
    assert loss_mod.block_rows(8000) % 64 == 0
    assert loss_mod.block_rows(10_000_000) == 64
