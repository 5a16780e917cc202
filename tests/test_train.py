"""The training loop on tiny data: limits, precisions, checkpoints, metrics, resume rules."""

import json

import pytest
import torch

from seqtool import checkpoint
from seqtool.config import ConfigError, OptimConfig, TrainConfig, model_config_for
from seqtool.textio import InputError
from seqtool.training.train import TrainJob, train

from conftest import binarized_reverse_corpus, interrupted_then_resumed, tiny_job


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return binarized_reverse_corpus(tmp_path_factory.mktemp("train"))


def _job(data_dir, save_dir, **train):
    return tiny_job(data_dir, save_dir, **train)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.integration
def test_training_writes_self_contained_checkpoints(data_dir, tmp_path, precision):
    result = train(_job(data_dir, tmp_path / "run", max_updates=4, precision=precision, device="cpu"))
    assert result.updates == 4 and result.stopped_by == "max-updates"
    best = checkpoint.load(tmp_path / "run" / "best.pt")
    assert "train_state" not in best  # the small file users ship
    assert "train_state" in checkpoint.load(tmp_path / "run" / "last.pt")
    model = checkpoint.load_model(best)
    assert model.config.vocab_size == 25 and model.config.d_model == 128
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in records} == {"train", "valid"}
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in records)
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["train"]["precision"] == precision


@pytest.mark.integration
def test_loss_goes_down(data_dir, tmp_path):
    train(_job(data_dir, tmp_path / "run", max_updates=40, validate_interval_updates=20))
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    first_train = next(r["loss"] for r in records if r["kind"] == "train")
    valid = [r["loss"] for r in records if r["kind"] == "valid"]
    assert valid[-1] < first_train - 1.0 and valid[-1] < valid[0]


@pytest.mark.integration
def test_the_heap_is_trimmed_around_each_validation_and_save(data_dir, tmp_path, monkeypatch):
    """CPU training hands free heap pages back just before validating and just after the checkpoint
    is written, whenever the once-a-second trims last ran (the protocol's peak RSS came right there)."""
    from seqtool import allocator
    from seqtool.training.train import Trainer

    events = []
    monkeypatch.setattr(allocator.HeapTrimmer, "__call__", lambda self, now, force=False: events.append(("trim", force)))
    validate, save = Trainer.validate, Trainer._save
    monkeypatch.setattr(Trainer, "validate", lambda self: (events.append("validate"), validate(self))[1])
    monkeypatch.setattr(Trainer, "_save", lambda self, *a, **k: (events.append("save"), save(self, *a, **k))[1])
    train(_job(data_dir, tmp_path / "run", max_updates=6, validate_interval_updates=3, device="cpu"))
    assert events.count("validate") == 2 and events.count(("trim", False)) == 6  # one offer per update
    for k, e in enumerate(events):
        if e == "validate":
            assert events[k - 1] == ("trim", True) and events[k + 1:k + 3] == ["save", ("trim", True)]


@pytest.mark.integration
def test_epoch_and_time_limits(data_dir, tmp_path):
    r = train(_job(data_dir, tmp_path / "a", max_epochs=1))
    assert r.stopped_by == "max-epochs" and r.epochs == pytest.approx(1.0)
    r = train(_job(data_dir, tmp_path / "b", max_time=0.01))
    assert r.stopped_by == "max-time" and r.updates == 1


@pytest.mark.integration
def test_resume_continues_and_refuses_another_configuration(data_dir, tmp_path):
    train(_job(data_dir, tmp_path / "run", max_updates=3))
    r = train(_job(data_dir, tmp_path / "run", max_updates=5))
    assert r.updates == 5
    with pytest.raises(ConfigError, match="max_tokens: saved 600, now 700"):
        train(_job(data_dir, tmp_path / "run", max_updates=8, max_tokens=700))


@pytest.mark.parametrize("schedule", ["linear", "inverse-sqrt"])
@pytest.mark.integration
def test_resumed_run_equals_an_uninterrupted_one(data_dir, tmp_path, monkeypatch, schedule):
    """Interrupted in the middle of the decay (update 5 of 8, warmup 2) and resumed with the same
    command: the weights and the learning rates equal those of the run that was never stopped."""
    def job(save):
        return TrainJob(save_dir=save, model=model_config_for("tiny"), optim=OptimConfig(warmup=2, lr_schedule=schedule),
                        train=TrainConfig(max_tokens=600, threads=2, max_updates=8, log_interval=0.0), data_dir=data_dir)

    train(job(tmp_path / "once"))
    interrupted_then_resumed(job(tmp_path / "twice"), 5, monkeypatch)
    a = checkpoint.load(tmp_path / "once" / "last.pt")["weights"]
    b = checkpoint.load(tmp_path / "twice" / "last.pt")["weights"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)

    def lrs(save):
        records = [json.loads(x) for x in (save / "metrics.jsonl").read_text().splitlines()]
        return {r["update"]: r["lr"] for r in records if r["kind"] == "train"}
    assert lrs(tmp_path / "twice") == lrs(tmp_path / "once") and len(lrs(tmp_path / "once")) == 8


@pytest.mark.integration
def test_plain_progress_lines_when_stderr_is_not_a_terminal(data_dir, tmp_path, capsys):
    train(_job(data_dir, tmp_path / "run", max_updates=2, log_interval=0.0))
    err = capsys.readouterr().err
    assert "update 1/2" in err and "tok/s" in err and "\x1b[" not in err


@pytest.mark.integration
def test_no_pair_fits_the_budget(data_dir, tmp_path):
    with pytest.raises(InputError, match="no training pair fits --max-tokens 5"):
        train(_job(data_dir, tmp_path / "run", max_tokens=5, max_updates=1))


@pytest.mark.integration
def test_cuda_requested_without_cuda_is_a_clear_error(data_dir, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError, match="no CUDA device"):
        train(_job(data_dir, tmp_path / "run", max_updates=1, device="cuda"))


@pytest.mark.system
def test_sigterm_saves_last_checkpoint_and_the_run_resumes(data_dir, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    save = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "seqtool", "train", str(data_dir), "--save-dir", str(save), "--arch", "tiny",
                             "--max-tokens", "600", "--threads", "1"], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120  # until the first update's record (the trainer writes one after update 1): no fixed sleep
    while time.time() < deadline and '"kind": "train"' not in ((save / "metrics.jsonl").read_text() if (save / "metrics.jsonl").exists() else ""):
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "saved" in err and "Traceback" not in err
    ckpt = checkpoint.load(save / "last.pt")
    assert ckpt["train_state"]["progress"]["updates"] >= 1
    assert os.path.exists(save / "config.json")
