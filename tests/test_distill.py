"""train --teacher: sequence-level distillation (training/distill.py), the student preset and the
decoding defaults a distilled checkpoint records (translate.settings)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from seqtool import checkpoint
from seqtool.binarize import SplitSpec, binarize
from seqtool.cli import app
from seqtool.config import ConfigError, OptimConfig, TrainConfig, model_config_for
from seqtool.data import ParallelDataset
from seqtool.errors import InputError
from seqtool.training import distill
from seqtool.training.distill import Distill
from seqtool.training.train import Trainer, TrainJob, train
from seqtool.translate import Translator, settings

from conftest import seqtool

runner = CliRunner()
N_TRAIN = 120


@pytest.fixture(scope="module")
def taught(reverse_run, tmp_path_factory):
    """A teacher that reverses letter sequences (reverse_run's model), and a DATA_DIR of 120 of its
    training pairs and 20 validation pairs binarized with its tokenizer."""
    d = tmp_path_factory.mktemp("distill")
    for split, n in (("train", N_TRAIN), ("valid", 20)):
        sources, targets = reverse_run.texts[split]
        (d / f"{split}.src").write_text("\n".join(sources[:n]) + "\n")
        (d / f"{split}.tgt").write_text("\n".join(targets[:n]) + "\n")
    spm = reverse_run.directory / "spm.model"
    binarize("src", "tgt", [SplitSpec("train", str(d / "train")), SplitSpec("valid", str(d / "valid"))], spm, d / "bin")
    return d, reverse_run.directory / "run" / "best.pt"


def _job(data_dir, save_dir, teachers, original=False, force=False, arch="tiny", **train):
    train.setdefault("max_updates", 2)
    return TrainJob(save_dir=save_dir, model=model_config_for(arch), optim=OptimConfig(warmup=2),
                    train=TrainConfig(max_tokens=600, threads=2, device="cpu", **train), data_dir=data_dir, force=force,
                    distill=Distill(tuple(teachers), original))


@pytest.mark.integration
def test_the_student_learns_what_translate_gives_and_a_second_run_reuses_it(taught, tmp_path, monkeypatch):
    d, teacher = taught
    result = train(_job(d / "bin", tmp_path / "s", [teacher]))
    assert result.updates == 2 and result.distill_seconds > 0
    (made,) = (tmp_path / "s" / "distill").iterdir()
    taught_set = ParallelDataset(made, "train")
    original = ParallelDataset(d / "bin", "train")
    assert len(taught_set) == N_TRAIN
    assert all(np.array_equal(taught_set.src[i], original.src[i]) for i in range(N_TRAIN))  # the same sources, in order
    # the targets are the teacher's translations, as `seqtool translate` makes them (its defaults)
    sources = (d / "train.src").read_text().splitlines()
    with Translator.load(teacher, device="cpu", threads=2) as translator:
        expected = [t.hypotheses[0].tokens for t in translator.translate_chunk(0, sources)]
    assert [taught_set.tgt[i].tolist() for i in range(N_TRAIN)] == expected
    # a teacher that learnt to reverse: most of what it teaches is the reference itself
    assert sum(np.array_equal(taught_set.tgt[i], original.tgt[i]) for i in range(N_TRAIN)) >= 0.9 * N_TRAIN

    # the checkpoint names its teacher and decodes greedily unless told otherwise
    best = checkpoint.load(tmp_path / "s" / "best.pt")
    assert best["configs"]["distill"] == {"teachers": [f"{teacher}@{checkpoint.load(teacher)['weights_sha256'][:16]}"],
                                          "original": False}
    assert best["configs"]["decoding"] == distill.DECODING and distill.DECODING["beam"] == 1

    # a second student in that SAVE_DIR (--force) from the same teacher: no second pass
    def translated_again(*args, **kwargs):
        raise AssertionError("the teacher's translations were made again")

    monkeypatch.setattr(distill, "translate_share", translated_again)
    again = train(_job(d / "bin", tmp_path / "s", [teacher], force=True, arch="student", max_updates=1))
    assert again.updates == 1 and again.distill_seconds == 0
    assert [p.name for p in (tmp_path / "s" / "distill").iterdir()] == [made.name]


@pytest.mark.integration
def test_distill_original_trains_on_both_target_sides(taught, tmp_path):
    d, teacher = taught
    trainer = Trainer(_job(d / "bin", tmp_path / "s", [teacher], original=True))
    try:
        original = ParallelDataset(d / "bin", "train")
        assert len(trainer.train_set) == 2 * N_TRAIN
        for i in (0, 7, N_TRAIN - 1):
            assert np.array_equal(trainer.train_set.src[N_TRAIN + i], original.src[i])
            assert np.array_equal(trainer.train_set.tgt[N_TRAIN + i], original.tgt[i])  # the references
            assert np.array_equal(trainer.train_set.src[i], original.src[i])
    finally:
        trainer.lock.release()


@pytest.mark.integration
def test_a_teacher_that_does_not_fit_the_data_is_one_line_naming_what_differs(taught, small_corpus, tmp_path):
    d, teacher = taught
    with pytest.raises(InputError, match=r"--teacher .*best\.pt: its tokenizer differs from the one .* was binarized with"):
        train(_job(small_corpus / "bin", tmp_path / "a", [teacher]))
    # the same tokenizer, the languages the other way round
    binarize("tgt", "src", [SplitSpec("train", str(d / "train")), SplitSpec("valid", str(d / "valid"))],
             taught[1].parents[1] / "spm.model", tmp_path / "swapped")
    with pytest.raises(InputError, match=r"translates src -> tgt, but the training data is tgt -> src"):
        train(_job(tmp_path / "swapped", tmp_path / "b", [teacher]))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b" / "distill").exists()  # refused before any work


@pytest.mark.integration
def test_a_teacher_changed_between_runs_is_refused_on_resume(taught, tmp_path):
    d, teacher = taught
    mine = tmp_path / "teacher.pt"
    shutil.copy(teacher, mine)
    train(_job(d / "bin", tmp_path / "s", [mine]))
    ckpt = checkpoint.load(mine)
    weights = {k: v + 0.01 for k, v in ckpt["weights"].items()}  # retrained, say
    checkpoint.save(checkpoint.build(ckpt["configs"], checkpoint.tokenizer_bytes(ckpt), weights), mine)
    with pytest.raises(ConfigError, match=r"distill\.teachers: saved .*teacher\.pt@.*, now .*teacher\.pt@"):
        train(_job(d / "bin", tmp_path / "s", [mine], max_updates=4))


@pytest.mark.unit
def test_recorded_decoding_defaults_yield_to_what_is_given():
    recorded = {"beam": 1}
    assert settings(recorded=recorded)[1].beam == 1
    assert settings(recorded=recorded, beam=4)[1].beam == 4
    assert settings(recorded=recorded, nbest=3)[1].beam == 5  # beam 1 cannot give 3 best: seqtool's default
    assert settings(recorded={"beam": 1, "quantize": "int8"})[0].quantize == "int8"
    config, options = settings(recorded={"beam": 1, "quantize": "int8"}, precision="bf16")  # int8 cannot run in bf16
    assert (config.quantize, config.precision, options.beam) == ("none", "bf16", 1)  # only the clashing default goes
    assert settings(recorded=None)[1].beam == 5


@pytest.mark.unit
def test_joined_datasets_read_as_one(small_corpus):
    one = ParallelDataset(small_corpus / "bin", "train")
    two = ParallelDataset(small_corpus / "bin", "valid")
    both = ParallelDataset.joined([one, two])
    assert len(both) == len(one) + len(two)
    assert np.array_equal(both.src.lengths, np.concatenate([one.src.lengths, two.src.lengths]))
    assert np.array_equal(both.tgt[len(one) + 3], two.tgt[3]) and np.array_equal(both.src[len(one) - 1], one.src[len(one) - 1])


@pytest.mark.system
def test_the_cli_trains_a_student_whose_checkpoint_decodes_greedily_unless_told(taught, tmp_path):
    d, teacher = taught
    seqtool("train", d / "bin", "--save-dir", "s", "--teacher", teacher, "--arch", "student", "--max-updates", "3",
            "--max-tokens", "600", "--threads", "2", "--device", "cpu", cwd=tmp_path)
    info = seqtool("info", "s/best.pt", cwd=tmp_path).stdout
    assert json.loads((tmp_path / "s" / "config.json").read_text())["distill"]["original"] is True  # the default
    assert "decoding" in info and "beam=1 batch_size=256 quantize=int8" in info and "encoder_layers=4" in info and "decoder_layers=1" in info
    test = "\n".join(d.joinpath("valid.src").read_text().splitlines()) + "\n"

    def translate(*options):
        return seqtool("translate", "-c", "s/best.pt", "--print-scores", "--device", "cpu", "--threads", "2", *options,
                       cwd=tmp_path, stdin=test).stdout

    default = translate()
    assert default == translate("--beam", "1", "--quantize", "int8", "--batch-size", "256")  # the recorded defaults
    assert default != translate("--beam", "5")  # an option still wins (a 3-update model's beam finds other outputs)
    assert translate("--nbest", "2").count("\n") == 2 * test.count("\n")  # n-best needs a beam: seqtool's default


@pytest.mark.system
def test_distill_original_without_a_teacher_is_a_one_line_error(tmp_path):
    result = runner.invoke(app, ["train", str(tmp_path), "--save-dir", str(tmp_path / "s"), "--distill-original"])
    assert result.exit_code == 1 and "add --teacher" in result.output
    result = runner.invoke(app, ["train", str(tmp_path), "--save-dir", str(tmp_path / "s"), "--teacher-only"])
    assert result.exit_code == 1 and "add --teacher" in result.output


@pytest.mark.system
def test_two_processes_share_the_teachers_pass_and_make_the_same_split(taught, tmp_path):
    # torchrun on the raw files (prepared with the teacher's tokenizer) against one process on the DATA_DIR
    # binarized with it: the same source ids, so the same cache key and the same translations
    d, teacher = taught
    raw = ["--src", "src", "--tgt", "tgt", "--train", str(d / "train"), "--valid", str(d / "valid")]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "seqtool", "train",
               *raw, "--save-dir", str(tmp_path / "two"), "--teacher", str(teacher), "--arch", "tiny",
               "--max-updates", "1", "--max-tokens", "600", "--threads", "1", "--device", "cpu"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    (two,) = (tmp_path / "two" / "distill").iterdir()
    seqtool("train", d / "bin", "--save-dir", "one", "--teacher", teacher, "--arch", "tiny", "--max-updates", "1",
            "--max-tokens", "600", "--threads", "1", "--device", "cpu", cwd=tmp_path)
    (one,) = (tmp_path / "one" / "distill").iterdir()
    assert one.name == two.name  # the same teacher, data and search: the same cache key
    a, b = ParallelDataset(one, "train"), ParallelDataset(two, "train")
    assert [a.tgt[i].tolist() for i in range(N_TRAIN)] == [b.tgt[i].tolist() for i in range(N_TRAIN)]
    assert json.loads((two / "meta.json").read_text())["distill"]["teachers"] == [f"{teacher}@{checkpoint.load(teacher)['weights_sha256'][:16]}"]


@pytest.mark.integration
def test_a_finetuned_student_learns_from_its_teacher(taught, tmp_path):
    # --finetune and --teacher together: the checkpoint's model and tokenizer, the teacher's translations
    from seqtool.training.finetune import Finetune

    d, teacher = taught
    job = _job(d / "bin", tmp_path / "s", [teacher])
    job.finetune = Finetune(teacher)
    result = train(job)
    assert result.updates == 2 and result.distill_seconds > 0
    saved = json.loads((tmp_path / "s" / "config.json").read_text())
    assert saved["finetune"]["checkpoint"] == str(teacher) and saved["distill"]["teachers"][0].startswith(f"{teacher}@")
    assert len(list((tmp_path / "s" / "distill").iterdir())) == 1
