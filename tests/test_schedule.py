"""The learning-rate schedule: warmup, decay to the horizon, progress by updates, time and epochs."""

import json
import math

import pytest

from seqtool.training import schedule
from seqtool.config import ConfigError, OptimConfig, TrainConfig
from seqtool.training.schedule import Schedule, resolve

from conftest import interrupted_then_resumed, tiny_job

PEAK = 1e-3


def lrs(s: Schedule, horizon: int) -> list[float]:
    """The learning rates of updates 1..horizon of a --max-updates horizon run."""
    return [s.lr(u, (u - 1) / horizon) for u in range(1, horizon + 1)]


@pytest.mark.parametrize("name", ["linear", "cosine", "wsd"])
@pytest.mark.parametrize("warmup", [0, 30, 500, 0.2])
@pytest.mark.unit
def test_warmup_then_monotone_decay_to_zero_at_the_horizon(name, warmup):
    s = resolve(OptimConfig(lr=PEAK, warmup=warmup, lr_schedule=name), TrainConfig(max_updates=1000))
    rates = lrs(s, 1000)
    top = rates.index(max(rates))
    assert all(a <= b for a, b in zip(rates[:top], rates[1:top + 1]))  # warmup: never falls
    assert all(a >= b for a, b in zip(rates[top:], rates[top + 1:]))  # then: never rises
    assert max(rates) <= PEAK and max(rates) > 0.75 * PEAK
    share = 0.2 if warmup == 0.2 else (min(warmup / 1000, schedule.WARMUP_CAP) if warmup else 0)
    assert top <= math.ceil(share * 1000) + 1  # the warmup is over by its share of the horizon
    assert rates[-1] <= PEAK * 5 / 1000 + 1e-12  # the last update: within one update's step of 0 (wsd: 5x steeper)
    assert s.lr(1001, 1.0) == 0.0  # the floor is reached at the horizon


@pytest.mark.unit
def test_a_warmup_in_updates_is_clipped_to_a_share_of_the_horizon():
    s = resolve(OptimConfig(lr=PEAK, warmup=4000, lr_schedule="linear"), TrainConfig(max_updates=1000))
    rates = lrs(s, 1000)
    assert rates.index(max(rates)) == int(schedule.WARMUP_CAP * 1000)  # not 4000, which the run never reaches
    short = resolve(OptimConfig(lr=PEAK, warmup=10, lr_schedule="linear"), TrainConfig(max_updates=1000))
    assert lrs(short, 1000).index(max(lrs(short, 1000))) == 9  # a short warmup keeps its length


@pytest.mark.unit
def test_shapes_of_the_decays():
    lin = Schedule("linear", PEAK, 0, 0.0)
    cos = Schedule("cosine", PEAK, 0, 0.0)
    wsd = Schedule("wsd", PEAK, 0, 0.0)
    assert lin.lr(10, 0.5) == pytest.approx(PEAK / 2) and cos.lr(10, 0.5) == pytest.approx(PEAK / 2)
    assert cos.lr(10, 0.25) == pytest.approx(PEAK * (1 + math.cos(math.pi / 4)) / 2)
    assert wsd.lr(10, 0.79) == PEAK and wsd.lr(10, 0.9) == pytest.approx(PEAK / 2)


@pytest.mark.unit
def test_inverse_sqrt_is_the_transformer_schedule():
    s = resolve(OptimConfig(lr=PEAK, warmup=100, lr_schedule="inverse-sqrt"), TrainConfig())
    assert s.lr(1, None) == pytest.approx(1e-5)
    assert s.lr(100, None) == pytest.approx(PEAK)
    assert s.lr(400, None) == pytest.approx(PEAK / 2)


@pytest.mark.unit
def test_auto_decays_to_the_horizon_when_there_is_one():
    assert resolve(OptimConfig(), TrainConfig()).name == "inverse-sqrt"
    for limits in (dict(max_updates=10), dict(max_epochs=3), dict(max_time=60.0)):
        assert resolve(OptimConfig(), TrainConfig(**limits)).name == schedule.AUTO_WITH_HORIZON


@pytest.mark.unit
def test_progress_is_the_share_of_whichever_limit_binds_first():
    cfg = TrainConfig(max_updates=1000, max_time=600.0, max_epochs=4)
    assert schedule.progress(cfg, updates=100, seconds=300.0, epochs=1.0) == 0.5  # time binds
    assert schedule.progress(cfg, updates=900, seconds=300.0, epochs=1.0) == 0.9  # updates bind
    assert schedule.progress(cfg, updates=100, seconds=60.0, epochs=3.0) == 0.75  # epochs bind
    assert schedule.progress(TrainConfig(), updates=5, seconds=5.0, epochs=1.0) is None


@pytest.mark.parametrize("options, fragment", [
    (dict(lr_schedule="linear"), "--lr-schedule linear decays to a horizon"),
    (dict(warmup=0.1, lr_schedule="inverse-sqrt"), "--warmup 0.1 is a share of the horizon"),
    (dict(warmup=0.1), "--warmup 0.1 is a share of the horizon"),
])
@pytest.mark.unit
def test_schedules_that_need_a_horizon_are_refused_without_one(options, fragment):
    with pytest.raises(ConfigError, match=fragment):
        resolve(OptimConfig(**options), TrainConfig())


@pytest.mark.parametrize("options, fragment", [
    (dict(lr_schedule="step"), "--lr-schedule must be"), (dict(warmup=1.5), "--warmup is a number of updates"),
    (dict(warmup=-1), "--warmup must be >= 0"),
])
@pytest.mark.unit
def test_bad_schedule_settings_are_refused(options, fragment):
    with pytest.raises(ConfigError, match=fragment):
        OptimConfig(**options)


@pytest.mark.integration
def test_a_time_budget_decays_with_the_clock_counted_across_resumes(tmp_path, monkeypatch):
    """A fake clock that advances 1 s per reading: the learning rate of each update follows the
    share of --max-time trained, and a resumed run continues from the saved seconds."""
    from conftest import binarized_reverse_corpus
    from seqtool.training import train as train_module

    data = binarized_reverse_corpus(tmp_path)
    clock = [1000.0]

    def tick():
        clock[0] += 1.0
        return clock[0]

    monkeypatch.setattr(train_module.time, "monotonic", tick)
    save = tmp_path / "run"
    job = tiny_job(data, save, max_time=40.0, log_interval=0.0)
    job = job.__class__(**{**job.__dict__, "optim": OptimConfig(lr=PEAK, warmup=0, lr_schedule="linear")})
    real_train = train_module.train

    def later(job):  # the time between the interrupted run and the resumed one does not count
        clock[0] += 5000.0 if later.calls else 0.0
        later.calls += 1
        return real_train(job)
    later.calls = 0
    monkeypatch.setattr(train_module, "train", later)
    result = interrupted_then_resumed(job, 4, monkeypatch)
    assert result.stopped_by == "max-time" and result.train_seconds < 100
    records = [json.loads(x) for x in (save / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if r["kind"] == "train"]
    assert len(train_records) >= 5
    for previous, r in zip(train_records, train_records[1:]):
        # the lr of update u is peak x (1 - seconds trained before u / max_time)
        assert r["lr"] == pytest.approx(PEAK * (1 - previous["seconds"] / 40.0))
    assert train_records[-1]["lr"] < train_records[0]["lr"] / 2
