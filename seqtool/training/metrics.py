"""Where training numbers go: SAVE_DIR/metrics.jsonl and, optionally, TensorBoard.

Owns the metrics records of a run: one JSON object per line in metrics.jsonl ("kind": "train"
per log interval, "kind": "valid" per validation, "valid_ema" for the weight average at the end), appended and closed at once so a killed run
keeps every line it wrote, and, with --tensorboard DIR, the same numbers as TensorBoard scalars
(train/loss, valid/bleu, ...) stepped by update. TensorBoard is an optional extra
(`pip install 'seqtool[tensorboard]'`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

from ..errors import ConfigError

# Record keys written as TensorBoard scalars, per kind of record (other keys stay in the JSON only).
SCALARS = {
    "train": ("loss", "ppl", "lr", "tokens_per_s"),
    "valid": ("loss", "ppl", "bleu", "chrf", "best_loss", "best"),
    "valid_ema": ("loss", "ppl", "bleu", "chrf"),
}


def open_summary_writer(directory: Path):
    """A TensorBoard SummaryWriter, or one clear error line when the extra is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("--tensorboard needs the tensorboard package: pip install 'seqtool[tensorboard]'") from None
    Path(directory).mkdir(parents=True, exist_ok=True)
    return SummaryWriter(log_dir=str(directory))


class MetricsLog:
    """metrics.jsonl (always) plus TensorBoard scalars (when a directory is given)."""

    def __init__(self, path: Path, tensorboard_dir: Optional[Path] = None, enabled: bool = True):
        self.path = Path(path)
        self.enabled = enabled  # False on every rank but 0: only rank 0 writes
        self.writer = open_summary_writer(tensorboard_dir) if tensorboard_dir and enabled else None

    def write(self, record: dict[str, Any]) -> None:
        """Append one record; `kind` and `update` are required."""
        if not self.enabled:
            return
        clean = {k: _finite_or_none(v) for k, v in record.items()}
        with open(self.path, "a") as handle:
            handle.write(json.dumps(clean) + "\n")
        if self.writer is not None:
            kind, step = record["kind"], int(record["update"])
            for key in SCALARS.get(kind, ()):
                value = clean.get(key)
                if key == "best" and record.get("best_metric", "loss") == "loss":
                    continue  # the same number as best_loss
                if isinstance(value, (int, float)):
                    # "best" is the best value of --best-metric: the tag names that metric
                    tag = f"best_{record.get('best_metric')}" if key == "best" else key
                    self.writer.add_scalar(f"{kind}/{tag}", value, step)
            for pair, figures in (record.get("pairs") or {}).items():  # a multilingual run: each pair's validation
                for key, value in figures.items():
                    if isinstance(value, (int, float)) and math.isfinite(value):
                        self.writer.add_scalar(f"{kind}/{pair}/{key}", value, step)
            if kind == "valid":
                self.writer.flush()  # validations are rare and worth seeing at once

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _finite_or_none(value: Any) -> Any:
    """JSON has no inf/nan: an undefined number (no validation set, nothing yet) is null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):  # a multilingual validation's figures per pair
        return {k: _finite_or_none(v) for k, v in value.items()}
    return value


class ThroughputWindow:
    """The loss, NLL and target tokens of the updates since the last log line, and the figures
    they give. Losses stay tensors until record(): the loop's only host sync is once per log
    interval, not once per update."""

    def __init__(self, now: float):
        self.reset(now)

    def reset(self, now: float) -> None:
        self.start, self.tokens, self.all_tokens = now, 0, 0  # this rank's and every rank's tokens
        self.loss: Any = 0.0
        self.nll: Any = 0.0

    def add(self, loss: Any, nll: Any, tokens: int, all_tokens: int) -> None:
        self.loss, self.nll = self.loss + loss, self.nll + nll
        self.tokens += tokens
        self.all_tokens += all_tokens

    def figures(self, now: float) -> tuple[float, float, float]:
        """(loss, NLL) per target token of this rank, and every rank's target tokens per second."""
        tokens = max(self.tokens, 1)
        return float(self.loss) / tokens, float(self.nll) / tokens, self.all_tokens / max(now - self.start, 1e-9)
