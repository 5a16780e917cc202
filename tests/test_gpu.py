"""Training and decoding on a CUDA device: mixed precision (bf16 autocast; fp16 with loss scaling)
learns with float32 master weights, a run resumed on the GPU equals one never stopped, and greedy
decoding on the GPU gives the tokens of CPU float32.

Marked `gpu`: the README's test command (and so CI) deselects them with -m "not gpu"; on a machine
with CUDA, `python -m pytest -q -rs tests` runs them. Without a CUDA device they fail, saying so,
rather than pass or skip unnoticed.
"""

import json
import math
import os
import statistics

# cuBLAS reads this when the process first uses it, so it is set here, at collection, before any
# test runs: with it (and torch.use_deterministic_algorithms) a matrix product gives the same bits
# every time, which the resume test compares.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import pytest  # noqa: E402
import torch  # noqa: E402

from seqtool import checkpoint  # noqa: E402
from seqtool.config import OptimConfig, TrainConfig, model_config_for  # noqa: E402
from seqtool.training.train import TrainJob, train  # noqa: E402
from seqtool.translate import Translator  # noqa: E402

from conftest import binarized_reverse_corpus, interrupted_then_resumed, tiny_job  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.integration]


@pytest.fixture(autouse=True)
def cuda():
    if not torch.cuda.is_available():
        pytest.fail("no CUDA device here: tests marked gpu need one (deselect them with -m \"not gpu\")", pytrace=False)
    yield
    torch.cuda.synchronize()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return binarized_reverse_corpus(tmp_path_factory.mktemp("gpu"))


@pytest.fixture
def deterministic():
    """torch's deterministic kernels where it has them (warnings where it has not) for one test."""
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def _records(save, kind):
    return [r for r in map(json.loads, (save / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_training_on_cuda_learns_with_float32_master_weights(data_dir, tmp_path, precision):
    """30 updates of the tiny model on the reverse corpus under autocast: every loss finite, the
    training loss falls (on CPU, fp32 and bf16 both fall from 3.6 to 2.6 over the first and last 5
    updates) and so does the validation loss; the weights stay float32; fp16's loss scaler works
    (an overflow costs a skipped update and a halved scale, never a stop), bf16 needs none."""
    save = tmp_path / "run"
    result = train(tiny_job(data_dir, save, device="cuda", precision=precision, max_updates=30, log_interval=0.0,
                            validate_interval_updates=15))
    assert result.updates == 30 and result.stopped_by == "max-updates"
    saved = json.loads((save / "config.json").read_text())["train"]
    assert (saved["device"], saved["precision"]) == ("cuda", precision)

    losses = [r["loss"] for r in _records(save, "train")]
    valid = [r["loss"] for r in _records(save, "valid")]
    assert len(losses) == 30 and len(valid) >= 2
    assert all(math.isfinite(x) for x in losses + valid), (losses, valid)
    assert statistics.mean(losses[-5:]) < statistics.mean(losses[:5]) - 0.5, losses
    assert valid[-1] < valid[0], valid

    last = checkpoint.load(save / "last.pt")
    assert {w.dtype for w in last["weights"].values() if w.is_floating_point()} == {torch.float32}
    skipped, scaler = last["train_state"]["progress"]["skipped_updates"], last["train_state"]["scaler"]
    if precision == "fp16":
        assert skipped <= 10, skipped  # the first updates may overflow at the initial scale 2^16; then it fits
        assert 1.0 <= scaler["scale"] <= 2.0 ** 16, scaler
    else:
        assert skipped == 0 and scaler == {}
    model = checkpoint.load_model(checkpoint.load(save / "best.pt"), torch.device("cuda"))
    assert next(model.parameters()).device.type == "cuda"


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_run_resumed_on_cuda_equals_an_uninterrupted_one(data_dir, tmp_path, monkeypatch, deterministic, precision):
    """Interrupted before update 6 of 8 (dropout on) and resumed with the same command, on the GPU:
    weights, learning rates, losses, the CUDA random state and fp16's loss scale equal those of the
    run that was never stopped, bit for bit (test_train.py's test on CPU, here with the GPU's own
    random stream and scaler saved in last.pt and restored)."""
    def job(save):
        return TrainJob(save_dir=save, model=model_config_for("tiny"), optim=OptimConfig(warmup=2, lr_schedule="linear"),
                        train=TrainConfig(max_tokens=600, threads=2, max_updates=8, log_interval=0.0, device="cuda",
                                          precision=precision), data_dir=data_dir)

    train(job(tmp_path / "once"))
    interrupted_then_resumed(job(tmp_path / "twice"), 5, monkeypatch)
    a, b = (checkpoint.load(tmp_path / run / "last.pt") for run in ("once", "twice"))
    assert a["train_state"]["progress"]["updates"] == b["train_state"]["progress"]["updates"] == 8
    for name in a["weights"]:
        torch.testing.assert_close(a["weights"][name], b["weights"][name], rtol=0, atol=0, msg=name)
    assert torch.equal(a["train_state"]["rng_cuda"], b["train_state"]["rng_cuda"])
    assert a["train_state"]["scaler"] == b["train_state"]["scaler"]
    if precision == "fp16":
        assert a["train_state"]["scaler"]["scale"] > 0

    def per_update(run, key):
        return {r["update"]: r[key] for r in _records(tmp_path / run, "train")}
    for key in ("lr", "loss"):
        assert per_update("twice", key) == per_update("once", key) and len(per_update("once", key)) == 8


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_greedy_decoding_on_cuda_gives_the_tokens_of_cpu_fp32(reverse_run, precision):
    """The model that learnt to reverse (conftest.py's reverse_run), 200 held-out lines, greedy: on
    the GPU in fp32 and in bf16 (what --precision auto picks there) every line gets exactly the
    tokens CPU float32 gives. The model is sure of every token (validation loss ~0.003), so a 16-bit
    rounding cannot swap the best token with the next one; a difference is a bug in the GPU path."""
    src = reverse_run.texts["test"][0]
    best = reverse_run.directory / "run" / "best.pt"

    def greedy(device, precision):
        t = Translator.load(best, device=device, precision=precision, beam=1)
        assert t.device.type == device
        return [[h.tokens for h in r.hypotheses] for r in t.translate_chunk(0, src)]

    cpu = greedy("cpu", "fp32")
    assert sum(len(h) == 1 and len(h[0]) > 0 for h in cpu) == len(src)
    gpu = greedy("cuda", precision)
    different = [k for k in range(len(src)) if gpu[k] != cpu[k]]
    assert not different, [(src[k], cpu[k], gpu[k]) for k in different[:5]]
