"""SAVE_DIR's files of one training run, and what a run finds there when it starts.

Owns last.pt (with the training state), best.pt (without it), the update-numbered copies,
config.json and the metrics file's place: what a starting run finds (a run to resume, checked
against this job's settings and tokenizer; an old run that a --force run replaces at its first
save, so a failure before it leaves the old files as they were; the temp files a killed run
left: a save's, a --force run's metrics), and the order of a save (best.pt before last.pt: a kill
between the two leaves last.pt behind best.pt, never ahead). What goes into a checkpoint is the
trainer's and checkpoint.py's.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Optional

from .. import checkpoint, log
from ..config import ModelConfig, RunPaths, TrainConfig, config_diff
from ..errors import ConfigError, InputError
from ..textio import atomic_write_bytes, remove_stale_temps, temp_path

# Settings that may change when a run is resumed: limits and where/how fast it runs.
RESUMABLE_CHANGES = {"max_updates", "max_epochs", "max_time", "log_interval", "device", "threads", "validate_interval_updates",
                     "patience", "save_interval_updates", "keep_last", "tensorboard_dir", "eval_bleu", "eval_bleu_beam",
                     "eval_bleu_lenpen", "eval_bleu_max_len_a", "eval_bleu_max_len_b",
                     "dist_timeout", "compile"}


class RunFiles:
    def __init__(self, save_dir: Path, configs: dict, is_main: bool):
        self.paths = RunPaths(save_dir)
        self.configs, self.is_main = configs, is_main
        # a --force run's metrics until its first save: a temp name with this process's PID, so the
        # file of a run that was killed is known for what it is and removed by the next run
        self.metrics_new = temp_path(self.paths.metrics)
        self.replacing_old_run = False

    @property
    def metrics_path(self) -> Path:
        """Where this run's metrics go now: beside the old run's until a --force run's first save."""
        return self.metrics_new if self.replacing_old_run else self.paths.metrics

    def open(self, force: bool, dist, tokenizer_bytes: bytes, tokenizer_name: str) -> Optional[dict]:
        """last.pt's checkpoint when this run resumes it (its configs and tokenizer checked against
        this run's), else None: a fresh run (config.json written), or with --force and an old run
        there, a run that replaces it at its first save."""
        save_dir, paths = self.paths.save_dir, self.paths
        save_dir.mkdir(parents=True, exist_ok=True)
        # temp files of dead processes: of a killed save, or the metrics of a --force run killed before its first save
        for stale in remove_stale_temps(save_dir, rf".+\.pt|{re.escape(paths.metrics.name)}"):
            log.info(f"removed {stale.name}, left by a run that was killed")
        if force and any(p.exists() for p in (paths.last, paths.best, paths.metrics)):
            log.warn(f"--force: starting a new run in {save_dir}; the old run's checkpoints and metrics are replaced "
                     f"at this run's first save")
            self.replacing_old_run = True
            return None
        dist.check_same(paths.last.exists(), f"whether {paths.last} exists (--save-dir must be shared by all nodes)")
        if not paths.last.exists():
            if paths.best.exists():
                raise InputError(f"{save_dir}: holds best.pt from another run but no last.pt to resume; pick another --save-dir or pass --force to replace it")
            if self.is_main:
                self._write_config()
            return None
        ckpt = checkpoint.load(paths.last)
        diffs = resume_conflicts(ckpt["configs"], self.configs)
        if diffs:
            raise ConfigError(f"{paths.last}: saved with a different configuration, so it cannot be resumed: "
                              + "; ".join(diffs) + ". Use the same settings, another --save-dir, or --force to start over")
        if checkpoint.tokenizer_bytes(ckpt) != tokenizer_bytes:
            raise InputError(f"{paths.last}: was trained with another tokenizer than {tokenizer_name}")
        return ckpt

    def best_valid(self) -> Optional[dict]:
        """best.pt's validation figures (loss, nll, bleu, chrf), or None: best.pt is written before
        last.pt, so after a kill between the two it holds a better validation than last.pt knows of."""
        if not self.paths.best.exists():
            return None
        try:
            valid = checkpoint.load(self.paths.best).get("valid") or {}
        except InputError as error:
            log.warn(f"{self.paths.best}: cannot be read ({error}); it will be replaced at the next improvement")
            return None
        return valid if valid.get("loss") is not None else None

    def write(self, ckpt: dict, best: bool, numbered_keep: int = 0) -> None:
        """best.pt (ckpt without its training state) when `best`, then last.pt; a --force run's first
        save then replaces the old run's files; numbered_keep > 0: also checkpoint_u<N>.pt, keeping
        the newest numbered_keep of them."""
        if best:
            checkpoint.save({k: v for k, v in ckpt.items() if k != "train_state"}, self.paths.best)
        checkpoint.save(ckpt, self.paths.last)
        if self.replacing_old_run:  # this run's last.pt exists now: the old run's other files go
            self._replace_old_run(best)
        if numbered_keep:
            checkpoint.save(ckpt, checkpoint.numbered_path(self.paths.save_dir, ckpt["updates"]))
            checkpoint.prune_numbered(self.paths.save_dir, numbered_keep)

    def _replace_old_run(self, wrote_best: bool) -> None:
        """A --force run's first save, once its last.pt is written: the old run's update-numbered copies
        and best.pt (unless this save replaced it) go; this run's config.json and metrics (written to
        metrics_new so far) take the old ones' places."""
        checkpoint.prune_numbered(self.paths.save_dir, 0)
        if not wrote_best:
            self.paths.best.unlink(missing_ok=True)
        self._write_config()
        if self.metrics_new.exists():
            os.replace(self.metrics_new, self.paths.metrics)
        else:
            self.paths.metrics.unlink(missing_ok=True)
        self.replacing_old_run = False

    def _write_config(self) -> None:
        atomic_write_bytes(self.paths.config, (json.dumps(self.configs, indent=2) + "\n").encode())


def resume_conflicts(saved: dict, current: dict) -> list[str]:
    """The differences between a checkpoint's configs and this job's that forbid resuming it (the
    settings in RESUMABLE_CHANGES may change)."""
    return list(config_diff(_without(saved), _without(current)))


def _without(configs: dict) -> dict:
    out = json.loads(json.dumps(configs))
    # settings added since a run was saved count as their defaults (it ran with that behaviour)
    out["train"] = {**json.loads(json.dumps(TrainConfig().to_dict())), **out.get("train", {})}
    out["model"] = {**json.loads(json.dumps(ModelConfig().to_dict())), **out.get("model", {})}
    for key in RESUMABLE_CHANGES:
        out.get("train", {}).pop(key, None)
    out.pop("decoding", None)  # what translate does by default with the model, not how it trains
    out.pop("schedule", None)  # follows from the settings compared here and the limits, which may change
    # settings added since a run was saved count as their defaults; a run saved before lr_schedule
    # existed decayed as inverse-sqrt
    out["optim"] = {"lr_schedule": "inverse-sqrt", **out.get("optim", {})}
    return out
