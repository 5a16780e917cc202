"""The exponential moving average of the weights: its arithmetic, resume, and best.pt at the end."""

import json

import pytest
import torch

from seqtool import checkpoint
from seqtool.training.ema import EMA
from seqtool.training.train import train

from conftest import binarized_reverse_corpus, interrupted_then_resumed, tiny_job


@pytest.mark.unit
def test_the_average_follows_its_formula():
    p = torch.nn.Parameter(torch.zeros(3))
    ema = EMA([p], decay=0.9)
    expected = torch.zeros(3)
    for n, value in enumerate([1.0, 2.0, 4.0, 8.0, 16.0] * 4, start=1):
        with torch.no_grad():
            p.fill_(value)
        ema.update()
        d = min(0.9, (1 + n) / (10 + n))  # the decay warms up: early updates are not drowned
        expected = d * expected + (1 - d) * value
        torch.testing.assert_close(ema.shadow[0], expected)
    assert ema.updates == 20


@pytest.mark.unit
def test_applied_swaps_the_average_in_and_back_out():
    p = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    ema = EMA([p], decay=0.5)
    with torch.no_grad():
        p.fill_(5.0)
    ema.update()
    average = ema.shadow[0].clone()
    with ema.applied():
        torch.testing.assert_close(p.detach(), average)
    torch.testing.assert_close(p.detach(), torch.tensor([5.0, 5.0]))


@pytest.mark.unit
def test_state_round_trip_continues_exactly():
    torch.manual_seed(0)
    a, b = torch.nn.Parameter(torch.randn(4)), torch.nn.Parameter(torch.randn(4))
    one = EMA([a], 0.99)
    for _ in range(3):
        with torch.no_grad():
            a.add_(1.0)
        one.update()
    two = EMA([b], 0.99)
    two.load_state_dict(one.state_dict())
    with torch.no_grad():
        b.copy_(a)
    one.update(), two.update()
    assert torch.equal(one.shadow[0], two.shadow[0]) and two.updates == 4


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return binarized_reverse_corpus(tmp_path_factory.mktemp("ema"))


def _records(save):
    return [json.loads(x) for x in (save / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.integration
def test_the_average_becomes_best_pt_only_when_validation_says_it_is_better(data_dir, tmp_path, monkeypatch):
    save = tmp_path / "run"
    train(tiny_job(data_dir, save, max_updates=30, ema_decay=0.9))
    ema_record = [r for r in _records(save) if r["kind"] == "valid_ema"][-1]
    last_valid = [r for r in _records(save) if r["kind"] == "valid"][-1]
    best = checkpoint.load(save / "best.pt")
    last = checkpoint.load(save / "last.pt")
    assert ema_record["kept"] == (ema_record["loss"] < ema_record["best_before"])
    if ema_record["kept"]:
        assert best.get("averaged") is True and best["valid_loss"] == pytest.approx(ema_record["loss"])
        assert last["train_state"]["progress"]["best_valid_loss"] == pytest.approx(ema_record["loss"])
    else:
        assert not best.get("averaged") and best["valid_loss"] == pytest.approx(last_valid["loss"])
    # last.pt keeps the trained weights (not the average) and the average beside them
    shadow = last["train_state"]["ema"]["shadow"]
    assert last["train_state"]["ema"]["updates"] == 30 and len(shadow) > 0
    assert any(not torch.equal(w, best["weights"][k]) for k, w in last["weights"].items()) or not ema_record["kept"]

    # forced both ways: a worse average leaves best.pt alone, a better one replaces it
    for verdict in (False, True):
        other = tmp_path / f"forced-{verdict}"
        monkeypatch.setattr("seqtool.training.validate.EarlyStopping.beats_best", lambda self, result, v=verdict: v)
        train(tiny_job(data_dir, other, max_updates=12, ema_decay=0.9))
        assert bool(checkpoint.load(other / "best.pt").get("averaged")) is verdict


@pytest.mark.integration
def test_ema_off_leaves_no_average(data_dir, tmp_path):
    save = tmp_path / "run"
    train(tiny_job(data_dir, save, max_updates=4, ema_decay=0.0))
    assert "valid_ema" not in {r["kind"] for r in _records(save)}
    assert checkpoint.load(save / "last.pt")["train_state"]["ema"] is None


@pytest.mark.integration
def test_resume_continues_the_average_bitwise(data_dir, tmp_path, monkeypatch):
    train(tiny_job(data_dir, tmp_path / "once", max_updates=8, ema_decay=0.9))
    interrupted_then_resumed(tiny_job(data_dir, tmp_path / "twice", max_updates=8, ema_decay=0.9), 5, monkeypatch)
    a = checkpoint.load(tmp_path / "once" / "last.pt")["train_state"]["ema"]
    b = checkpoint.load(tmp_path / "twice" / "last.pt")["train_state"]["ema"]
    assert a["updates"] == b["updates"] == 8
    for x, y in zip(a["shadow"], b["shadow"]):
        assert torch.equal(x, y)
