"""Several processes (distributed.py): torchrun's environment, which rank trains on which batch,
DDP on CPU with gloo giving the weights of one process with gradient accumulation, and a rank
that fails or hangs ending the whole job with an error within --dist-timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from seqtool import checkpoint
from seqtool.training import distributed
from seqtool.config import ConfigError, ModelConfig, OptimConfig, TrainConfig, model_config_for
from seqtool.data import shard_batches
from seqtool.model import Transformer
from seqtool.training.train import TrainJob, train

from conftest import binarized_reverse_corpus

# tiny model, no dropout: 1 and 2 processes must compute the same thing
SETTINGS = dict(max_tokens=300, max_updates=3, threads=1, device="cpu", seed=3)
CLI_SETTINGS = ["--arch", "tiny", "--dropout", "0", "--warmup", "2", "--max-tokens", "300", "--max-updates", "3",
                "--threads", "1", "--device", "cpu", "--seed", "3"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return binarized_reverse_corpus(tmp_path_factory.mktemp("distributed"))


def torchrun(nproc: int, *args, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc-per-node N -m seqtool train ...` (a free port every time)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               "-m", "seqtool", "train", *map(str, args)]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=full_env)


# ---- environment and batch assignment (no processes) ---------------------------------------
@pytest.mark.unit
def test_environment_of_one_process_and_of_torchrun():
    assert distributed.environment({}) == distributed.Env(0, 1, 0)
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
    assert distributed.environment(env) == distributed.Env(5, 8, 1)  # node 2 of 2 x 4 GPUs
    with pytest.raises(ConfigError, match="RANK='x' is not a number"):
        distributed.environment(dict(env, RANK="x"))
    with pytest.raises(ConfigError, match="inconsistent torchrun environment: RANK=8, WORLD_SIZE=8"):
        distributed.environment(dict(env, RANK="8"))
    with pytest.raises(ConfigError, match="MASTER_ADDR not set"):
        distributed.environment({k: v for k, v in env.items() if k != "MASTER_ADDR"})


@pytest.mark.unit
def test_one_process_group_is_a_no_op():
    import torch.distributed as dist

    group = distributed.start(distributed.Env(), torch.device("cpu"), 5.0)
    assert group.is_main and group.world_size == 1 and not dist.is_initialized()
    assert group.sum_int(7) == 7 and group.from_main("x") == "x" and group.gather(3) == [3]
    assert group.wrap(torch.nn.Linear(2, 2)) is None
    group.check_same(True, "anything")
    group.barrier()


@pytest.mark.parametrize("n_batches", [1, 11, 24, 37])
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("update_freq", [1, 2, 4])
@pytest.mark.unit
def test_update_k_micro_batch_j_of_rank_r_is_global_batch_kWF_plus_jW_plus_r(n_batches, world, update_freq):
    epoch = list(range(n_batches))  # global batch i stands for itself
    per_rank = [distributed.update_batches(shard_batches(epoch, r, world), update_freq) for r in range(world)]
    assert {len(updates) for updates in per_rank} == {n_batches // (world * update_freq)}  # same count everywhere
    for r, updates in enumerate(per_rank):
        for k, micro in enumerate(updates):
            assert micro == [k * world * update_freq + j * world + r for j in range(update_freq)]
    used = sorted(i for updates in per_rank for micro in updates for i in micro)
    assert used == list(range(len(used)))  # no batch twice, only the tail left out


@pytest.mark.unit
def test_resume_position_with_another_number_of_processes():
    assert distributed.resume_position(5, 2, 2) == 5
    assert distributed.resume_position(5, 2, 4) == 3  # 10 batches consumed -> 2.5 updates of 4, rounded up
    assert distributed.resume_position(3, 4, 1) == 12


@pytest.mark.integration
def test_update_freq_larger_than_an_epoch_is_a_clear_error(data_dir, tmp_path):
    from seqtool.textio import InputError

    with pytest.raises(InputError, match=r"fewer batches of --max-tokens 300 than one update needs \(--update-freq 500 x 1"):
        train(TrainJob(save_dir=tmp_path / "run", model=model_config_for("tiny"), optim=OptimConfig(),
                       train=TrainConfig(**dict(SETTINGS, update_freq=500)), data_dir=data_dir))


# ---- two processes on CPU (gloo) -------------------------------------------------------------
@pytest.mark.parametrize("ranks_update_freq, one_update_freq, sgd_like", [(1, 2, False), (2, 4, True)])
@pytest.mark.system
def test_two_processes_train_the_weights_of_one_with_update_freq(data_dir, tmp_path, ranks_update_freq, one_update_freq, sgd_like):
    """2 ranks x F micro-batches = 1 process x 2F micro-batches on the same batches (the all-reduce
    replaces the accumulation; with F = 2 the first micro-batch runs under no_sync).

    Adam's first steps are nearly sign(gradient) x lr, blind to how the gradient is scaled; with
    eps = 1 and no clipping (sgd_like) an update is close to lr x gradient, so comparing the weight
    changes also checks that the loss is normalised by the target tokens of all ranks."""
    optim = dict(warmup=2, lr=0.01, eps=1.0, clip_norm=0.0) if sgd_like else dict(warmup=2)
    one = tmp_path / "one"
    train(TrainJob(save_dir=one, model=model_config_for("tiny", dropout=0.0), optim=OptimConfig(**optim),
                   train=TrainConfig(**dict(SETTINGS, update_freq=one_update_freq)), data_dir=data_dir))
    two = tmp_path / "two"
    options = list(CLI_SETTINGS)
    if sgd_like:
        (tmp_path / "optim.toml").write_text("[optim]\nlr = 0.01\neps = 1.0\nclip_norm = 0.0\n")
        options += ["--config", tmp_path / "optim.toml"]
    result = torchrun(2, data_dir, "--save-dir", two, "--update-freq", ranks_update_freq, *options)
    assert result.returncode == 0, result.stderr[-3000:]

    a, b = checkpoint.load(one / "last.pt"), checkpoint.load(two / "last.pt")
    assert a["configs"]["model"] == b["configs"]["model"] and a["configs"]["optim"] == b["configs"]["optim"]
    pa, pb = a["train_state"]["progress"], b["train_state"]["progress"]
    assert pa["updates"] == pb["updates"] == 3
    assert pa["train_tokens"] == pb["train_tokens"]  # the same batches, counted over both ranks
    for name, value in a["weights"].items():
        torch.testing.assert_close(b["weights"][name], value, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
    if sgd_like:  # the changes themselves agree, not only the weights
        torch.manual_seed(SETTINGS["seed"])  # the initial weights, as train() makes them
        initial = checkpoint.model_state(Transformer(ModelConfig.from_dict(a["configs"]["model"])))
        for name, value in a["weights"].items():
            change_one, change_two = value - initial[name], b["weights"][name] - initial[name]
            assert change_one.abs().max() > 0 or name.endswith("norm.weight") or name.endswith("norm.bias"), name
            torch.testing.assert_close(change_two, change_one, rtol=1e-3, atol=5e-7, msg=lambda m: f"{name}: {m}")

    # rank 0 alone wrote: one summary line, no duplicated records; both ranks' RNG states saved
    assert result.stderr.count("updates, ") == 1, result.stderr[-3000:]
    kinds = [[json.loads(r)["kind"] for r in (d / "metrics.jsonl").read_text().splitlines()] for d in (one, two)]
    assert kinds[0].count("valid") == kinds[1].count("valid") >= 1
    rngs = b["train_state"]["rng_ranks"]
    assert len(rngs) == 2 and b["train_state"]["world_size"] == 2
    assert not torch.equal(rngs[0]["cpu"], rngs[1]["cpu"])  # each rank its own dropout stream
    # each rank validated half the batches and the sums were added: the figures of the whole split
    valid = [[json.loads(r) for r in (d / "metrics.jsonl").read_text().splitlines() if '"valid"' in r] for d in (one, two)]
    assert [v["loss"] for v in valid[1]] == pytest.approx([v["loss"] for v in valid[0]], rel=2e-3)


@pytest.mark.system
def test_the_patience_stop_is_one_decision_for_every_rank(data_dir, tmp_path):
    # a learning rate that wrecks the model: validation stops improving, and both ranks stop together
    (tmp_path / "wild.toml").write_text("[optim]\nlr = 3.0\nwarmup = 1\n")
    result = torchrun(2, data_dir, "--save-dir", tmp_path / "run", *CLI_SETTINGS, "--config", tmp_path / "wild.toml",
                      "--patience", "1", "--validate-interval-updates", "1", "--max-updates", "40")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "stopping: loss has not improved for 1 validations (--patience)" in result.stderr
    assert checkpoint.load(tmp_path / "run" / "last.pt")["train_state"]["progress"]["updates"] < 40


@pytest.mark.parametrize("fault", ["rank1-exit", "rank1-hang"])
@pytest.mark.system
def test_a_rank_that_fails_or_hangs_ends_the_job_with_an_error(data_dir, tmp_path, fault):
    started = time.monotonic()
    result = torchrun(2, data_dir, "--save-dir", tmp_path / "run", "--dist-timeout", "15", "--arch", "tiny",
                      "--max-tokens", "300", "--max-updates", "50", "--threads", "1", "--device", "cpu",
                      env={distributed.FAULT_ENV: fault}, timeout=180)
    elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert "injected fault" in result.stderr
    assert elapsed < 120, elapsed  # startup + --dist-timeout + torchrun's teardown, never a silent hang
    if fault == "rank1-hang":  # rank 0 gave up on its own, saying why
        assert "rank 0:" in result.stderr and "--dist-timeout 15s" in result.stderr, result.stderr[-3000:]


@pytest.mark.system
def test_the_others_wait_for_rank_0_preparing_data_longer_than_the_dist_timeout(data_dir, tmp_path):
    # rank 0 trains the tokenizer and binarizes raw files; a large corpus takes longer than any collective
    # should wait, so that wait is not bounded by --dist-timeout (here 5 s against a 12-s preparation)
    raw = data_dir.parent
    started = time.monotonic()
    result = torchrun(2, "--src", "src", "--tgt", "tgt", "--train", raw / "train", "--valid", raw / "valid",
                      "--vocab-size", "25", "--save-dir", tmp_path / "run", *CLI_SETTINGS, "--dist-timeout", "5",
                      env={distributed.FAULT_ENV: "rank0-slow-prepare-12"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert time.monotonic() - started > 12
    assert checkpoint.load(tmp_path / "run" / "last.pt")["train_state"]["progress"]["updates"] == 3
