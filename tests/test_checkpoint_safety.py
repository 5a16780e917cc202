"""Never lose work: atomic saves down to the directory entry, kill -9 just before the rename,
interval saves and update-numbered copies, interrupted runs (no best.pt without a validation)."""

import dataclasses
import os
import stat
import subprocess
import sys
import textwrap

import pytest
import torch

from seqtool import checkpoint
from seqtool.config import ConfigError, OptimConfig, TrainConfig, model_config_for
from seqtool.errors import InputError
from seqtool.textio import remove_stale_temps, temp_path
from seqtool.training.train import Trainer, TrainJob, train

from conftest import tiny_job


def _job(corpus, save_dir, **train_options):
    return tiny_job(corpus / "bin", save_dir, **train_options)


@pytest.mark.integration
def test_save_interval_and_keep_last_leave_exactly_the_expected_files(small_corpus, tmp_path):
    save = tmp_path / "run"
    train(_job(small_corpus, save, max_updates=7, save_interval_updates=2, keep_last=2))
    names = sorted(p.name for p in save.iterdir())
    assert names == ["best.pt", "checkpoint_u4.pt", "checkpoint_u6.pt", "config.json", "last.pt", "metrics.jsonl"]
    for updates in (4, 6):
        copy = checkpoint.load(save / f"checkpoint_u{updates}.pt")
        assert copy["train_state"]["progress"]["updates"] == updates  # resumable, like last.pt
    assert checkpoint.load(save / "last.pt")["train_state"]["progress"]["updates"] == 7


@pytest.mark.integration
def test_save_interval_without_keep_last_writes_last_pt_only(small_corpus, tmp_path, monkeypatch):
    saved = []
    real = checkpoint.save
    monkeypatch.setattr(checkpoint, "save", lambda ckpt, path: saved.append((path.name, ckpt["updates"])) or real(ckpt, path))
    train(_job(small_corpus, tmp_path / "run", max_updates=5, save_interval_updates=2))
    # interval saves at 2 and 4 (last.pt only), then the validation at the end (best.pt, last.pt)
    assert saved == [("last.pt", 2), ("last.pt", 4), ("best.pt", 5), ("last.pt", 5)]
    assert not checkpoint.numbered_checkpoints(tmp_path / "run")


@pytest.mark.unit
def test_keep_last_needs_save_interval():
    with pytest.raises(ConfigError, match="--keep-last .* --save-interval-updates"):
        TrainConfig(keep_last=3)


@pytest.mark.integration
def test_interrupted_run_writes_last_pt_but_no_best_pt(small_corpus, tmp_path, monkeypatch):
    save = tmp_path / "run"
    real_step = Trainer._step
    steps = []

    def step_then_interrupt(self, *args):
        if len(steps) == 3:
            raise KeyboardInterrupt  # Ctrl-C (SIGTERM takes the same path) before anything was validated
        steps.append(1)
        return real_step(self, *args)

    monkeypatch.setattr(Trainer, "_step", step_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        train(_job(small_corpus, save, max_updates=10))
    assert (save / "last.pt").exists() and not (save / "best.pt").exists()
    assert checkpoint.load(save / "last.pt")["train_state"]["progress"]["updates"] == 3
    monkeypatch.setattr(Trainer, "_step", real_step)
    result = train(_job(small_corpus, save, max_updates=5))  # resumes; the first validation writes best.pt
    assert result.updates == 5 and checkpoint.load(save / "best.pt")["updates"] == 5


KILLED_SAVE = textwrap.dedent("""
    import os, sys
    from pathlib import Path

    real_replace = os.replace

    def die_before_rename(src, dst, *args, **kwargs):
        if str(dst).endswith("last.pt"):
            os._exit(9)  # like kill -9: no cleanup, no exception handlers, the temp file stays
        return real_replace(src, dst, *args, **kwargs)

    os.replace = die_before_rename
    from seqtool.config import OptimConfig, TrainConfig, model_config_for
    from seqtool.training.train import TrainJob, train

    train(TrainJob(save_dir=Path(sys.argv[2]), model=model_config_for("tiny"), optim=OptimConfig(warmup=10, lr_schedule="inverse-sqrt"),
                   train=TrainConfig(max_tokens=600, threads=1, max_updates=4, save_interval_updates=1),
                   data_dir=Path(sys.argv[1]), force=sys.argv[3:] == ["--force"]))
""")


@pytest.mark.system
def test_kill_just_before_the_rename_leaves_the_previous_last_pt(small_corpus, tmp_path):
    save = tmp_path / "run"
    train(_job(small_corpus, save, max_updates=2, lr_schedule="inverse-sqrt"))
    before = (save / "last.pt").read_bytes()
    killed = subprocess.run([sys.executable, "-c", KILLED_SAVE, str(small_corpus / "bin"), str(save)],
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == 9, killed.stderr
    # the previous last.pt, intact and loadable; the dead save's temp file is never taken for it
    assert (save / "last.pt").read_bytes() == before
    assert checkpoint.load(save / "last.pt")["train_state"]["progress"]["updates"] == 2
    leftovers = [p for p in save.iterdir() if p.name.startswith(".last.pt.tmp")]
    assert len(leftovers) == 1 and not checkpoint.numbered_checkpoints(save)
    # resuming works, removes the dead save's temp file, and ends where an unbroken run ends
    result = train(_job(small_corpus, save, max_updates=4, lr_schedule="inverse-sqrt"))
    assert result.updates == 4 and not leftovers[0].exists()
    train(_job(small_corpus, tmp_path / "unbroken", max_updates=4, lr_schedule="inverse-sqrt"))
    a = checkpoint.load(save / "last.pt")["weights"]
    b = checkpoint.load(tmp_path / "unbroken" / "last.pt")["weights"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)


@pytest.mark.system
def test_a_force_run_killed_before_its_first_save_leaves_the_old_run_and_only_temp_files(small_corpus, tmp_path):
    save = tmp_path / "run"
    train(_job(small_corpus, save, max_updates=2, lr_schedule="inverse-sqrt"))
    before = _snapshot(save)
    killed = subprocess.Popen([sys.executable, "-c", KILLED_SAVE, str(small_corpus / "bin"), str(save), "--force"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = killed.communicate(timeout=300)
    assert killed.returncode == 9, err
    after = _snapshot(save)
    assert {name: data for name, data in after.items() if name in before} == before  # the old run, whole
    metrics = temp_path(save / "metrics.jsonl", pid=killed.pid)  # its metrics so far, under its PID: no metrics.jsonl.new
    assert set(after) - set(before) - {".seqtool.lock"} == {metrics.name, temp_path(save / "last.pt", pid=killed.pid).name}
    assert '"update": 1' in metrics.read_text()
    # the next run resumes the old run and removes the dead run's files
    assert train(_job(small_corpus, save, max_updates=3, lr_schedule="inverse-sqrt")).updates == 3
    assert sorted(p.name for p in save.iterdir()) == ["best.pt", "config.json", "last.pt", "metrics.jsonl"]


@pytest.mark.unit
def test_save_fsyncs_the_file_then_the_directory(tiny_checkpoint, tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def spy(fd):
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    checkpoint.save(checkpoint.load(tiny_checkpoint), tmp_path / "last.pt")
    assert synced == ["file", "dir"]
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


@pytest.mark.unit
def test_stale_temp_files_of_dead_saves_are_removed_live_ones_kept(tmp_path):
    dead = temp_path(tmp_path / "last.pt", pid=4_194_305)  # above Linux's largest pid: no such process
    alive = temp_path(tmp_path / "best.pt", pid=os.getppid())
    other = tmp_path / ".notes.tmp123"
    for p in (dead, alive, other):
        p.write_bytes(b"partial")
    assert remove_stale_temps(tmp_path, r".+\.pt") == [dead]
    assert not dead.exists() and alive.exists() and other.exists()


@pytest.mark.unit
def test_prune_keeps_the_newest_numbered_copies(tmp_path):
    for n in (5, 40, 300, 1000):
        (tmp_path / f"checkpoint_u{n}.pt").write_bytes(b"x")
    (tmp_path / "checkpoint_best.pt").write_bytes(b"x")  # not an update-numbered copy: never touched
    removed = checkpoint.prune_numbered(tmp_path, 2)
    assert sorted(p.name for p in removed) == ["checkpoint_u40.pt", "checkpoint_u5.pt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_best.pt", "checkpoint_u1000.pt", "checkpoint_u300.pt"]


class _SignalOnFirstWrite:
    """A file handle that sends this process `signum` from inside torch.save's first write: where a
    Ctrl-C or SIGTERM that raised at once broke the zip writer ("unexpected pos") and lost the save."""

    def __init__(self, handle, signum):
        self.handle, self.signum, self.sent = handle, signum, False

    def write(self, data):
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signum)
        return self.handle.write(data)

    def __getattr__(self, name):
        return getattr(self.handle, name)


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
@pytest.mark.integration
def test_a_signal_during_a_checkpoint_write_waits_for_the_write(small_corpus, tmp_path, monkeypatch, signum):
    import signal

    save = tmp_path / "run"
    real_save = torch.save
    writes = []

    def save_and_signal_once(obj, handle, *args, **kwargs):
        writes.append(1)
        if len(writes) == 1:  # the interval save at update 2
            handle = _SignalOnFirstWrite(handle, getattr(signal, signum))
        return real_save(obj, handle, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_and_signal_once)
    # Python's own Ctrl-C handler, also where the test runner was started with SIGINT ignored
    runner_sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):  # the run stops (the CLI exits 130), after the save
            train(_job(small_corpus, save, max_updates=10, save_interval_updates=2))
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored
    finally:
        signal.signal(signal.SIGINT, runner_sigint)
    assert len(writes) == 1  # the interrupted save completed; nothing to write again
    assert checkpoint.load(save / "last.pt")["train_state"]["progress"]["updates"] == 2
    assert sorted(p.name for p in save.iterdir()) == ["config.json", "last.pt", "metrics.jsonl"]  # no temp file left
    monkeypatch.setattr(torch, "save", real_save)
    assert train(_job(small_corpus, save, max_updates=3)).updates == 3  # and the run resumes


@pytest.mark.unit
def test_the_torch_floor_has_no_known_weights_only_bypass():
    # torch.load(weights_only=True) is what keeps a checkpoint from running code: torch below 2.10 has
    # known bypasses (CVE-2025-32434 before 2.6, CVE-2026-24747 before 2.10), so pip may not pick one
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    floor = re.search(r'"torch>=([\d.]+)"', text).group(1)
    assert tuple(int(x) for x in floor.split(".")) >= (2, 10)
    assert tuple(int(x) for x in floor.split(".")) <= (2, 11)  # and no higher: users on 2.10 / 2.11 stay supported


# ---- one run per directory; --force replaces the old run only once the new one has saved ----------
def _snapshot(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.mark.system
def test_a_second_run_on_the_same_save_dir_is_refused_naming_the_holder(small_corpus, tmp_path):
    save = tmp_path / "run"
    save.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from seqtool.runlock import RunLock
        lock = RunLock({str(save)!r}); lock.acquire(); print("locked", flush=True); time.sleep(120)""")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(InputError, match=rf"another seqtool train \(PID {holder.pid}\) is using this directory"):
            train(_job(small_corpus, save, max_updates=1))
        assert not (save / "last.pt").exists()
    finally:
        holder.kill()
        holder.wait()
    assert train(_job(small_corpus, save, max_updates=1)).updates == 1  # the holder's death freed it
    assert not (save / ".seqtool.lock").exists()  # and a finished run leaves no lock file


@pytest.mark.integration
def test_force_deletes_nothing_until_the_new_run_has_saved(small_corpus, tmp_path, monkeypatch):
    save = tmp_path / "run"
    train(_job(small_corpus, save, max_updates=4, save_interval_updates=2, keep_last=2))
    before = _snapshot(save)
    assert "checkpoint_u4.pt" in before

    def fails(self, *args):
        raise RuntimeError("the new run dies before its first save")

    with monkeypatch.context() as m:
        m.setattr(Trainer, "_step", fails)
        with pytest.raises(RuntimeError, match="dies before"):
            train(dataclasses.replace(_job(small_corpus, save, max_updates=2), force=True))
    assert _snapshot(save) == before  # the old run is whole
    result = train(dataclasses.replace(_job(small_corpus, save, max_updates=1), force=True))
    assert result.updates == 1
    names = sorted(p.name for p in save.iterdir())
    assert names == ["best.pt", "config.json", "last.pt", "metrics.jsonl"]  # the old run's numbered copies went
    assert checkpoint.load(save / "last.pt")["train_state"]["progress"]["updates"] == 1
    records = [line for line in (save / "metrics.jsonl").read_text().splitlines()]
    assert all('"update": 1' in r for r in records)  # only the new run's metrics


@pytest.mark.integration
def test_a_save_cut_between_best_and_last_never_loses_the_better_best(small_corpus, tmp_path, monkeypatch):
    import seqtool.training.validate
    from seqtool.training.validate import ValidResult

    losses = iter([3.0, 2.0, 2.5, 2.6])
    monkeypatch.setattr(seqtool.training.validate, "evaluate", lambda *a, **k: ValidResult(*(2 * [next(losses)])))
    real, calls = checkpoint.save, []

    def killed_after_best(ckpt, path):
        calls.append(path.name)
        if calls.count("last.pt") == 2 and path.name == "last.pt":  # update 2: best.pt written, then SIGKILL
            raise SystemExit("killed")
        return real(ckpt, path)

    job = dict(validate_interval_updates=1, ema_decay=0.0)
    with monkeypatch.context() as m:
        m.setattr(checkpoint, "save", killed_after_best)
        with pytest.raises(SystemExit):
            train(_job(small_corpus, tmp_path / "run", max_updates=5, **job))
    assert checkpoint.load(tmp_path / "run" / "best.pt")["valid"]["loss"] == 2.0
    assert checkpoint.load(tmp_path / "run" / "last.pt")["train_state"]["progress"]["best_metric_value"] == 3.0
    train(_job(small_corpus, tmp_path / "run", max_updates=3, **job))  # resumes at update 1; validates 2.5 at update 2
    assert checkpoint.load(tmp_path / "run" / "best.pt")["valid"]["loss"] == 2.0  # not replaced by the worse 2.5
