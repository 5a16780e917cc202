"""Shared fixtures: tiny models and tiny corpora made on the fly (tests never download anything)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from seqtool.config import model_config_for
from seqtool.model import Transformer

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))


@pytest.fixture
def tiny_model():
    torch.manual_seed(0)
    return Transformer(model_config_for("tiny", vocab_size=40, dropout=0.0, max_positions=64)).eval()


def write_reverse_corpus(directory: Path, n_train: int, n_valid: int, seed: int = 0, letters: str = "abcdefghij",
                         lengths: tuple[int, int] = (5, 15)) -> dict[str, tuple[list[str], list[str]]]:
    """PREFIX.src: random letter sequences; PREFIX.tgt: the same reversed. Returns the texts."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out = {}
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_valid)):
        src, tgt = [], []
        while len(src) < n:
            seq = [rng.choice(letters) for _ in range(rng.randint(*lengths))]
            line = " ".join(seq)
            if line in seen:  # held-out sequences are never seen in training
                continue
            seen.add(line)
            src.append(line)
            tgt.append(" ".join(reversed(seq)))
        (directory / f"{split}.src").write_text("\n".join(src) + "\n")
        (directory / f"{split}.tgt").write_text("\n".join(tgt) + "\n")
        out[split] = (src, tgt)
    return out


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """An untrained tiny model with a real tokenizer, saved as a seqtool checkpoint."""
    from seqtool import checkpoint
    from seqtool.config import OptimConfig, TokenizerConfig, TrainConfig
    from seqtool.tokenizer import train_tokenizer

    d = tmp_path_factory.mktemp("ckpt")
    write_reverse_corpus(d, 200, 10)
    spm = train_tokenizer([d / "train.src", d / "train.tgt"], str(d / "spm"), TokenizerConfig(vocab_size=24))
    torch.manual_seed(0)
    config = model_config_for("tiny", vocab_size=24, dropout=0.0, max_positions=32)
    model = Transformer(config)
    configs = {"model": config.to_dict(), "optim": OptimConfig().to_dict(), "train": TrainConfig().to_dict()}
    path = d / "model.pt"
    checkpoint.save(checkpoint.build(configs, spm.read_bytes(), checkpoint.model_state(model)), path)
    return path


def seqtool(*args, cwd, stdin=None):
    """Run the installed CLI as a user would (python -m seqtool); fail with its stderr."""
    env = dict(os.environ, OMP_NUM_THREADS="2")
    result = subprocess.run([sys.executable, "-m", "seqtool", *map(str, args)], cwd=cwd, input=stdin,
                            capture_output=True, text=True, timeout=900, env=env)
    assert result.returncode == 0, f"seqtool {' '.join(map(str, args))} failed:\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr
    return result


@dataclass
class ReverseRun:
    directory: Path  # holds spm.model, bin/, run/{best.pt,last.pt,config.json,metrics.jsonl}
    texts: dict[str, tuple[list[str], list[str]]]  # split -> (sources, reversed targets)


def binarized_reverse_corpus(directory: Path) -> Path:
    """300 training and 20 validation reversal pairs over 10 letters, a 25-piece tokenizer, and
    DATA_DIR = directory/bin: the small data of the training-loop tests."""
    from seqtool.binarize import SplitSpec, binarize
    from seqtool.config import TokenizerConfig
    from seqtool.tokenizer import train_tokenizer

    write_reverse_corpus(directory, 300, 20)
    spm = train_tokenizer([directory / "train.src", directory / "train.tgt"], str(directory / "spm"), TokenizerConfig(vocab_size=25))
    binarize("src", "tgt", [SplitSpec("train", str(directory / "train")), SplitSpec("valid", str(directory / "valid"))], spm,
             directory / "bin")
    return directory / "bin"


def tiny_job(data_dir: Path, save_dir: Path, model: str = "tiny", finetune=None, lr_schedule: str = "auto", **train_options):
    """A TrainJob of the tiny preset on DATA_DIR: 600-token batches, 2 threads, 10 warmup updates.
    (A run whose limit is raised on resume needs lr_schedule="inverse-sqrt" to equal an unbroken
    one: the default decays to the limit it was started with.)"""
    from seqtool.config import OptimConfig, TrainConfig
    from seqtool.training.train import TrainJob

    train_options.setdefault("max_tokens", 600)
    train_options.setdefault("threads", 2)
    return TrainJob(save_dir=save_dir, model=model_config_for(model), optim=OptimConfig(warmup=10, lr_schedule=lr_schedule),
                    train=TrainConfig(**train_options), data_dir=data_dir, finetune=finetune)


def interrupted_then_resumed(job, at_update: int, monkeypatch):
    """Run `job` until a Ctrl-C arrives before update `at_update` + 1 (last.pt saved), then run the
    same job again, which resumes it; returns the second run's TrainResult."""
    from seqtool.training.train import Trainer, train

    real_step = Trainer._step

    def interrupt(self, *args):
        if self.state.updates == at_update:
            raise KeyboardInterrupt
        return real_step(self, *args)

    monkeypatch.setattr(Trainer, "_step", interrupt)
    with pytest.raises(KeyboardInterrupt):
        train(job)
    monkeypatch.setattr(Trainer, "_step", real_step)
    return train(job)


@pytest.fixture(autouse=True)
def keep_torch_threads():
    """train(--threads N) sets torch's global thread count: give later tests theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def reverse_run(tmp_path_factory) -> ReverseRun:
    """A model trained through the CLI (train-tokenizer -> binarize -> train) to reverse letter
    sequences of length 5-15 over 20 letters: ~1000 updates of the tiny pre-norm model, trained
    once per session and shared by the tests that need a model that has learnt something."""
    d = tmp_path_factory.mktemp("reverse")
    texts = write_reverse_corpus(d, 5000, 200, seed=0, letters="abcdefghijklmnopqrst")
    # 45 pieces: the 4 specials, "▁", the 20 letters and the 20 "▁letter" pieces: one token per letter
    seqtool("train-tokenizer", "train.src", "train.tgt", "--model-prefix", "spm", "--vocab-size", "45", cwd=d)
    seqtool("binarize", "--src", "src", "--tgt", "tgt", "--train", "train", "--valid", "valid", "--test", "test",
            "--tokenizer", "spm.model", "--out", "bin", "--workers", "2", cwd=d)
    seqtool("train", "bin", "--save-dir", "run", "--arch", "tiny", "--pre-norm", "--dropout", "0", "--label-smoothing", "0",
            "--lr", "2e-3", "--warmup", "100", "--max-tokens", "3000", "--max-updates", "1000", "--threads", "2", cwd=d)
    return ReverseRun(d, texts)


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> Path:
    """Raw reverse-corpus files DIR/{train,valid,test}.{src,tgt} (300/20/20 lines), a 25-piece
    tokenizer DIR/spm.model and DIR/bin, binarized with it: shared by the training-loop tests."""
    from seqtool.binarize import SplitSpec, binarize
    from seqtool.config import TokenizerConfig
    from seqtool.tokenizer import train_tokenizer

    d = tmp_path_factory.mktemp("corpus")
    write_reverse_corpus(d, 300, 20)
    spm = train_tokenizer([d / "train.src", d / "train.tgt"], str(d / "spm"), TokenizerConfig(vocab_size=25))
    binarize("src", "tgt", [SplitSpec("train", str(d / "train")), SplitSpec("valid", str(d / "valid"))], spm, d / "bin")
    return d


def process_running(pid: int) -> bool:
    """The process exists and is not a zombie (an exited child its parent has not reaped yet)."""
    try:
        state = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("State:"))
    except (OSError, StopIteration):
        return False
    return "\tZ" not in state
