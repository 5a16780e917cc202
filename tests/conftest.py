"""Shared fixtures: tiny models and tiny corpora made on the fly (tests never download anything)."""

from __future__ import annotations

import hashlib
import inspect
import os
import random
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from seqtool.config import model_config_for
from seqtool.model import Transformer

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))

pytest_plugins = ["pytester"]  # test_tiers.py runs pytest on test files it writes, to prove the hook below fires

TIERS = ("unit", "integration", "system")  # declared, with their meanings, in pyproject.toml


def tier_problems(items) -> list[str]:
    """One line per test that has no tier marker or more than one."""
    problems = []
    for item in items:
        tiers = sorted({mark.name for mark in item.iter_markers() if mark.name in TIERS})
        if len(tiers) != 1:
            problems.append(f"{item.nodeid}: {'no tier marker' if not tiers else 'several tier markers (' + ', '.join(tiers) + ')'}")
    return problems


@pytest.hookimpl(tryfirst=True)  # before -m/-k deselect anything: every collected test is checked, whatever runs
def pytest_collection_modifyitems(config, items):
    """Every test is exactly one of unit, integration, system (a module's `pytestmark` or the test's
    own mark): collection fails naming each test that is not."""
    problems = tier_problems(items)
    if problems:
        raise pytest.UsageError(f"{len(problems)} test(s) need exactly one of the markers {', '.join(TIERS)} "
                                "(pytest.mark.unit, a module's pytestmark = pytest.mark.unit, ...; see pyproject.toml):\n  "
                                + "\n  ".join(problems))


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


# The reverse task of `reverse_run`: letter sequences of length 5-15 over 20 letters, a 45-piece
# tokenizer (the 4 specials, "▁", the 20 letters and the 20 "▁letter" pieces: one token per letter),
# and the training command. 900 updates of 700-token batches (a fifth of the tokens of the 1000
# updates of 3000 it was): 99.5% of the held-out lines reversed exactly, 95.8% of the alignments
# mirrored (99.0% and 97.3% before); with --precision fp32 99.5% / 96.0%, with --seed 2 99.0% / 97.1%.
REVERSE_CORPUS = dict(n_train=5000, n_valid=200, seed=0, letters="abcdefghijklmnopqrst")
REVERSE_VOCAB = 45
REVERSE_TRAIN = ("--arch", "tiny", "--pre-norm", "--dropout", "0", "--label-smoothing", "0", "--lr", "2e-3", "--warmup", "50",
                 "--max-tokens", "700", "--max-updates", "900", "--threads", "2")
REVERSE_KEPT = ("spm.model", "spm.vocab", "bin", "run")  # what training makes; the texts are written again


def reverse_run_key() -> str:
    """What a reverse_run's result depends on: seqtool's own files, the settings above, and the
    versions and machine that train it (bf16 where the CPU or GPU has it, fp32 elsewhere)."""
    import platform

    import numpy
    import sentencepiece

    import seqtool
    from seqtool.device import cpu_bf16_instructions, cpu_capability

    digest = hashlib.sha256()
    package = Path(seqtool.__file__).parent
    for path in sorted(package.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    digest.update(repr((REVERSE_CORPUS, REVERSE_VOCAB, REVERSE_TRAIN, inspect.getsource(write_reverse_corpus), sys.version,
                        torch.__version__, numpy.__version__, sentencepiece.__version__, platform.machine(), cpu_capability(),
                        cpu_bf16_instructions(), gpu)).encode())
    return digest.hexdigest()[:24]


def _keep(d: Path, kept: Path) -> None:
    """REVERSE_KEPT of `d` into the cache entry `kept`: written beside it, then renamed into place
    (a session never reads half of one); the entries of other keys are removed. A cache that
    cannot be written costs the next session a training run, never a failure."""
    partial = kept.with_name(f".{kept.name}.{os.getpid()}")
    try:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        for name in REVERSE_KEPT:
            (shutil.copytree if (d / name).is_dir() else shutil.copy2)(d / name, partial / name)
        (partial / "complete").touch()
        for old in kept.parent.iterdir():  # runs trained by other code (another session's partial is its own)
            if not old.name.startswith("."):
                shutil.rmtree(old, ignore_errors=True)
        partial.rename(kept)
    except OSError:  # no room, or another session put its own in place meanwhile
        shutil.rmtree(partial, ignore_errors=True)


@pytest.fixture(scope="session")
def reverse_run(request, tmp_path_factory) -> ReverseRun:
    """A model trained through the CLI (train-tokenizer -> binarize -> train) to reverse letter
    sequences of length 5-15 over 20 letters (REVERSE_TRAIN: 900 updates of the tiny pre-norm
    model), trained once per session and shared by the tests that need a model that has learnt
    something. The trained files are kept in pytest's cache (.pytest_cache/d/seqtool-reverse-run),
    keyed by reverse_run_key(): a later session with the same seqtool files, settings and machine
    copies them instead of training (a fresh clone, as CI, or -p no:cacheprovider trains)."""
    d = tmp_path_factory.mktemp("reverse")
    texts = write_reverse_corpus(d, **REVERSE_CORPUS)
    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    key = reverse_run_key()
    kept = cache.mkdir("seqtool-reverse-run") / key if cache is not None else None
    if kept is not None and (kept / "complete").exists():
        for name in REVERSE_KEPT:
            (shutil.copytree if (kept / name).is_dir() else shutil.copy2)(kept / name, d / name)
        return ReverseRun(d, texts)
    seqtool("train-tokenizer", "train.src", "train.tgt", "--model-prefix", "spm", "--vocab-size", str(REVERSE_VOCAB), cwd=d)
    seqtool("binarize", "--src", "src", "--tgt", "tgt", "--train", "train", "--valid", "valid", "--test", "test",
            "--tokenizer", "spm.model", "--out", "bin", "--workers", "2", cwd=d)
    seqtool("train", "bin", "--save-dir", "run", *REVERSE_TRAIN, cwd=d)
    if kept is not None:
        _keep(d, kept)
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
