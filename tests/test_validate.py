"""Validation: --eval-bleu decodes as translate does, --best-metric picks best.pt, --patience stops
early (and resumes its count), metrics reach metrics.jsonl, the log line and TensorBoard."""

import json
import math
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

import seqtool.training.validate
from seqtool import checkpoint
from seqtool.checkpoint import TrainingState
from seqtool.cli import app
from seqtool.config import ConfigError, OptimConfig, TrainConfig, model_config_for
from seqtool.training.metrics import MetricsLog
from seqtool.score import score_lines
from seqtool.training.train import TrainJob, train
from seqtool.training.validate import EarlyStopping, ValidResult

from conftest import tiny_job


def _job(corpus, save_dir, **train_options):
    train_options.setdefault("ema_decay", 0.0)  # validations scripted one per call: no end-of-run average (test_ema.py)
    return tiny_job(corpus / "bin", save_dir, **train_options)


def _records(save_dir, kind="valid"):
    return [r for r in map(json.loads, (save_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def _script(monkeypatch, values):
    """Replace validation by scripted results: (loss, bleu) pairs, one per validation, in order."""
    calls = []

    def scripted(*args, **kwargs):
        loss, bleu = values[len(calls)]
        calls.append((loss, bleu))
        return ValidResult(loss, loss, bleu=bleu, chrf=None if bleu is None else bleu + 30.0)

    monkeypatch.setattr(seqtool.training.validate, "evaluate", scripted)
    return calls


@pytest.mark.system
def test_eval_bleu_hypotheses_are_what_translate_gives(small_corpus, tmp_path, monkeypatch):
    real = seqtool.training.validate.evaluate
    seen = []
    monkeypatch.setattr(seqtool.training.validate, "evaluate", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    save = tmp_path / "run"
    train(_job(small_corpus, save, max_updates=30, eval_bleu=True, eval_bleu_beam=3, ema_decay=0.0, precision="fp32"))
    hyps = seen[-1].hypotheses  # the final validation: the weights in last.pt
    assert len(hyps) == 20 and any(hyps)
    out = subprocess.run([sys.executable, "-m", "seqtool", "translate", "-c", str(save / "last.pt"), "-i", str(small_corpus / "valid.src"),
                          "--beam", "3", "--max-len-a", "1.2", "--max-len-b", "10", "--threads", "2", "--device", "cpu",
                          "--precision", "fp32"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == hyps
    # ... and the logged scores are sacrebleu's on those lines against the reference file
    refs = (small_corpus / "valid.tgt").read_text().splitlines()
    bleu, chrf = score_lines(out.stdout.splitlines(), [refs], ("bleu", "chrf"))
    last = _records(save)[-1]
    assert last["bleu"] == pytest.approx(bleu.score) and last["chrf"] == pytest.approx(chrf.score)


@pytest.mark.integration
def test_valid_log_line_and_metrics_show_bleu_and_chrf(small_corpus, tmp_path, capsys):
    train(_job(small_corpus, tmp_path / "run", max_updates=2, eval_bleu=True, eval_bleu_max_len_b=5))
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("valid |"))
    assert "bleu" in line and "chrf" in line and "best loss" in line
    record = _records(tmp_path / "run")[-1]
    assert {"loss", "ppl", "bleu", "chrf", "best_loss", "best", "best_metric"} <= set(record)
    assert record["best_metric"] == "loss" and record["best"] == pytest.approx(record["loss"])


@pytest.mark.integration
def test_without_eval_bleu_validation_decodes_nothing(small_corpus, tmp_path, capsys):
    train(_job(small_corpus, tmp_path / "run", max_updates=1))
    record = _records(tmp_path / "run")[-1]
    assert record["bleu"] is None and record["chrf"] is None
    assert "bleu" not in next(x for x in capsys.readouterr().err.splitlines() if x.startswith("valid |"))


@pytest.mark.parametrize("metric, best_update", [("bleu", 3), ("chrf", 3), ("loss", 2)])
@pytest.mark.integration
def test_best_metric_picks_best_pt(small_corpus, tmp_path, monkeypatch, metric, best_update):
    # loss prefers the 2nd validation, bleu and chrf the 3rd
    calls = _script(monkeypatch, [(3.0, 10.0), (2.0, 5.0), (2.5, 20.0)])
    result = train(_job(small_corpus, tmp_path / "run", max_updates=3, validate_interval_updates=1, eval_bleu=True, best_metric=metric))
    assert len(calls) == 3
    best = checkpoint.load(tmp_path / "run" / "best.pt")
    assert best["updates"] == best_update and "train_state" not in best
    expected = {"loss": 2.0, "bleu": 20.0, "chrf": 50.0}[metric]
    assert result.best_metric == metric and result.best_value == expected
    assert _records(tmp_path / "run")[-1]["best"] == expected


@pytest.mark.unit
def test_best_metric_bleu_needs_eval_bleu():
    with pytest.raises(ConfigError, match="--best-metric bleu needs --eval-bleu"):
        TrainConfig(best_metric="bleu")
    with pytest.raises(ConfigError, match="--best-metric must be"):
        TrainConfig(best_metric="ter", eval_bleu=True)


@pytest.mark.integration
def test_patience_stops_after_n_validations_without_improvement(small_corpus, tmp_path, monkeypatch):
    _script(monkeypatch, [(3.0, None), (2.0, None), (2.5, None), (2.0, None), (2.7, None), (1.0, None)])
    result = train(_job(small_corpus, tmp_path / "run", max_updates=50, validate_interval_updates=1, patience=3))
    assert result.stopped_by == "patience" and result.updates == 5  # 2.5, 2.0 (not better), 2.7
    records = _records(tmp_path / "run")
    assert [r["bad_validations"] for r in records] == [0, 0, 1, 2, 3]
    assert checkpoint.load(tmp_path / "run" / "best.pt")["updates"] == 2


@pytest.mark.integration
def test_resume_continues_the_patience_count(small_corpus, tmp_path, monkeypatch):
    _script(monkeypatch, [(3.0, None), (2.0, None), (2.5, None)])
    first = train(_job(small_corpus, tmp_path / "run", max_updates=3, validate_interval_updates=1, patience=3))
    assert first.stopped_by == "max-updates"
    progress = checkpoint.load(tmp_path / "run" / "last.pt")["train_state"]["progress"]
    assert (progress["bad_validations"], progress["best_metric_value"]) == (1, 2.0)
    _script(monkeypatch, [(2.6, None), (2.7, None), (2.8, None)])
    second = train(_job(small_corpus, tmp_path / "run", max_updates=50, validate_interval_updates=1, patience=3))
    assert second.stopped_by == "patience" and second.updates == 5


@pytest.mark.unit
def test_early_stopping_directions_and_nan():
    state = TrainingState()
    bleu = EarlyStopping("bleu", 2, state)
    assert bleu.update(ValidResult(5.0, 5.0, bleu=10.0)) and bleu.best == 10.0
    assert not bleu.update(ValidResult(1.0, 1.0, bleu=9.0))  # a better loss does not matter
    assert state.best_valid_loss == 1.0 and not bleu.should_stop
    assert not bleu.update(ValidResult(1.0, 1.0, bleu=float("nan")))  # a diverged run never improves
    assert bleu.should_stop
    loss = EarlyStopping("loss", 0, TrainingState())
    assert loss.update(ValidResult(2.0, 2.0)) and not loss.update(ValidResult(2.0, 2.0))
    assert not loss.should_stop  # patience 0: never stops
    assert math.isnan(ValidResult(1.0, 1.0).value("bleu"))


@pytest.mark.integration
def test_tensorboard_event_files_hold_train_and_valid_scalars(small_corpus, tmp_path):
    pytest.importorskip("tensorboard")  # an optional extra; installed in the test environment
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = tmp_path / "tb"
    train(_job(small_corpus, tmp_path / "run", max_updates=2, log_interval=0.0, eval_bleu=True, eval_bleu_max_len_b=5,
               tensorboard_dir=str(tb)))
    events = list(tb.glob("events.out.tfevents.*"))
    assert events
    acc = EventAccumulator(str(tb))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/ppl", "train/lr", "train/tokens_per_s", "valid/loss", "valid/ppl", "valid/bleu",
            "valid/chrf", "valid/best_loss"} <= tags
    assert [e.step for e in acc.Scalars("valid/loss")] == [2]


@pytest.mark.unit
def test_missing_tensorboard_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as when not installed
    with pytest.raises(ConfigError, match=r"pip install 'seqtool\[tensorboard\]'"):
        MetricsLog(tmp_path / "metrics.jsonl", tmp_path / "tb")


@pytest.mark.unit
def test_metrics_jsonl_writes_null_for_undefined_numbers(tmp_path):
    log = MetricsLog(tmp_path / "m.jsonl")
    log.write({"kind": "valid", "update": 1, "loss": float("nan"), "best": float("inf")})
    assert json.loads((tmp_path / "m.jsonl").read_text()) == {"kind": "valid", "update": 1, "loss": None, "best": None}


@pytest.mark.unit
def test_validation_options_reach_the_library_call(monkeypatch, tmp_path):
    import seqtool.training.train

    seen = {}
    monkeypatch.setattr(seqtool.training.train, "train", lambda job: seen.setdefault("job", job) and (_ for _ in ()).throw(SystemExit(0)))
    CliRunner().invoke(app, ["train", "data", "--save-dir", str(tmp_path / "run"), "--eval-bleu", "--eval-bleu-beam", "3",
                             "--eval-bleu-lenpen", "0.8", "--eval-bleu-max-len-a", "1.5", "--eval-bleu-max-len-b", "20",
                             "--best-metric", "chrf", "--patience", "4", "--save-interval-updates", "100", "--keep-last", "2",
                             "--tensorboard", str(tmp_path / "tb")])
    t = seen["job"].train
    assert (t.eval_bleu, t.eval_bleu_beam, t.eval_bleu_lenpen, t.eval_bleu_max_len_a, t.eval_bleu_max_len_b) == (True, 3, 0.8, 1.5, 20)
    assert (t.best_metric, t.patience, t.save_interval_updates, t.keep_last) == ("chrf", 4, 100, 2)
    assert t.tensorboard_dir == str(tmp_path / "tb") and seen["job"].finetune is None


@pytest.mark.unit
def test_validation_settings_come_from_a_config_file_too(monkeypatch, tmp_path):
    import seqtool.training.train

    seen = {}
    monkeypatch.setattr(seqtool.training.train, "train", lambda job: seen.setdefault("job", job) and (_ for _ in ()).throw(SystemExit(0)))
    cfg = tmp_path / "c.toml"
    cfg.write_text("[train]\neval_bleu = true\nbest_metric = \"bleu\"\npatience = 5\n")
    CliRunner().invoke(app, ["train", "data", "--save-dir", str(tmp_path / "run"), "--config", str(cfg)])
    t = seen["job"].train
    assert (t.eval_bleu, t.best_metric, t.patience) == (True, "bleu", 5)


@pytest.mark.unit
def test_best_metric_without_eval_bleu_is_a_one_line_error(tmp_path):
    result = CliRunner().invoke(app, ["train", "data", "--save-dir", str(tmp_path / "run"), "--best-metric", "bleu"])
    assert result.exit_code == 1 and "needs --eval-bleu" in result.output and "Traceback" not in result.output


@pytest.mark.integration
def test_eval_bleu_needs_a_valid_split(small_corpus, tmp_path):
    from seqtool.binarize import SplitSpec, binarize
    from seqtool.textio import InputError

    data = tmp_path / "bin"
    binarize("src", "tgt", [SplitSpec("train", str(small_corpus / "train"))], small_corpus / "spm.model", data)
    job = _job(small_corpus, tmp_path / "run", max_updates=1, eval_bleu=True)
    job.data_dir = data
    with pytest.raises((ConfigError, InputError), match="no valid split"):
        train(job)


@pytest.mark.integration
def test_validation_leaves_the_random_state_alone(small_corpus, tmp_path):
    """Exact resume needs validation (with decoding) to draw no random numbers."""
    from seqtool.training.train import Trainer

    trainer = Trainer(_job(small_corpus, tmp_path / "run", eval_bleu=True, eval_bleu_max_len_b=5))
    before = torch.get_rng_state()
    trainer.validate()
    assert torch.equal(before, torch.get_rng_state()) and trainer.model.training


@pytest.mark.integration
def test_a_run_resumed_at_an_epoch_end_does_not_validate_that_point_again(small_corpus, tmp_path, monkeypatch):
    from seqtool.data import ParallelDataset, epoch_batches

    per_epoch = len(epoch_batches(ParallelDataset(small_corpus / "bin", "train"), 600, 1024, 1, 1)[0])
    calls = _script(monkeypatch, [(3.0 - 0.01 * k, None) for k in range(per_epoch + 5)])
    train(_job(small_corpus, tmp_path / "run", max_updates=per_epoch, validate_interval_updates=1, patience=2))
    assert len(calls) == per_epoch  # one per update; the epoch's end is its last update
    train(_job(small_corpus, tmp_path / "run", max_updates=per_epoch + 1, validate_interval_updates=1, patience=2))
    assert len(calls) == per_epoch + 1
