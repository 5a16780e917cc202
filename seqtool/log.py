"""Logging to stderr: stdout is reserved for results (translations, scores).

Owns the rich console on stderr, rank-0-only messages in distributed runs, and the training
progress display: a live progress bar on a terminal, plain periodic log lines otherwise.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Optional

from rich.console import Console

console = Console(stderr=True, highlight=False, soft_wrap=True)


def _is_rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"


def info(message: str) -> None:
    if _is_rank0():
        console.print(message, markup=False)


def warn(message: str) -> None:
    if _is_rank0():
        console.print(f"warning: {message}", style="yellow", markup=False)


def error(message: str) -> None:
    console.print(f"error: {message}", style="bold red", markup=False)


def stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


class Progress:
    """Progress of a long pass (training; distillation): a rich bar with its ETA on a terminal, else one
    plain line every `interval` seconds."""

    def __init__(self, total: Optional[float], unit: str, interval: float = 10.0, enabled: bool = True, label: str = "train"):
        self.total, self.unit, self.interval, self.label = total, unit, interval, label
        self.enabled = enabled and _is_rank0()
        self.live = self.enabled and stderr_is_terminal()
        self._last = 0.0
        self._bar = None
        if self.live:
            from rich.progress import BarColumn, Progress as RichProgress, TextColumn, TimeRemainingColumn

            self._bar = RichProgress(
                TextColumn(f"[bold]{label}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                TimeRemainingColumn(), TextColumn("{task.fields[stats]}"), console=console, transient=False,
            )
            self._task = self._bar.add_task(label, total=total or None, stats="")
            self._bar.start()

    def update(self, done: float, stats: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=done, stats=stats)
            return
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            of = f"/{self.total:.0f}" if self.total else ""
            console.print(f"{'' if self.label == 'train' else self.label + ': '}{self.unit} {done:.0f}{of} | {stats}", markup=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
