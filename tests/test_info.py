"""`seqtool info CKPT`: configs, size, parameters, format, progress, training state, tokenizer."""

import json

import pytest
from typer.testing import CliRunner

from seqtool import checkpoint
from seqtool.cli import app
from seqtool.config import OptimConfig, TrainConfig, model_config_for
from seqtool.info import describe
from seqtool.training.train import TrainJob, train

pytestmark = pytest.mark.integration

runner = CliRunner()


@pytest.fixture(scope="module")
def run_dir(small_corpus, tmp_path_factory):
    save = tmp_path_factory.mktemp("info") / "run"
    train(TrainJob(save_dir=save, model=model_config_for("tiny"), optim=OptimConfig(warmup=10),
                   train=TrainConfig(max_tokens=600, threads=2, max_updates=3), data_dir=small_corpus / "bin"))
    return save


def _parameters(path):
    return sum(p.numel() for p in checkpoint.load_model(checkpoint.load(path)).parameters())


def test_info_of_last_pt(run_dir):
    result = runner.invoke(app, ["info", str(run_dir / "last.pt")])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "weights + training state" in out and "resumable" in out
    assert f"{_parameters(run_dir / 'last.pt'):,}" in out
    assert "25 pieces" in out and "version 1" in out and "updates 3" in out
    assert "best valid loss" in out and "d_model=128" in out and "max_tokens=600" in out
    assert "kB" in out or "MB" in out  # rich.filesize's decimal units


def test_info_of_best_pt_as_json(run_dir):
    result = runner.invoke(app, ["info", str(run_dir / "best.pt"), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["has_training_state"] is False and data["kind"] == "weights"
    assert data["file_bytes"] == (run_dir / "best.pt").stat().st_size
    assert data["format_version"] == checkpoint.FORMAT_VERSION
    assert data["parameters"] == _parameters(run_dir / "best.pt")
    assert data["vocab_size"] == 25 and data["configs"]["model"]["d_model"] == 128
    assert data["progress"]["updates"] == 3 and data["progress"]["best_valid_loss"] == pytest.approx(data["valid"]["loss"])
    assert data["valid"]["bleu"] is None


def test_info_of_a_checkpoint_without_progress(tiny_checkpoint):
    info = describe(tiny_checkpoint)
    assert not info.has_training_state and info.progress == {} and info.vocab_size == 24
    assert "weights only" in info.to_text()


@pytest.mark.parametrize("content, message", [(None, "no such checkpoint"), (b"not a checkpoint", "a text file, not a checkpoint"),
                                              (b"\x00\x01binary", "truncated or corrupted")])
def test_missing_or_corrupt_file_is_one_line(tmp_path, content, message):
    path = tmp_path / "x.pt"
    if content is not None:
        path.write_bytes(content)
    result = runner.invoke(app, ["info", str(path)])
    assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output


def test_info_options_reach_the_library_call(monkeypatch, run_dir):
    import seqtool.info

    seen = []
    real = seqtool.info.describe
    monkeypatch.setattr(seqtool.info, "describe", lambda path: seen.append(path) or real(path))
    result = runner.invoke(app, ["info", str(run_dir / "best.pt"), "--json"])
    assert result.exit_code == 0 and seen == [run_dir / "best.pt"]
    assert runner.invoke(app, ["info", "--help"]).exit_code == 0
