"""`seqtool info CKPT`: what a checkpoint file holds, without building the model.

Owns reading a checkpoint (through checkpoint.load, so a missing, truncated or foreign file is
the usual one-line error) and summarising it: file size, format version, whether it carries the
training state (last.pt, resumable) or only weights (best.pt, averaged files), parameter count,
tokenizer vocabulary, training progress and validation results, and the saved configurations;
as aligned text or as one JSON object.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from rich import filesize

from . import checkpoint
from .languages import Languages
from .tokenizer import Tokenizer

# progress keys shown, in order, with their labels (others stay in --json only)
_PROGRESS = (("updates", "updates"), ("epoch", "epoch"), ("batch_in_epoch", "batch in epoch"),
             ("train_tokens", "target tokens"), ("train_seconds", "training seconds"))


@dataclass
class CheckpointInfo:
    path: str
    file_bytes: int
    format_version: int
    has_training_state: bool
    parameters: int
    vocab_size: int
    tokenizer_sha256: str
    configs: dict[str, Any]
    progress: dict[str, Any] = field(default_factory=dict)  # updates, epoch, tokens, early-stopping state
    valid: Optional[dict[str, Any]] = None  # the validation this file was saved after (loss, nll, bleu, chrf)
    averaged_from: Optional[list[str]] = None
    tokenizer_pair: bool = False  # an imported model's source and target sentencepiece models (tokenizer.py)

    @property
    def kind(self) -> str:
        if self.has_training_state:
            return "weights + training state (like last.pt: resumable)"
        if self.averaged_from:
            return f"weights only (average of {len(self.averaged_from)} checkpoints)"
        return "weights only (like best.pt: for translate, export, fine-tuning)"

    def to_json(self) -> str:
        data = asdict(self)
        data["kind"] = "last" if self.has_training_state else "weights"
        return json.dumps(_finite(data), indent=2)

    def to_text(self) -> str:
        rows = [("file", f"{self.path} ({filesize.decimal(self.file_bytes)})"),
                ("format", f"version {self.format_version}"),
                ("contents", self.kind),
                ("parameters", f"{self.parameters:,}"),
                ("tokenizer", f"{self.vocab_size:,} pieces{' (a source and a target model over one id space)' if self.tokenizer_pair else ''} "
                              f"(sha256 {self.tokenizer_sha256[:12]})")]
        p = self.progress
        if p:
            done = [f"{label} {_number(p[key])}" for key, label in _PROGRESS if key in p]
            rows.append(("progress", ", ".join(done)))
            metric = self.configs.get("train", {}).get("best_metric", "loss")
            best = [f"best valid loss {_number(p.get('best_valid_loss'))}"]
            if metric != "loss":
                best.append(f"best {metric} {_number(p.get('best_metric_value'))}")
            if "bad_validations" in p:
                best.append(f"{p['bad_validations']} validation(s) since the best")
            rows.append(("early stopping", ", ".join(best)))
        if self.valid:
            rows.append(("validation", ", ".join(f"{k} {_number(v)}" for k, v in self.valid.items() if v is not None)))
        if self.averaged_from:
            rows.append(("averaged from", ", ".join(self.averaged_from)))
        for section, values in self.configs.items():
            if section == "languages":  # a multilingual model: its pairs, their training shares, the tags
                rows.append(("languages", Languages.from_dict(values).describe()))
            elif isinstance(values, dict):
                rows.append((section, " ".join(f"{k}={_plain(v)}" for k, v in values.items())))
        width = max(len(label) for label, _ in rows)
        return "\n".join(f"{label:<{width}}  {value}" for label, value in rows) + "\n"


def describe(path: Path) -> CheckpointInfo:
    """Summary of the checkpoint at `path` (verified like any load: corruption is an error)."""
    path = Path(path)
    ckpt = checkpoint.load(path)
    train_state = ckpt.get("train_state")
    progress = ckpt.get("progress") or (train_state or {}).get("progress") or {}
    if not progress and ckpt.get("updates") is not None:  # files from before progress was stored
        progress = {"updates": ckpt["updates"]}
    valid = ckpt.get("valid")
    if valid is None and ckpt.get("valid_loss") is not None:
        valid = {"loss": ckpt["valid_loss"]}
    tokenizer = Tokenizer(checkpoint.tokenizer_bytes(ckpt), f"{path} (tokenizer)")
    return CheckpointInfo(
        path=str(path), file_bytes=path.stat().st_size, format_version=ckpt["format_version"],
        has_training_state=train_state is not None,
        # tied copies are stored once (checkpoint.model_state) and positions are not stored: the
        # stored tensors are the parameters
        parameters=sum(t.numel() for t in ckpt["weights"].values()),
        vocab_size=tokenizer.vocab_size, tokenizer_sha256=ckpt.get("tokenizer_sha256", ""),
        configs=ckpt["configs"], progress=dict(progress), valid=valid, averaged_from=ckpt.get("averaged_from"),
        tokenizer_pair=tokenizer.pair,
    )


def _number(value: Any) -> str:
    if isinstance(value, float):
        return "-" if not math.isfinite(value) else f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return "-" if value is None else str(value)


def _plain(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def _finite(value: Any) -> Any:
    """JSON without inf/nan: undefined numbers become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
