"""--finetune CKPT: a new training run that starts from a checkpoint's weights.

Owns what a fine-tuning run takes from its checkpoint and what it refuses: the weights and the
model configuration (architecture options that disagree are an error, because the weights only
fit their own architecture; dropout rates may change), and the tokenizer (raw files are
binarized with it; a DATA_DIR binarized with another tokenizer is refused). The training state
(optimizer, LR schedule, progress, early stopping) starts fresh: update 0, warmup again. A
multilingual checkpoint keeps its target tags: it fine-tunes on one or several pairs into targets
it has a tag for (a pair it never trained on included), as a multilingual run (multilingual.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from .. import checkpoint
from ..errors import ConfigError
from ..config import ModelConfig
from ..errors import InputError
from ..languages import Languages
from ..textio import atomic_write_bytes
from ..tokenizer import Tokenizer

# Model settings a fine-tuning run may change: regularisation only; everything else shapes the weights.
CHANGEABLE = ("dropout", "attention_dropout", "activation_dropout")


@dataclass
class Finetune:
    checkpoint: Path
    model_overrides: dict[str, Any] = field(default_factory=dict)  # model options the user gave explicitly


@dataclass
class Source:
    """The checkpoint a run fine-tunes, loaded once."""

    path: Path
    model_config: ModelConfig
    tokenizer_bytes: bytes
    weights: dict[str, torch.Tensor]
    weights_sha256: str
    languages: Optional[Languages] = None  # a multilingual checkpoint's pairs and target tags (its fine-tuning keeps the tags)

    @property
    def tokenizer_sha256(self) -> str:
        return hashlib.sha256(self.tokenizer_bytes).hexdigest()

    def describe(self) -> dict[str, str]:
        """What the run's saved configs record about its starting point (resume compares it)."""
        return {"checkpoint": str(self.path), "weights_sha256": self.weights_sha256}


def load_source(spec: Finetune) -> Source:
    ckpt = checkpoint.load(spec.checkpoint)  # missing, corrupt or foreign files: one clear line
    config = model_config(ModelConfig.from_dict(ckpt["model_config"]), spec.model_overrides, spec.checkpoint)
    return Source(Path(spec.checkpoint), config, checkpoint.tokenizer_bytes(ckpt), ckpt["weights"], ckpt["weights_sha256"],
                  Languages.from_dict(ckpt["configs"].get("languages")))


def model_config(saved: ModelConfig, overrides: dict[str, Any], path: Path) -> ModelConfig:
    """The checkpoint's model configuration with the changeable options given; any other option
    that disagrees with the checkpoint is refused, naming it (an option that agrees is fine)."""
    saved_values = saved.to_dict()
    unknown = sorted(set(overrides) - set(saved_values))
    if unknown:
        raise ConfigError(f"unknown model setting(s) {', '.join(unknown)}")
    clashes = [f"{key} {overrides[key]!r} (checkpoint: {saved_values[key]!r})" for key in sorted(overrides)
               if key not in CHANGEABLE and overrides[key] != saved_values[key]]
    if clashes:
        raise ConfigError(f"--finetune {path}: the model comes from the checkpoint, but these options disagree with it: "
                          + "; ".join(clashes) + f". Drop them (only {', '.join(CHANGEABLE)} may change when fine-tuning)")
    return saved.replace(**{k: v for k, v in overrides.items() if k in CHANGEABLE})


def write_tokenizer(source: Source, data_dir: Path) -> Path:
    """The checkpoint's tokenizer as DATA_DIR/tokenizer.model, to binarize raw files with."""
    path = Path(data_dir) / "tokenizer.model"
    atomic_write_bytes(path, source.tokenizer_bytes)
    return path


def check_data(source: Source, tokenizer: Tokenizer, data_dir: Path) -> None:
    """The data must be token ids of the checkpoint's tokenizer, or the embeddings mean nothing."""
    if tokenizer.model_bytes != source.tokenizer_bytes:
        raise InputError(f"{data_dir}: binarized with another tokenizer than {source.path} holds "
                         f"(sha256 {hashlib.sha256(tokenizer.model_bytes).hexdigest()[:12]} vs {source.tokenizer_sha256[:12]}); "
                         f"binarize with the checkpoint's tokenizer, or give raw files (--train/--valid) and seqtool does")


def load_weights(model: torch.nn.Module, source: Source) -> None:
    """Copy the checkpoint's weights into the freshly built model (tied copies come with the embedding)."""
    missing, unexpected = model.load_state_dict(source.weights, strict=False)
    tied = {"output.weight", "tgt_embed.weight"} if source.model_config.tie_embeddings else set()
    missing = [m for m in missing if m not in tied]
    if missing or unexpected:
        raise InputError(f"{source.path}: weights do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
