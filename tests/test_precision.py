"""Decoding in bf16 and int8: the model is converted once, translates, and stays close to fp32."""

import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

from seqtool.kernels import Int8Linear
from seqtool import checkpoint, precision
from seqtool.cli import app
from seqtool.config import ConfigError, DecodeConfig
from seqtool.translate import Translator

runner = CliRunner()
CPU = torch.device("cpu")


def _lprobs(model, src, tgt_in):
    with torch.inference_mode():
        return model(src, tgt_in).float().log_softmax(-1)  # (B, T, V)


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, 24, (6, 9), generator=g)
    src[:, -1] = 3
    tgt_in = torch.cat([torch.full((6, 1), 2), torch.randint(4, 24, (6, 7), generator=g)], dim=1)
    return src, tgt_in


@pytest.mark.unit
def test_int8_quantizes_every_linear_and_keeps_the_tied_embedding(tiny_checkpoint, batch):
    ckpt = checkpoint.load(tiny_checkpoint)
    fp32 = checkpoint.load_model(ckpt, CPU)
    q = precision.prepare(checkpoint.load_model(ckpt, CPU), CPU, "fp32", "int8")
    assert not any(type(m) is torch.nn.Linear for m in q.modules())
    assert type(q.output) is Int8Linear and type(q.decoder[0].ffn.fc1) is Int8Linear
    assert q.output.weight_t.dtype == torch.int8 and q.output.weight_t.shape == fp32.output.weight.t().shape
    assert q.embed.weight.dtype == torch.float32 and torch.equal(q.embed.weight, fp32.embed.weight)
    ref, got = _lprobs(fp32, *batch), _lprobs(q, *batch)
    err = (got - ref).abs()
    assert err.mean() < 0.05 and err.max() < 0.3  # int8 weights and activations: close, not equal
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9


@pytest.mark.unit
def test_int8_linear_is_the_float_product_within_its_rounding_and_each_row_is_its_own():
    """int8 weights per output channel, activations per row: every output is within the two
    roundings' bound of the float product, and a row's output is bit-equal whatever rows share its
    call (torch's per-tensor activation scale changed it with a large neighbour)."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 48)
    q = Int8Linear.from_linear(layer)
    x = torch.randn(5, 64)
    with torch.no_grad():
        y, ref = q(x), layer(x)
        w_step = layer.weight.abs().amax(1) / 127  # (out,) one weight rounding step
        x_step = x.abs().amax(1, keepdim=True) / 127  # (rows, 1) one activation rounding step
        bound = 0.5 * (x.abs().sum(1, keepdim=True) * w_step + x_step * layer.weight.abs().sum(1)) + 0.25 * x_step * w_step * 64
        assert ((y - ref).abs() <= bound + 1e-5).all()
        s = x.abs().amax(1, keepdim=True).div_(127)  # the same arithmetic with a converted copy (the layer converts in place)
        acc = torch._int_mm(torch.div(x, s).round_().clamp_(-127, 127).to(torch.int8), q.weight_t)
        assert torch.equal(y, acc.float().mul_(s).mul_(q.weight_scale).add_(q.bias))
        big = torch.cat([x[:2], 100 * torch.randn(30, 64), x[2:]])
        together = q(big)
        assert torch.equal(together[:2], y[:2]) and torch.equal(together[32:], y[2:])
        assert torch.equal(q(x[3:4]), y[3:4])
        assert torch.equal(q(x, relu=True), torch.relu(y))
        assert torch.equal(q(x.view(1, 5, 64)), y.view(1, 5, 48))
        assert q(x[:0]).shape == (0, 48)


@pytest.mark.integration
def test_bf16_casts_the_weights_once_and_scores_stay_float32(tiny_checkpoint, batch):
    ckpt = checkpoint.load(tiny_checkpoint)
    fp32 = checkpoint.load_model(ckpt, CPU)
    b = precision.prepare(checkpoint.load_model(ckpt, CPU), CPU, "bf16")
    assert {p.dtype for p in b.parameters()} == {torch.bfloat16}
    ref, got = _lprobs(fp32, *batch), _lprobs(b, *batch)
    assert (got - ref).abs().max() < 0.1
    t = Translator.load(tiny_checkpoint, beam=3, nbest=2, max_len_a=0.0, max_len_b=6, device="cpu", precision="bf16")
    out = t.translate_chunk(0, ["a b c", "", "d e"])
    assert [len(x.hypotheses) for x in out] == [2, 0, 2]
    assert all(isinstance(h.score, float) and h.score <= 0 for x in out for h in x.hypotheses)


@pytest.mark.parametrize("precision_name, quantize", [("fp32", "int8"), ("bf16", "none")])
@pytest.mark.integration
def test_translations_match_fp32_for_most_lines(tiny_checkpoint, precision_name, quantize):
    lines = ["a b c d", "e f g", "h i j a b", "c", "j i h g f e"]
    ref = Translator.load(tiny_checkpoint, beam=2, max_len_a=0.0, max_len_b=6, device="cpu").translate(lines)
    got = Translator.load(tiny_checkpoint, beam=2, max_len_a=0.0, max_len_b=6, device="cpu", precision=precision_name,
                                                        quantize=quantize).translate(lines)
    assert len(got) == len(lines)
    assert sum(a == b for a, b in zip(ref, got)) >= 3


@pytest.mark.unit
def test_impossible_combinations_are_refused():
    with pytest.raises(ConfigError, match="fp16 needs a CUDA device"):
        precision.check(CPU, "fp16", "none")
    with pytest.raises(ConfigError, match="int8 runs on CPU only"):
        precision.check(torch.device("cuda"), "fp32", "int8")
    with pytest.raises(ConfigError, match="drop --precision bf16"):
        DecodeConfig(precision="bf16", quantize="int8")
    with pytest.raises(ConfigError, match="--quantize must be none or int8"):
        DecodeConfig(quantize="int4")


@pytest.mark.integration
def test_fp16_on_cpu_is_a_one_line_error(tiny_checkpoint):
    result = runner.invoke(app, ["translate", "-c", str(tiny_checkpoint), "--device", "cpu", "--precision", "fp16"], input="a\n")
    assert result.exit_code == 1
    assert "--precision fp16 needs a CUDA device" in result.output and "Traceback" not in result.output


@pytest.mark.unit
def test_quantize_option_reaches_the_library_call(monkeypatch):
    import seqtool.files
    import seqtool.translate

    seen = {}
    monkeypatch.setattr(seqtool.files, "translate_file", lambda ckpt, config, *a: seen.update(config=config) or 0)
    result = runner.invoke(app, ["translate", "-c", "m.pt", "--quantize", "int8", "--threads", "2"])
    assert result.exit_code == 0, result.output
    assert (seen["config"].quantize, seen["config"].precision, seen["config"].threads) == ("int8", "auto", 2)  # auto: fp32 with int8


@pytest.mark.system
def test_cli_int8_translates_without_deprecation_noise(tiny_checkpoint):
    result = subprocess.run([sys.executable, "-W", "default", "-m", "seqtool", "translate", "-c", str(tiny_checkpoint),
                             "--beam", "2", "--max-len-a", "0", "--max-len-b", "5", "--device", "cpu", "--quantize", "int8"],
                            input=b"a b\n\nc d e\n", capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.count(b"\n") == 3
    assert b"deprecat" not in result.stderr.lower() and b"Warning" not in result.stderr

