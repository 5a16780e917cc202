"""--finetune CKPT: fresh training state from a checkpoint's weights, model and tokenizer."""

import json

import pytest
import torch
from typer.testing import CliRunner

from seqtool import checkpoint
from seqtool.binarize import SplitSpec, binarize
from seqtool.cli import app
from seqtool.config import ConfigError, OptimConfig, TokenizerConfig, TrainConfig, model_config_for
from seqtool.training.finetune import Finetune
from seqtool.textio import InputError
from seqtool.tokenizer import train_tokenizer
from seqtool.training.train import RawData, Trainer, TrainJob, train

from conftest import tiny_job


@pytest.fixture(scope="module")
def parent(small_corpus, tmp_path_factory):
    """A tiny model trained for 3 updates: best.pt and last.pt to fine-tune from."""
    save = tmp_path_factory.mktemp("parent") / "run"
    train(_job(small_corpus, save, max_updates=3))
    return save


def _job(corpus, save_dir, finetune=None, model="tiny", **train_options):
    return tiny_job(corpus / "bin", save_dir, model, finetune, **train_options)


@pytest.mark.integration
def test_finetune_starts_at_update_0_from_the_checkpoint_weights_and_model(small_corpus, parent, tmp_path):
    # the job asks for the default (small) model: the checkpoint's tiny one is used instead
    trainer = Trainer(_job(small_corpus, tmp_path / "ft", Finetune(parent / "best.pt"), model="small", max_updates=2))
    source = checkpoint.load(parent / "best.pt")
    assert trainer.state.updates == 0 and not trainer.optimizer.state  # fresh progress and optimizer
    assert trainer.model_config.to_dict() == source["model_config"]
    for name, value in checkpoint.model_state(trainer.model).items():
        assert torch.equal(value, source["weights"][name]), name
    result = trainer.run()
    assert result.updates == 2
    saved = json.loads((tmp_path / "ft" / "config.json").read_text())
    assert saved["finetune"] == {"checkpoint": str(parent / "best.pt"), "weights_sha256": source["weights_sha256"]}
    assert checkpoint.tokenizer_bytes(checkpoint.load(tmp_path / "ft" / "best.pt")) == checkpoint.tokenizer_bytes(source)


@pytest.mark.integration
def test_a_finetune_run_resumes_from_its_own_last_pt(small_corpus, parent, tmp_path):
    train(_job(small_corpus, tmp_path / "ft", Finetune(parent / "last.pt"), max_updates=2))
    result = train(_job(small_corpus, tmp_path / "ft", Finetune(parent / "last.pt"), max_updates=4))
    assert result.updates == 4
    with pytest.raises(ConfigError, match="finetune"):  # not the run it was: refuse, listing the difference
        train(_job(small_corpus, tmp_path / "ft", None, max_updates=6))


@pytest.mark.integration
def test_raw_files_are_binarized_with_the_checkpoint_tokenizer(small_corpus, parent, tmp_path):
    # a new tokenizer of 8000 pieces cannot be trained on this tiny corpus: success means none was
    job = TrainJob(save_dir=tmp_path / "ft", model=model_config_for("small"), optim=OptimConfig(warmup=10),
                   train=TrainConfig(max_tokens=600, threads=2, max_updates=1, src_lang="src", tgt_lang="tgt"),
                   raw=RawData(str(small_corpus / "train"), str(small_corpus / "valid"), TokenizerConfig(vocab_size=8000)),
                   finetune=Finetune(parent / "best.pt"))
    assert train(job).updates == 1
    source = checkpoint.load(parent / "best.pt")
    assert (tmp_path / "ft" / "data" / "tokenizer.model").read_bytes() == checkpoint.tokenizer_bytes(source)


@pytest.mark.integration
def test_data_binarized_with_another_tokenizer_is_refused(small_corpus, parent, tmp_path):
    spm = train_tokenizer([small_corpus / "train.src", small_corpus / "train.tgt"], str(tmp_path / "other"), TokenizerConfig(vocab_size=24))
    binarize("src", "tgt", [SplitSpec("train", str(small_corpus / "train")), SplitSpec("valid", str(small_corpus / "valid"))], spm, tmp_path / "bin")
    job = _job(small_corpus, tmp_path / "ft", Finetune(parent / "best.pt"), max_updates=1)
    job.data_dir = tmp_path / "bin"
    with pytest.raises(InputError, match="binarized with another tokenizer than .*best.pt"):
        train(job)
    assert not (tmp_path / "ft" / "last.pt").exists()


@pytest.mark.integration
def test_architecture_options_that_disagree_are_refused_dropout_may_change(small_corpus, parent, tmp_path):
    with pytest.raises(ConfigError, match=r"d_model 256 \(checkpoint: 128\)"):
        Trainer(_job(small_corpus, tmp_path / "a", Finetune(parent / "best.pt", {"d_model": 256, "dropout": 0.3})))
    same = {"d_model": 128, "encoder_layers": 2, "dropout": 0.3}  # agreeing options are fine
    trainer = Trainer(_job(small_corpus, tmp_path / "b", Finetune(parent / "best.pt", same)))
    assert trainer.model_config.dropout == 0.3 and trainer.model_config.d_model == 128


@pytest.mark.integration
def test_missing_finetune_checkpoint_is_a_clear_error(small_corpus, tmp_path):
    with pytest.raises(InputError, match="nope.pt: no such checkpoint"):
        train(_job(small_corpus, tmp_path / "ft", Finetune(tmp_path / "nope.pt")))


@pytest.mark.unit
def test_finetune_option_reaches_the_library_with_the_model_options_given(monkeypatch, tmp_path):
    import seqtool.training.train

    seen = []
    monkeypatch.setattr(seqtool.training.train, "train", lambda job: seen.append(job) or (_ for _ in ()).throw(SystemExit(0)))
    runner = CliRunner()
    runner.invoke(app, ["train", "data", "--save-dir", "run", "--finetune", "base.pt", "--dropout", "0.2"])
    runner.invoke(app, ["train", "data", "--save-dir", "run", "--finetune", "base.pt", "--arch", "tiny"])
    runner.invoke(app, ["train", "data", "--save-dir", "run"])
    assert str(seen[0].finetune.checkpoint) == "base.pt" and seen[0].finetune.model_overrides == {"dropout": 0.2}
    assert seen[1].finetune.model_overrides["d_model"] == 128 and seen[1].finetune.model_overrides["encoder_layers"] == 2
    assert seen[2].finetune is None


@pytest.mark.integration
def test_finetune_with_another_architecture_on_the_command_line_is_one_line(small_corpus, parent, tmp_path):
    result = CliRunner().invoke(app, ["train", str(small_corpus / "bin"), "--save-dir", str(tmp_path / "ft"),
                                      "--finetune", str(parent / "best.pt"), "--arch", "base"])
    assert result.exit_code == 1 and "disagree" in result.output and "Traceback" not in result.output
