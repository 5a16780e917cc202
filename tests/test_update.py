"""One optimizer update (update.py): fp16 loss scaling (skip, back off, stop with advice), clipping
in true units, accumulation over micro-batches, --precision auto, the --compile fallback,
out-of-memory advice, and the new train options reaching the library call."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from seqtool.training import update
from seqtool.cli import app
from seqtool.config import ConfigError, OptimConfig, TrainConfig, model_config_for
from seqtool.model import Transformer
from seqtool.training.train import TrainJob, train

from conftest import binarized_reverse_corpus, tiny_job

CPU = torch.device("cpu")
V = 40


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return binarized_reverse_corpus(tmp_path_factory.mktemp("update"))


def _job(data_dir, save_dir, **train_options):
    train_options.setdefault("device", "cpu")
    return tiny_job(data_dir, save_dir, **train_options)


def _batch(seed: int = 0, rows: int = 4, src_len: int = 7, tgt_len: int = 6):
    """Random ids without padding: (src, tgt_in, tgt_out)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (rows, src_len), generator=g)
    tgt = torch.randint(4, V, (rows, tgt_len + 1), generator=g)
    return src, tgt[:, :-1].contiguous(), tgt[:, 1:].contiguous()


def _model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(model_config_for("tiny", vocab_size=V, dropout=0.0, max_positions=64))


def _updater(model, precision="fp32", clip=0.0, optimizer=None, **options) -> update.Updater:
    opt = optimizer or update.build_optimizer(model.parameters(), OptimConfig(lr=1e-3))
    return update.Updater(update.TrainingLoss(model, 0.1), opt, CPU, precision, clip, **options)


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ---- fp16 loss scaling -----------------------------------------------------------------------
@pytest.mark.unit
def test_fp16_overflow_skips_the_step_backs_off_and_recovers():
    model = _model()
    up = _updater(model, "fp16", init_scale=2.0 ** 100)  # loss x 2^100 overflows float16 gradients
    before = _weights(model)
    up.step([_batch()], 1 / 24)
    assert up.skipped == 1 and up.consecutive_skips == 1
    assert up.scaler.get_scale() == 2.0 ** 99  # backed off by half
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name  # the step was skipped: weights unchanged
    assert all(p.grad is None for p in model.parameters())  # and the bad gradients are gone
    assert all(float(s["step"]) == 0 for s in up.optimizer.state.values())  # Adam counted no step

    up.scaler.update(new_scale=2.0 ** 8)  # a scale that fits: the next update goes through
    up.step([_batch()], 1 / 24)
    assert up.skipped == 1 and up.consecutive_skips == 0
    assert any(not torch.equal(value, before[name]) for name, value in model.state_dict().items())


@pytest.mark.unit
def test_fp16_scale_grows_after_a_clean_stretch():
    up = _updater(_model(), "fp16")
    up.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=2)
    for seed in range(2):
        up.step([_batch(seed)], 1 / 24)
    assert up.skipped == 0 and up.scaler.get_scale() == 2.0 ** 9


@pytest.mark.unit
def test_repeated_overflow_stops_with_what_to_change():
    model = _model()
    up = _updater(model, "fp16", clip=0.0, max_overflows=3)
    with torch.no_grad():
        model.encoder[0].ffn.fc1.weight[0, 0] = float("nan")  # every gradient becomes nan
    up.step([_batch()], 1 / 24)
    up.step([_batch()], 1 / 24)
    with pytest.raises(update.Diverged) as info:
        up.step([_batch()], 1 / 24)
    message = str(info.value)
    assert isinstance(info.value, ConfigError)  # the CLI prints it as one line
    assert "3 updates in a row" in message
    for advice in ("Lower --lr (learning rate now 0.001)", "set --clip-norm", "now off", "--precision bf16"):
        assert advice in message, (advice, message)
    assert "minimum loss scale" not in message.lower()


@pytest.mark.unit
def test_loss_scale_below_the_floor_stops_too():
    model = _model()
    up = _updater(model, "fp16", init_scale=1.0, min_scale=0.75)
    with torch.no_grad():
        model.encoder[0].ffn.fc1.weight[0, 0] = float("inf")
    with pytest.raises(update.Diverged, match="loss scale now 0.5"):
        up.step([_batch()], 1 / 24)


@pytest.mark.unit
def test_gradients_are_unscaled_before_clipping():
    # reference: the true gradient norm, float32, no scaling
    ref_model = _model()
    loss, _ = update.TrainingLoss(ref_model, 0.1)(*_batch())
    (loss / 24).backward()
    true_norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in ref_model.parameters() if p.grad is not None])))

    model = _model()
    seen = {}
    sgd = torch.optim.SGD(model.parameters(), lr=0.0)
    plain_step = sgd.step

    def recording_step(*args, **kwargs):  # the gradients the optimizer is given
        seen["norm"] = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None])))
        return plain_step(*args, **kwargs)

    sgd.step = recording_step
    clip = true_norm / 10
    up = _updater(model, "fp16", clip=clip, optimizer=sgd)  # loss scale 2^16
    up.step([_batch()], 1 / 24)
    assert up.skipped == 0
    # the norm clip_grad_norm_ measured is in true units (fp16 forward: a few percent off), not x 65536
    assert float(up.grad_norm) == pytest.approx(true_norm, rel=0.05)
    # and the optimizer received gradients clipped to exactly clip_norm, in true units
    assert seen["norm"] == pytest.approx(clip, rel=1e-3)


@pytest.mark.unit
def test_micro_batches_accumulate_to_the_update_of_their_concatenation():
    a, b = _batch(1), _batch(2)
    both = tuple(torch.cat([x, y]) for x, y in zip(a, b))
    tokens = a[2].numel() + b[2].numel()
    split_model, joint_model = _model(), _model()
    split = _updater(split_model, clip=1.0, optimizer=torch.optim.SGD(split_model.parameters(), lr=0.5))
    joint = _updater(joint_model, clip=1.0, optimizer=torch.optim.SGD(joint_model.parameters(), lr=0.5))
    split.step([a, b], 1 / tokens)
    joint.step([both], 1 / tokens)
    torch.testing.assert_close(split.grad_norm, joint.grad_norm, rtol=1e-5, atol=1e-7)
    for name, value in split_model.state_dict().items():
        torch.testing.assert_close(value, joint_model.state_dict()[name], rtol=1e-5, atol=1e-6)


# ---- choices made for the device -------------------------------------------------------------
@pytest.mark.unit
def test_precision_auto_resolves_per_device(monkeypatch):
    from seqtool import device as device_module

    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(device_module, "cuda_has_bf16", lambda device: True)
    assert device_module.resolve_precision("auto", cuda, "train") == "bf16"
    assert device_module.resolve_precision("auto", cuda, "translate") == "bf16"
    monkeypatch.setattr(device_module, "cuda_has_bf16", lambda device: False)
    assert device_module.resolve_precision("auto", cuda, "translate") == "fp32"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    assert device_module.resolve_precision("auto", cuda, "train") == "fp16"
    assert device_module.resolve_precision("fp32", cuda, "train") == "fp32"
    with pytest.raises(ConfigError, match=r"compute capability 7\.0\) has no bfloat16.*--precision fp16"):
        device_module.resolve_precision("bf16", cuda, "train")


@pytest.mark.integration
def test_precision_auto_trains_in_what_this_cpu_runs_fast(data_dir, tmp_path, capsys):
    from seqtool.device import cpu_bf16_instructions

    assert TrainConfig().precision == "auto"
    train(_job(data_dir, tmp_path / "run", max_updates=1))
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["train"]["precision"] == ("bf16" if cpu_bf16_instructions() else "fp32")
    assert f"--precision auto: {saved['train']['precision']} (this CPU" in capsys.readouterr().err


@pytest.mark.unit
def test_optimizer_is_adamw_with_one_fused_or_foreach_kernel(monkeypatch):
    model = _model()
    opt = update.build_optimizer(model.parameters(), OptimConfig(weight_decay=0.01))
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.defaults["fused"] or opt.defaults["foreach"]
    original = torch.optim.AdamW

    def no_fused(params, **kwargs):
        if kwargs.get("fused"):
            list(params)  # consumes a generator, as a failing constructor may
            raise RuntimeError("fused=True requires all the params to be floating point Tensors of supported devices")
        return original(params, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", no_fused)
    opt = update.build_optimizer(model.parameters(), OptimConfig())
    assert opt.defaults["foreach"] and len(opt.param_groups[0]["params"]) == len(list(model.parameters()))


def _linear_output_dtypes(monkeypatch, run) -> set:
    """dtypes of the outputs of every F.linear and F.layer_norm call made by run()."""
    seen = set()
    F = torch.nn.functional
    for name in ("linear", "layer_norm"):
        def recording(*args, _original=getattr(F, name), **kwargs):
            out = _original(*args, **kwargs)
            seen.add(out.dtype)
            return out

        monkeypatch.setattr(F, name, recording)
    try:
        run()
    finally:
        monkeypatch.undo()
    return seen


@pytest.mark.unit
def test_autocast_keeps_fp32_master_weights(monkeypatch):
    # the CUDA scheme (autocast), exercised on CPU: bf16 computation, float32 weights and state
    monkeypatch.setattr(update, "activation_dtype", lambda device, precision: None)
    model = _model()
    up = _updater(model, "bf16")
    assert torch.bfloat16 in _linear_output_dtypes(monkeypatch, lambda: up.step([_batch()], 1 / 24))
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(s["exp_avg"].dtype == torch.float32 for s in up.optimizer.state.values())


@pytest.mark.unit
def test_cpu_bf16_trains_bf16_activations_on_float32_master_weights(monkeypatch):
    assert update.activation_dtype(CPU, "bf16") == torch.bfloat16
    assert update.activation_dtype(CPU, "fp32") is None
    assert update.activation_dtype(torch.device("cuda"), "bf16") is None  # GPUs keep autocast
    model, reference = _model(), _model()
    model.activation_dtype = torch.bfloat16
    up, ref = _updater(model, "bf16"), _updater(reference, "fp32")
    # every linear layer and layer norm computes in bf16, with no autocast around it
    assert _linear_output_dtypes(monkeypatch, lambda: up.step([_batch()], 1 / 24)) == {torch.bfloat16}
    ref.step([_batch()], 1 / 24)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(s["exp_avg"].dtype == torch.float32 for s in up.optimizer.state.values())
    # the float32 gradients are bf16-close to float32 training's: same direction, same size
    loss_fn, ref_fn = update.TrainingLoss(model, 0.1), update.TrainingLoss(reference, 0.1)
    reference.load_state_dict(model.state_dict())
    (loss_fn(*_batch(1))[0]).backward()
    (ref_fn(*_batch(1))[0]).backward()
    g = torch.cat([p.grad.flatten() for p in model.parameters()])
    g_ref = torch.cat([p.grad.flatten() for p in reference.parameters()])
    assert g.dtype == torch.float32
    assert torch.nn.functional.cosine_similarity(g, g_ref, dim=0) > 0.99
    assert g.norm() == pytest.approx(g_ref.norm().item(), rel=0.05)
    # validation's loss and incremental decoding: a model in eval mode
    model.eval()
    with torch.no_grad():
        memory, src_pad = model.encode(_batch()[0])
        assert memory.dtype == torch.bfloat16  # whole-sequence passes keep bf16
        cache = model.new_cache(memory, src_pad)
        step = model.decode(torch.full((4, 1), model.config.bos_id), memory, src_pad, cache)
        assert step.dtype == torch.float32  # decoding steps do not cast every weight at every step


# ---- --compile falls back to eager ---------------------------------------------------------
@pytest.mark.integration
def test_compile_unavailable_falls_back_to_eager(monkeypatch, data_dir, tmp_path, capsys):
    def unavailable(*args, **kwargs):
        raise RuntimeError("torch.compile is not supported on this platform")

    monkeypatch.setattr(torch, "compile", unavailable)
    result = train(_job(data_dir, tmp_path / "run", max_updates=2, compile=True))
    assert result.updates == 2
    err = capsys.readouterr().err
    assert "warning: --compile: torch.compile is not available here" in err and "not supported on this platform" in err


@pytest.mark.unit
def test_compile_failing_at_the_first_call_falls_back_to_eager(monkeypatch):
    calls = []

    def lazily_broken(module, **kwargs):
        def compiled(*args):
            calls.append(1)
            raise RuntimeError("InductorError: no working C++ compiler found")
        return compiled

    monkeypatch.setattr(torch, "compile", lazily_broken)
    compiled_model, eager_model = _model(), _model()
    with_compile = _updater(compiled_model, compile=True)
    without = _updater(eager_model)
    for seed in range(2):
        with_compile.step([_batch(seed)], 1 / 24)
        without.step([_batch(seed)], 1 / 24)
    assert calls == [1] and with_compile.compiled is None  # tried once, then eager for good
    for name, value in compiled_model.state_dict().items():
        assert torch.equal(value, eager_model.state_dict()[name]), name


@pytest.mark.unit
def test_errors_after_a_successful_compiled_call_are_not_swallowed(monkeypatch):
    state = {"n": 0}

    def flaky(module, **kwargs):
        def compiled(*args):
            state["n"] += 1
            if state["n"] > 1:
                raise ValueError("a real bug in the model")
            return module(*args)
        return compiled

    monkeypatch.setattr(torch, "compile", flaky)
    up = _updater(_model(), compile=True)
    up.step([_batch()], 1 / 24)
    with pytest.raises(ValueError, match="a real bug"):
        up.step([_batch()], 1 / 24)


# ---- out of memory -------------------------------------------------------------------------
def _oom(*args, **kwargs):
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


@pytest.mark.integration
def test_out_of_memory_says_what_to_lower(monkeypatch, data_dir, tmp_path):
    monkeypatch.setattr(update.Updater, "step", _oom)
    with pytest.raises(update.OutOfMemory) as info:
        train(_job(data_dir, tmp_path / "run", max_updates=2, update_freq=3, precision="fp32"))
    message = str(info.value)
    assert message.startswith("cpu: out of memory while training")
    assert "lower --max-tokens (now 600; --max-tokens 300 --update-freq 6 keeps the effective batch)" in message
    assert "--precision bf16" in message and "smaller --arch" in message
    assert "Tried to allocate" not in message


@pytest.mark.integration
def test_out_of_memory_is_one_line_on_the_command_line(monkeypatch, data_dir, tmp_path):
    monkeypatch.setattr(update.Updater, "step", _oom)
    result = CliRunner().invoke(app, ["train", str(data_dir), "--save-dir", str(tmp_path / "run"), "--arch", "tiny",
                                      "--max-tokens", "600", "--threads", "1", "--device", "cpu", "--precision", "bf16"])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "out of memory" in lines[0] and "--max-tokens" in lines[0]
    assert "--precision bf16" not in lines[0]  # already bf16: not advised again
    assert "Traceback" not in result.stderr


# ---- the command line ------------------------------------------------------------------------
@pytest.mark.unit
def test_train_cli_passes_the_scaling_options(monkeypatch, tmp_path):
    import seqtool.training.train

    seen = []

    def fake_train(job):
        seen.append(job)
        return seqtool.training.train.TrainResult(1, 0.1, 1.0, 1.0, 10, 1.0, 0, job.save_dir, "max-updates")

    monkeypatch.setattr(seqtool.training.train, "train", fake_train)
    runner = CliRunner()
    base = ["train", str(tmp_path / "data"), "--save-dir", str(tmp_path / "run")]
    result = runner.invoke(app, base + ["--update-freq", "4", "--dist-timeout", "30", "--compile", "--precision", "fp16"])
    assert result.exit_code == 0, result.output
    t = seen[-1].train
    assert (t.update_freq, t.dist_timeout, t.compile, t.precision) == (4, 30.0, True, "fp16")
    result = runner.invoke(app, base)
    assert result.exit_code == 0, result.output
    t = seen[-1].train
    assert (t.update_freq, t.dist_timeout, t.compile, t.precision) == (1, 600.0, False, "auto")


@pytest.mark.parametrize("options, fragment", [
    (dict(update_freq=0), "--update-freq must be >= 1"),
    (dict(dist_timeout=0), "--dist-timeout must be > 0"),
    (dict(precision="fp8"), "--precision must be auto, fp32, bf16 or fp16"),
])
@pytest.mark.unit
def test_bad_scaling_options_are_refused(options, fragment):
    with pytest.raises(ConfigError, match=fragment):
        TrainConfig(**options)
