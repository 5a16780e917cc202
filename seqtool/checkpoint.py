"""One self-contained, versioned checkpoint file.

Owns the on-disk format: a dict of plain tensors and plain Python values only, so it loads with
torch.load(..., weights_only=True) and opening a file never runs code. It holds format_version,
the configs, the tokenizer model bytes, the unwrapped weights, sha256 digests of the weights and
of the tokenizer (so corruption is reported as corruption), and optionally the training state.
Writes are atomic (temp file, fsync, rename, fsync of the directory), so `kill -9` at any moment
leaves the previous file loadable; update-numbered copies (checkpoint_u<N>.pt) are named and
pruned here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any, Optional

import torch

from .config import ModelConfig
from .errors import ConfigError, InputError
from .textio import atomic_write

FORMAT_VERSION = 1


@dataclasses.dataclass
class TrainingState:
    """Where a training run is. last.pt holds it as train_state["progress"] (state_dict()), and a
    resumed run continues from it (load_state_dict())."""

    updates: int = 0
    epoch: int = 1  # the epoch being trained (1-based)
    batch_in_epoch: int = 0  # updates made in the current epoch (each of update_freq x ranks batches)
    train_seconds: float = 0.0  # wall clock trained, validation included, over every resume
    train_tokens: int = 0  # target tokens trained on, all ranks
    best_valid_loss: float = math.inf
    last_valid_loss: float = math.nan
    best_metric_value: Optional[float] = None  # of --best-metric (validate.EarlyStopping sets its start)
    bad_validations: int = 0  # validations in a row without improving it
    skipped_updates: int = 0  # fp16 overflows

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """The saved values of the fields this version knows (a file from an older one lacks some)."""
        for f in dataclasses.fields(self):
            if f.name in saved:
                setattr(self, f.name, saved[f.name])


def weights_sha256(state: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        digest.update(name.encode())
        digest.update(str(t.dtype).encode())
        digest.update(str(tuple(t.shape)).encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Weights of the bare model (DDP / torch.compile wrappers removed), tied copies deduplicated."""
    model = getattr(model, "module", model)
    model = getattr(model, "_orig_mod", model)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if getattr(model, "config", None) is not None and model.config.tie_embeddings:
        state.pop("output.weight", None)
        state.pop("tgt_embed.weight", None)
    return state


def build(config: dict[str, Any], model_bytes: bytes, weights: dict[str, torch.Tensor], **extra: Any) -> dict[str, Any]:
    return {
        "format_version": FORMAT_VERSION,
        "model_config": config["model"],
        "configs": config,
        "tokenizer": torch.frombuffer(bytearray(model_bytes), dtype=torch.uint8).clone(),
        "weights": weights,
        "weights_sha256": weights_sha256(weights),
        "tokenizer_sha256": hashlib.sha256(model_bytes).hexdigest(),
        **extra,
    }


def save(checkpoint: dict[str, Any], path: Path) -> None:
    """Atomic: a crash, kill -9 or a full disk leaves the previous file intact (textio.atomic_write)."""
    atomic_write(Path(path), lambda handle: torch.save(checkpoint, handle))


_NUMBERED = re.compile(r"^checkpoint_u(\d+)\.pt$")


def pack_train_state(optimizer, scaler, state: TrainingState, rngs: list, world_size: int, ema, device: torch.device) -> dict[str, Any]:
    """What last.pt holds beyond the weights so that a run resumes exactly: the optimizer and fp16
    loss-scaler states, every rank's RNG state (rank 0's also as rng_cpu/rng_cuda), the world size,
    the TrainingState and the weight average."""
    return {
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict() if scaler.is_enabled() else {},
        "rng_cpu": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "rng_ranks": rngs,
        "world_size": world_size,
        "progress": state.state_dict(),
        "ema": ema.state_dict() if ema is not None else None,
    }


def unpack_train_state(train_state: dict[str, Any], optimizer, scaler, state: TrainingState, ema) -> tuple[list, int]:
    """pack_train_state's inverse for what lives in objects; returns every saved rank's RNG state and
    the world size it was saved by (the caller sets its rank's RNG and adapts the position)."""
    optimizer.load_state_dict(train_state["optimizer"])
    if train_state.get("scaler"):
        scaler.load_state_dict(train_state["scaler"])
    state.load_state_dict(train_state["progress"])
    if ema is not None and train_state.get("ema"):  # (a run saved without one starts its average now)
        ema.load_state_dict(train_state["ema"])
    rngs = train_state.get("rng_ranks") or [{"cpu": train_state["rng_cpu"], "cuda": train_state.get("rng_cuda")}]
    return rngs, train_state.get("world_size", 1)


def numbered_path(save_dir: Path, updates: int) -> Path:
    return Path(save_dir) / f"checkpoint_u{updates}.pt"


def numbered_checkpoints(save_dir: Path) -> list[tuple[int, Path]]:
    """(updates, path) of the update-numbered copies in save_dir, oldest first."""
    found = []
    for path in Path(save_dir).iterdir():
        match = _NUMBERED.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def prune_numbered(save_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` update-numbered copies; returns what was deleted."""
    found = numbered_checkpoints(save_dir)
    doomed = [path for _, path in found[: max(len(found) - keep, 0)]]
    for path in doomed:
        path.unlink(missing_ok=True)
    return doomed


def _looks_like_text(head: bytes) -> bool:
    """Whether a file's first bytes are text (UTF-8, no NUL): what a checkpoint never is."""
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as error:
        if error.start < len(head) - 4:  # (a character cut at the end of the sample is still text)
            return False
    return b"\0" not in head


def load(path: Path, verify: bool = True) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such checkpoint")
    if path.is_dir():
        raise InputError(f"{path}: is a directory; give a checkpoint file such as {path / 'best.pt'}")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; its directory is at the end
        with open(path, "rb") as handle:
            head = handle.read(4096)
        if head and not head.startswith(b"PK") and _looks_like_text(head):  # config.json, a TOML file, a corpus
            raise InputError(f"{path}: a text file, not a checkpoint; give a .pt that seqtool train, average or import wrote "
                             f"(e.g. SAVE_DIR/best.pt)")
        raise InputError(f"{path}: truncated or corrupted checkpoint (not a complete torch archive); copy it again or use another checkpoint")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        refused = _REFUSED_GLOBAL.search(str(error))
        if refused:
            raise InputError(f"{path}: refused to load: it needs the Python object {refused.group(1)}, which a seqtool checkpoint "
                             f"never holds; loading it would run code (torch.load weights_only=True refuses it). "
                             f"Use a file written by seqtool train or average") from None
        # weights_only names what else it refused on a line of its own
        detail = next((line.strip() for line in str(error).splitlines() if "WeightsUnpickler error" in line), str(error).strip())
        detail = detail.removeprefix("WeightsUnpickler error:").strip()
        if "global" not in detail.lower():  # a damaged pickle stream, not a refused object
            raise InputError(f"{path}: truncated or corrupted checkpoint ({detail[:160]}); copy it again or use another checkpoint") from None
        raise InputError(f"{path}: refused: not a plain seqtool checkpoint; loading it would run code ({detail[:120]})") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise InputError(f"{path}: truncated or corrupted checkpoint ({message[:160]}); copy it again or use another checkpoint") from None
    if not isinstance(ckpt, dict) or "format_version" not in ckpt:
        raise InputError(f"{path}: not a seqtool checkpoint")
    if ckpt["format_version"] != FORMAT_VERSION:
        raise InputError(f"{path}: checkpoint format version {ckpt['format_version']}, this seqtool reads version {FORMAT_VERSION}")
    missing = sorted({"weights", "weights_sha256", "tokenizer", "model_config", "configs"} - set(ckpt))
    if missing:
        raise InputError(f"{path}: incomplete seqtool checkpoint (no {', '.join(missing)}); use a file written by seqtool train or average")
    if verify and weights_sha256(ckpt["weights"]) != ckpt.get("weights_sha256"):
        raise InputError(f"{path}: corrupted checkpoint: the weights do not match their stored sha256; copy it again or use another checkpoint")
    # older files have no tokenizer digest; a file that has one must match it
    if verify and ckpt.get("tokenizer_sha256", None) not in (None, hashlib.sha256(tokenizer_bytes(ckpt)).hexdigest()):
        raise InputError(f"{path}: corrupted checkpoint: the tokenizer does not match its stored sha256; copy it again or use another checkpoint")
    _check_model_config(ckpt, path)
    return ckpt


# torch.load(weights_only=True) names a global it refuses: "GLOBAL posix.system whose module posix is
# blocked", "GLOBAL __main__.Payload was not an allowed global by default"
_REFUSED_GLOBAL = re.compile(r"GLOBAL (\S+) (?:whose module|was not an allowed global)")
# (field, the stored tensors whose dimension dim it sets, dim); the layer counts are counted
_SIZED_BY = (
    ("vocab_size", re.compile(r"(embed|tgt_embed|output)\.weight"), 0),
    ("d_model", re.compile(r"(embed|tgt_embed|output)\.weight"), 1),
    ("d_ff", re.compile(r"(encoder|decoder)\.\d+\.ffn\.fc1\.weight"), 0),
)
_LAYER = re.compile(r"(encoder|decoder)\.(\d+)\.")


def _check_model_config(ckpt: dict[str, Any], path: Path) -> None:
    """The model configuration must be valid and fit the stored weights' shapes (their sha256 does
    not cover the configs): an edited or damaged one is an InputError naming the file and the field,
    never a model of the wrong size (or of terabytes) built from it."""
    damaged = "the checkpoint is damaged or was edited"
    if not isinstance(ckpt["model_config"], dict):
        raise InputError(f"{path}: model_config is {type(ckpt['model_config']).__name__}, not a table of settings; {damaged}")
    try:
        sizes = ModelConfig.from_dict(ckpt["model_config"], "model").to_dict()
    except ConfigError as error:
        raise InputError(f"{path}: {error}; {damaged}") from None
    layers: dict[str, set[int]] = {"encoder_layers": set(), "decoder_layers": set()}
    for name, tensor in ckpt["weights"].items():
        for field, names, dim in _SIZED_BY:
            if names.fullmatch(name) and tensor.dim() > dim and tensor.shape[dim] != sizes[field]:
                raise InputError(f"{path}: model.{field} = {sizes[field]} does not match the stored weights "
                                 f"({tensor.shape[dim]}); {damaged}")
        layer = _LAYER.match(name)
        if layer:
            layers[f"{layer.group(1)}_layers"].add(int(layer.group(2)))
    for field, stored in layers.items():
        if len(stored) != sizes[field]:
            raise InputError(f"{path}: model.{field} = {sizes[field]} does not match the stored weights "
                             f"({len(stored)} layers); {damaged}")


def tokenizer_bytes(ckpt: dict[str, Any]) -> bytes:
    return ckpt["tokenizer"].numpy().tobytes()


def recorded_decoding(path: Path) -> dict[str, Any]:
    """The decoding defaults a checkpoint records (configs["decoding"], e.g. a distilled student's
    beam 1), read without reading its weights (memory-mapped, unverified: the load that follows
    verifies). {} for a file that records none or that cannot be read here (the load says why)."""
    try:
        ckpt = torch.load(Path(path), map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - the real load reports what is wrong with the file
        return {}
    recorded = (ckpt.get("configs") or {}).get("decoding") if isinstance(ckpt, dict) else None
    return dict(recorded) if isinstance(recorded, dict) else {}


def load_model(ckpt: dict[str, Any], device: Optional[torch.device] = None):
    """Rebuild the Transformer from the checkpoint alone."""
    from .model import Transformer

    model = Transformer(ModelConfig.from_dict(ckpt["model_config"]))
    missing, unexpected = model.load_state_dict(ckpt["weights"], strict=False)
    tied = {"output.weight", "tgt_embed.weight"} if model.config.tie_embeddings else set()
    missing = [m for m in missing if m not in tied]
    if missing or unexpected:
        raise InputError(f"checkpoint weights do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    model.eval()
    if device is not None:
        model.to(device)
    return model


def average(paths: list[Path], output: Path, force: bool = False) -> dict[str, Any]:
    """Average the weights of several checkpoints of one architecture; configs and tokenizer of the first.
    An existing output is replaced only with force."""
    from .textio import refuse_existing

    refuse_existing(output, force)
    if not paths:
        raise InputError("give at least one checkpoint to average")
    first = load(paths[0])
    total = {k: v.double().clone() if v.is_floating_point() else v for k, v in first["weights"].items()}
    for p in paths[1:]:
        ck = load(p)
        if ck["model_config"] != first["model_config"]:
            raise InputError(f"{p}: model configuration differs from {paths[0]}; only checkpoints of one model can be averaged")
        if tokenizer_bytes(ck) != tokenizer_bytes(first):
            raise InputError(f"{p}: tokenizer differs from {paths[0]}")
        for k, v in ck["weights"].items():
            if v.is_floating_point():
                total[k] += v.double()
    weights = {k: (v / len(paths)).to(first["weights"][k].dtype) if v.is_floating_point() else v for k, v in total.items()}
    out = build(first["configs"], tokenizer_bytes(first), weights, averaged_from=[f"{Path(p).parent.name}/{Path(p).name}" for p in paths],
                **({"source_lengths": first["source_lengths"]} if "source_lengths" in first else {}))
    save(out, Path(output))  # (averaged_from: each checkpoint's run folder and name, never a local path)
    return out

