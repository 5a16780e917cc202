"""The learning-rate schedule: warmup, then a decay that knows the run's budget.

A run with a horizon (--max-updates, --max-epochs, --max-time: whichever binds first) decays to
zero exactly at that horizon: at a fixed budget that is worth more than an open-ended decay
(Li, Yumer & Ramanan, "Budgeted Training", ICLR 2020; the warmup-stable-decay cooldowns of
Hägele et al., 2024; nanoGPT decays to max_iters). A run without one keeps the Transformer's
inverse square root.

    progress p   the share of the budget trained before this update, in [0, 1]: the largest of
                 updates / max_updates, seconds / max_time (counted across resumes: the saved
                 train_seconds) and epochs / max_epochs
    warmup       linear from 0: over --warmup N updates, clipped to WARMUP_CAP of the horizon (a
                 1000-update warmup in a 4-minute run would never end), or over a share of the
                 horizon when --warmup is a fraction (0 < F < 1)
    decay        linear: 1 - p; cosine: (1 + cos(pi p)) / 2; wsd: 1 until 1 - WSD_COOLDOWN, then
                 linearly to 0; inverse-sqrt: sqrt(warmup / update) after the warmup

lr = peak x warmup x decay. Everything is a pure function of the saved progress, so a resumed run
takes exactly the learning rates of an uninterrupted one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from ..errors import ConfigError
from ..config import OptimConfig, TrainConfig

SCHEDULES = ("auto", "inverse-sqrt", "linear", "cosine", "wsd")
AUTO_WITH_HORIZON = "linear"  # what auto picks when the run has a budget (bench/results.md, issue 16)
WARMUP_CAP = 0.1  # a warmup given in updates ends by this share of the horizon at the latest
WSD_COOLDOWN = 0.2  # wsd decays over the last 20% of the horizon


@dataclass(frozen=True)
class Schedule:
    name: str  # resolved: inverse-sqrt, linear, cosine or wsd
    peak: float
    warmup_updates: int  # 0 when the warmup is a share of the horizon (or there is none)
    warmup_share: float  # the horizon's share the warmup may take (WARMUP_CAP, or --warmup F); 0: none

    def lr(self, update: int, progress: Optional[float]) -> float:
        """The learning rate of update `update` (1-based), `progress` the share of the budget
        trained before it (None: the run has no horizon)."""
        if self.name == "inverse-sqrt":
            w = self.warmup_updates
            if w and update < w:
                return self.peak * update / w
            return self.peak * math.sqrt(max(w, 1) / max(update, 1))
        assert progress is not None, f"the {self.name} schedule needs a horizon"
        p = min(max(progress, 0.0), 1.0)
        by_updates = update / self.warmup_updates if self.warmup_updates else 0.0
        by_share = p / self.warmup_share if self.warmup_share else 1.0
        warm = min(1.0, max(by_updates, by_share))
        if self.name == "linear":
            decay = 1.0 - p
        elif self.name == "cosine":
            decay = 0.5 * (1.0 + math.cos(math.pi * p))
        else:  # wsd
            decay = min(1.0, (1.0 - p) / WSD_COOLDOWN)
        return self.peak * warm * decay

    def describe(self) -> dict:
        return {"name": self.name, "peak": self.peak, "warmup_updates": self.warmup_updates,
                "warmup_share": self.warmup_share}

    def summary(self) -> str:
        if self.name == "inverse-sqrt":
            return f"inverse-sqrt after {self.warmup_updates} warmup updates (no horizon)"
        warm = (f"{self.warmup_updates} warmup updates (at most {self.warmup_share:.0%} of the horizon)"
                if self.warmup_updates else f"warmup over {self.warmup_share:.0%} of the horizon")
        return f"{self.name} decay to 0 at the horizon, {warm}"


def has_horizon(train: TrainConfig) -> bool:
    return bool(train.max_updates or train.max_epochs or train.max_time)


def resolve(optim: OptimConfig, train: TrainConfig) -> Schedule:
    """--lr-schedule and --warmup against the run's limits."""
    name = optim.lr_schedule
    horizon = has_horizon(train)
    if name == "auto":
        name = AUTO_WITH_HORIZON if horizon else "inverse-sqrt"
    if name != "inverse-sqrt" and not horizon:
        raise ConfigError(f"--lr-schedule {name} decays to a horizon: give --max-updates, --max-epochs or --max-time "
                          "(or use --lr-schedule inverse-sqrt)")
    fraction = 0 < optim.warmup < 1
    if fraction and name == "inverse-sqrt":
        raise ConfigError(f"--warmup {optim.warmup:g} is a share of the horizon, which inverse-sqrt has none of; "
                          "give --warmup as a number of updates")
    if fraction:
        return Schedule(name, optim.lr, 0, float(optim.warmup))
    capped = name != "inverse-sqrt" and optim.warmup > 0
    return Schedule(name, optim.lr, int(optim.warmup), WARMUP_CAP if capped else 0.0)


def progress(train: TrainConfig, updates: int, seconds: float, epochs: float) -> Optional[float]:
    """The share of the budget used so far (the largest over the limits set), or None without one.
    `epochs` counts fractional epochs (batches of the current epoch over its batches)."""
    shares = []
    if train.max_updates:
        shares.append(updates / train.max_updates)
    if train.max_time:
        shares.append(seconds / train.max_time)
    if train.max_epochs:
        shares.append(epochs / train.max_epochs)
    return max(shares) if shares else None
