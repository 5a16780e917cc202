"""A transformers Marian model directory as untrusted input (interop.py converts it).

Only regular files inside the directory are read (no FIFOs, devices, or symlinks leading out of it),
each under a size cap; every config.json value is checked for its type and bounds (model_config: the
ModelConfig it asks for, or a one-line refusal naming the field), and every tensor for its name,
shape (against config.json), dtype and finiteness before anything is allocated from config.json's
numbers. Each refusal is one line naming the file and field.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any, Optional

import torch

from .config import ModelConfig
from .errors import InputError
from .fields import field_info

ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}  # Marian's name -> seqtool's
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


# ---- reading -----------------------------------------------------------------------------------
# What an import reads of each file, at most (bytes). A directory is input to distrust: nothing is read
# before it is known to be a regular file of this size or less inside the model directory. OPUS-MT's are far
# below: config.json about 1.5 KB, vocab.json 1.5 MB (60,000 pieces), each .spm 800 KB.
JSON_CAP = 4 * 2 ** 20  # config.json, generation_config.json, tokenizer_config.json
VOCAB_CAP = 64 * 2 ** 20  # vocab.json
SPM_CAP = 64 * 2 ** 20  # source.spm, target.spm
# max_position_embeddings x d_model: the sinusoid table seqtool computes. transformers saves no position
# table, so no weight backs max_position_embeddings; OPUS-MT's tables are 512 x 512.
MAX_POSITION_TABLE = 2 ** 25


def shown(value: Any) -> str:
    """A JSON value as a refusal quotes it: at most 60 characters."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _roots(directory: Path) -> list[Path]:
    """Where the model directory's files may live: the directory, and for a snapshot in the Hugging Face
    hub's cache (REPO/snapshots/REVISION, whose files are symlinks to REPO/blobs) the repository's blobs."""
    real = directory.resolve()
    return [real, real.parent.parent / "blobs"] if real.parent.name == "snapshots" else [real]


def _located(directory: Path, name: str) -> Optional[Path]:
    """directory/name resolved to a regular file inside the model directory; None when there is no such
    name. Symlinks that lead out of the directory, FIFOs, devices and directories are refused: nothing is
    opened that could hang or never end."""
    path = directory / name
    if not os.path.lexists(path):
        return None
    try:
        real = path.resolve(strict=True)
        kind = os.stat(real).st_mode
    except (OSError, RuntimeError):  # a dangling symlink, a loop (RuntimeError before Python 3.13)
        raise InputError(f"{path}: a symlink to nothing readable") from None
    if not any(real.is_relative_to(root) for root in _roots(directory)):
        raise InputError(f"{path}: a symlink out of the model directory (to {real}); copy the file into the directory")
    if not stat.S_ISREG(kind):
        raise InputError(f"{path}: not a regular file ({_kind(kind)}); an import reads regular files only")
    return real


def _kind(mode: int) -> str:
    return ("a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a file")


def read_bytes(directory: Path, name: str, cap: int) -> Optional[bytes]:
    """The bytes of directory/name (see _located), at most `cap` of them; None when there is no such file."""
    real = _located(directory, name)
    if real is None:
        return None
    path = directory / name
    try:  # non-blocking: a FIFO put in the file's place since _located looked is opened, not waited on
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise InputError(f"{path}: cannot be read ({error.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            raise InputError(f"{path}: not a regular file ({_kind(found.st_mode)}); an import reads regular files only")
        data = fh.read(cap + 1) if found.st_size <= cap else b""
    if found.st_size > cap or len(data) > cap:
        raise InputError(f"{path}: {max(found.st_size, len(data)):,} bytes, over the {cap:,} an import reads of it; "
                         "not a file save_pretrained writes")
    return data


def read_json(directory: Path, name: str, cap: int = JSON_CAP, required: bool = True) -> Optional[dict]:
    """directory/name's JSON object (read as read_bytes reads); None when an optional file is missing."""
    data = read_bytes(directory, name, cap)
    path = directory / name
    if data is None:
        if not required:
            return None
        raise InputError(f"{path}: missing; a transformers Marian directory holds config.json, model.safetensors "
                         "(or pytorch_model.bin), source.spm, target.spm and vocab.json")
    try:
        value = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as error:  # (RecursionError: nested too deep to parse)
        raise InputError(f"{path}: not readable JSON ({str(error).splitlines()[0][:120] if str(error) else 'nested too deep'})") from None
    if not isinstance(value, dict):
        raise InputError(f"{path}: {shown(value)}: not a JSON object of settings")
    return value


def read_weights(directory: Path) -> tuple[dict[str, torch.Tensor], Path]:
    """The state dict, from model.safetensors (safetensors) or pytorch_model.bin (weights_only=True), and the
    file it came from."""
    for name in WEIGHT_FILES:
        real = _located(directory, name)
        if real is None:
            continue
        path = directory / name
        if name.endswith(".safetensors"):
            try:
                from safetensors.torch import load_file
            except ImportError:
                raise InputError(f"{path}: reading safetensors needs the safetensors package: pip install 'seqtool[hf]'") from None
            try:
                state = load_file(str(real))
            except Exception as error:  # noqa: BLE001 - safetensors raises its own error types
                raise InputError(f"{path}: not a readable safetensors file ({str(error).splitlines()[0][:120]})") from None
        else:
            try:
                state = torch.load(real, map_location="cpu", weights_only=True)
            except Exception as error:  # noqa: BLE001 - weights_only refuses code; a damaged file fails otherwise
                raise InputError(f"{path}: refused or unreadable with torch.load(weights_only=True) "
                                 f"({str(error).strip().splitlines()[0][:120]})") from None
        if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
            raise InputError(f"{path}: not a state dict of named tensors")
        return state, path
    raise InputError(f"{directory}: no weights ({' or '.join(WEIGHT_FILES)})")


def model_config(config: dict, where: str) -> ModelConfig:
    """seqtool's ModelConfig for a Marian config.json, or a refusal naming the field seqtool cannot run
    exactly or that is no value of its kind. Every number is checked here, before anything is made from it."""
    def field(name: str, default: Any = None) -> Any:
        return config.get(name, default)

    def invalid(name: str, why: str) -> InputError:
        return InputError(f"{where}: {name} = {shown(field(name))}: {why}")

    def refuse(name: str, why: str) -> InputError:  # (a model seqtool cannot run as it is)
        return invalid(name, f"{why}; seqtool runs a model only exactly, never approximately")

    def outside(value: Any, ours: str) -> Optional[str]:
        """None when value is within seqtool's bounds on its field `ours` (config.py declares them), else those bounds."""
        f = field_info(ModelConfig, ours)
        if ((f["ge"] is None or value >= f["ge"]) and (f["gt"] is None or value > f["gt"]) and
                (f["le"] is None or value <= f["le"]) and (f["lt"] is None or value < f["lt"])):
            return None
        low = f"[{f['ge']}" if f["ge"] is not None else f"({f['gt']}"
        return f"outside {low}, {f['le']}]" if f["le"] is not None else f"outside {low}, {f['lt']})"

    def integer(name: str, default: int, ours: str) -> int:
        value = field(name, default)
        if isinstance(value, float) and value.is_integer():  # (512.0: an integer written as a float)
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise invalid(name, "not an integer")
        if (why := outside(value, ours)) is not None:
            raise invalid(name, f"{why}, seqtool's bounds on model.{ours}")
        return value

    def number(name: str, default: float, ours: str) -> float:
        value = field(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise invalid(name, "not a finite number")
        if (why := outside(value, ours)) is not None:
            raise invalid(name, why)
        return float(value)

    def flag(name: str, default: bool) -> bool:
        value = field(name)
        if value is not None and not isinstance(value, bool):
            raise invalid(name, "not true or false")
        return default if value is None else value

    if field("model_type") != "marian":
        raise refuse("model_type", "not a Marian model (transformers' MarianMTModel)")
    for enc, dec, what in (("encoder_attention_heads", "decoder_attention_heads", "heads"),
                           ("encoder_ffn_dim", "decoder_ffn_dim", "feed-forward widths")):
        if field(enc) != field(dec):
            raise refuse(dec, f"differs from {enc} = {shown(field(enc))} (seqtool's encoder and decoder share their {what})")
    activation = ACTIVATIONS.get(field("activation_function", "gelu")) if isinstance(field("activation_function", "gelu"), str) else None
    if activation is None:
        raise refuse("activation_function", f"seqtool has {', '.join(sorted(ACTIVATIONS))}")
    d = integer("d_model", 1024, "d_model")
    if d % 2:
        raise refuse("d_model", "odd: Marian's and seqtool's sinusoids differ there")
    vocab = integer("vocab_size", 58101, "vocab_size")
    if field("decoder_vocab_size") not in (None, vocab) or field("share_encoder_decoder_embeddings", True) is False and field("separate_vocabs"):
        raise refuse("decoder_vocab_size", f"separate source and target vocabularies (vocab_size = {vocab}); seqtool's models have one id space")
    ids = {}
    for name in ("eos_token_id", "pad_token_id", "decoder_start_token_id"):
        if isinstance(field(name), bool) or not isinstance(field(name), int):
            raise invalid(name, "not one token id")
        if not 0 <= field(name) < vocab:
            raise invalid(name, f"not an id of the vocabulary (vocab_size = {vocab})")
        ids[name] = field(name)
    if field("normalize_before") or field("add_final_layer_norm") or field("normalize_embedding"):
        raise refuse("normalize_before" if field("normalize_before") else "add_final_layer_norm" if field("add_final_layer_norm")
                     else "normalize_embedding", "Marian in transformers is post-norm without extra norms")
    heads, ffn = integer("encoder_attention_heads", 16, "n_heads"), integer("encoder_ffn_dim", 4096, "d_ff")
    if d % heads:
        raise invalid("encoder_attention_heads", f"does not divide d_model = {d}")
    positions = integer("max_position_embeddings", 1024, "max_positions")
    if positions * d > MAX_POSITION_TABLE:
        raise invalid("max_position_embeddings", f"with d_model = {d}, a position table of {positions * d:,} numbers, over the "
                     f"{MAX_POSITION_TABLE:,} an import computes")
    shared = flag("share_encoder_decoder_embeddings", True)
    tied = shared and flag("tie_word_embeddings", True)
    try:
        return ModelConfig(
            vocab_size=vocab, d_model=d, n_heads=heads, d_ff=ffn,
            encoder_layers=integer("encoder_layers", 12, "encoder_layers"), decoder_layers=integer("decoder_layers", 12, "decoder_layers"),
            dropout=number("dropout", 0.1, "dropout"), attention_dropout=number("attention_dropout", 0.0, "attention_dropout"),
            activation_dropout=number("activation_dropout", 0.0, "activation_dropout"), max_positions=positions,
            pre_norm=False, tie_embeddings=tied, pad_id=ids["pad_token_id"], bos_id=ids["decoder_start_token_id"],
            eos_id=ids["eos_token_id"], activation=activation, scale_embedding=flag("scale_embedding", False), output_bias=True)
    except ValueError as error:  # (ConfigError: a rule across fields)
        raise InputError(f"{where}: {error}") from None


def marian_shapes(c: ModelConfig) -> dict[str, tuple[str, ...]]:
    """Every tensor a MarianMTModel of config c may hold (its name without "model."), with its shape as
    the config.json fields that give each dimension: what a state dict is checked against before anything
    is made from config.json's numbers (marian_sizes gives the numbers)."""
    def shape(name: str) -> tuple[str, ...]:
        ffn = f"{name.split('.')[0]}_ffn_dim"
        for end, dims in ((".fc1.weight", (ffn, "d_model")), (".fc1.bias", (ffn,)), (".fc2.weight", ("d_model", ffn)),
                          ("layer_norm.weight", ("d_model",)), (".weight", ("d_model", "d_model"))):
            if name.endswith(end):
                return dims
        return ("d_model",)  # a bias of the residual stream's width, or a norm's

    out = {name: shape(name) for _, theirs, _ in weight_map(c) for name in theirs}
    out.update({name: ("vocab_size", "d_model") for name in
                ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight")})
    out.update({f"{stack}.embed_positions.weight": ("max_position_embeddings", "d_model") for stack in ("encoder", "decoder")})
    out["final_logits_bias"] = ("1", "vocab_size")
    return out


def marian_sizes(c: ModelConfig) -> dict[str, int]:
    """The numbers of marian_shapes' dimensions."""
    return {"1": 1, "vocab_size": c.vocab_size, "d_model": c.d_model, "encoder_ffn_dim": c.d_ff, "decoder_ffn_dim": c.d_ff,
            "max_position_embeddings": c.max_positions}


def checked_weights(state: dict[str, torch.Tensor], c: ModelConfig, where: Path) -> dict[str, torch.Tensor]:
    """state's tensors by their names without "model.", each one a MarianMTModel of config c holds, of the
    shape c gives it, floating point and finite; else a refusal naming the tensor (and the config.json
    fields its shape disagrees with)."""
    shapes, sizes = marian_shapes(c), marian_sizes(c)
    out = {}
    for key, t in state.items():
        name = key.removeprefix("model.")
        if name not in shapes:
            layer = re.match(r"(encoder|decoder)\.layers\.(\d+)\.", name)
            if layer and int(layer.group(2)) >= getattr(c, f"{layer.group(1)}_layers"):
                raise InputError(f"{where}: holds {key}, beyond the {layer.group(1)}_layers = "
                                 f"{getattr(c, f'{layer.group(1)}_layers')} config.json declares")
            raise InputError(f"{where}: holds {key}, which no MarianMTModel has; not a MarianMTModel's state dict")
        dims = shapes[name][1:] if name == "final_logits_bias" and t.dim() == 1 else shapes[name]  # (1, V) or (V,)
        want = [sizes[n] for n in dims]
        if list(t.shape) != want:
            named = [n for n, got, size in zip(dims, t.shape, want) if got != size] if t.dim() == len(dims) else dims
            fields = ", ".join(f"{n} = {sizes[n]}" for n in dict.fromkeys(named) if n != "1")
            raise InputError(f"{where}: {key} has shape {list(t.shape)}, but config.json gives it {want} ({fields or 'rank'})")
        if not t.is_floating_point():
            raise InputError(f"{where}: {key} holds {str(t.dtype).removeprefix('torch.')} values; a model's weights are floating point")
        if not bool(torch.isfinite(t).all()):
            raise InputError(f"{where}: {key} holds NaN or infinite values; every output of the model would be meaningless")
        out[name] = t
    return out


def take(state: dict[str, torch.Tensor], where: Path, *names: str) -> torch.Tensor:
    for name in names:
        if name in state:
            return state[name].detach().float()
    raise InputError(f"{where}: no weight {names[0]}; not a complete MarianMTModel")


def weight_map(c: ModelConfig) -> list[tuple[str, tuple[str, ...], str]]:
    """(seqtool's tensor, the Marian tensors it is made of (concatenated, as fused projections are;
    names under "model."), how the residual basis enters it: "reads" (its columns), "writes" (its
    rows, or a norm's or a written bias's entries) or "plain") for every layer's tensors."""
    out: list[tuple[str, tuple[str, ...], str]] = []

    def attention(ours: str, theirs: str, cross: bool) -> None:
        q, k, v, o = (f"{theirs}.{x}_proj" for x in ("q", "k", "v", "out"))
        if cross:
            out.extend([(f"{ours}.q_proj.weight", (f"{q}.weight",), "reads"), (f"{ours}.q_proj.bias", (f"{q}.bias",), "plain"),
                        (f"{ours}.kv_proj.weight", (f"{k}.weight", f"{v}.weight"), "reads"),
                        (f"{ours}.kv_proj.bias", (f"{k}.bias", f"{v}.bias"), "plain")])
        else:
            out.extend([(f"{ours}.qkv_proj.weight", (f"{q}.weight", f"{k}.weight", f"{v}.weight"), "reads"),
                        (f"{ours}.qkv_proj.bias", (f"{q}.bias", f"{k}.bias", f"{v}.bias"), "plain")])
        out.extend([(f"{ours}.out_proj.weight", (f"{o}.weight",), "writes"), (f"{ours}.out_proj.bias", (f"{o}.bias",), "writes")])

    def norm(ours: str, theirs: str) -> None:
        out.extend([(f"{ours}.norm.weight", (f"{theirs}.weight",), "writes"), (f"{ours}.norm.bias", (f"{theirs}.bias",), "writes")])

    def ffn(ours: str, theirs: str) -> None:
        out.extend([(f"{ours}.ffn.fc1.weight", (f"{theirs}.fc1.weight",), "reads"), (f"{ours}.ffn.fc1.bias", (f"{theirs}.fc1.bias",), "plain"),
                    (f"{ours}.ffn.fc2.weight", (f"{theirs}.fc2.weight",), "writes"), (f"{ours}.ffn.fc2.bias", (f"{theirs}.fc2.bias",), "writes")])

    for stack, n in (("encoder", c.encoder_layers), ("decoder", c.decoder_layers)):
        for i in range(n):
            ours, theirs = f"{stack}.{i}", f"{stack}.layers.{i}"
            attention(f"{ours}.self_attn", f"{theirs}.self_attn", cross=False)
            norm(f"{ours}.sub1", f"{theirs}.self_attn_layer_norm")
            if stack == "decoder":
                attention(f"{ours}.cross_attn", f"{theirs}.encoder_attn", cross=True)
                norm(f"{ours}.sub2", f"{theirs}.encoder_attn_layer_norm")
            ffn(ours, theirs)
            norm(f"{ours}.sub{3 if stack == 'decoder' else 2}", f"{theirs}.final_layer_norm")
    return out
