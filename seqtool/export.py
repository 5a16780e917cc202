"""Export a seqtool checkpoint to another toolkit's model format, for deployment.

Owns the mapping from seqtool's weights and settings to other formats, and writing the directory:

- ``ctranslate2``: a CTranslate2 model directory (model.bin, config.json, the shared vocabulary)
  plus the checkpoint's sentencepiece model as ``sentencepiece.model``, built with ctranslate2's
  own model specification API (ctranslate2 is an optional extra: ``pip install 'seqtool[ctranslate2]'``).
  The exported model decodes as ``seqtool translate`` does: source pieces + EOS in, decoding starts
  from BOS, padding and BOS can never be produced (seqtool's search bans them; here an output bias
  of -1e4 does), so CTranslate2's greedy output equals ``seqtool translate --beam 1``.
- ``huggingface``: transformers' Marian format (interop.py), which MarianMTModel and AutoTokenizer load.

The directory is built beside OUT_DIR and renamed into place: an interrupted export leaves no
half-written model, and an existing OUT_DIR is replaced only with force=True, and only when it holds
nothing but the files a seqtool export wrote there (MARKER lists them): a user's file is never deleted.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

from . import checkpoint
from .errors import ConfigError, InputError
from .textio import refuse_existing

FORMATS = ("ctranslate2", "huggingface")
# Weight types CTranslate2 can store (its converters' --quantization); None keeps float32.
CT2_QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")
BANNED_LOGIT_BIAS = -1e4  # finite, so float16/bfloat16 storage keeps it; exp() of it is 0 in float32
SPM_FILENAME = "sentencepiece.model"
MARKER = ".seqtool-export"  # written into every exported directory, listing its files: --force replaces only those


def export(checkpoint_path: Path, out_dir: Path, fmt: str = "ctranslate2", force: bool = False,
           quantization: Optional[str] = None) -> Path:
    """The `seqtool export` command: write OUT_DIR in format `fmt`; returns OUT_DIR."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if quantization is not None and quantization not in CT2_QUANTIZATIONS:
        raise ConfigError(f"--quantization must be one of {', '.join(CT2_QUANTIZATIONS)}, got {quantization!r}")
    out_dir = Path(out_dir)
    refuse_existing(out_dir, force)
    if out_dir.exists():
        check_replaceable(out_dir)
    if quantization is not None and fmt != "ctranslate2":
        raise ConfigError(f"--quantization is CTranslate2's; --format {fmt} writes the weights in float32")
    needs = {"ctranslate2": ("ctranslate2", "ctranslate2"), "huggingface": ("safetensors", "hf")}[fmt]
    try:
        __import__(needs[0])
    except ImportError:
        raise ConfigError(f"--format {fmt} needs the {needs[0]} package: pip install 'seqtool[{needs[1]}]'") from None
    ckpt = checkpoint.load(Path(checkpoint_path))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        build = tmp / "model"
        if fmt == "huggingface":
            from .interop import export_marian

            build.mkdir()
            export_marian(ckpt, build)
        else:
            _convert(ckpt, build, quantization)
            (build / SPM_FILENAME).write_bytes(checkpoint.tokenizer_bytes(ckpt))
        files = sorted([p.name for p in build.iterdir()] + [MARKER])
        (build / MARKER).write_text(json.dumps({"written_by": "seqtool export", "checkpoint": Path(checkpoint_path).name,
                                                "files": files}) + "\n")  # (a name: no local path travels with a model)
        if out_dir.exists():
            check_replaceable(out_dir)  # again: files may have been added while the model was converted
        _replace_dir(build, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    return out_dir


def check_replaceable(out_dir: Path) -> None:
    """--force replaces an empty directory, or one that holds only the files a seqtool export wrote
    (MARKER lists them); anything else is the user's, and is refused (a run directory, a home
    directory, another tool's model, a file added to an exported directory)."""
    if not out_dir.is_dir():
        raise InputError(f"{out_dir}: exists and is not a directory; --force replaces only a directory seqtool export wrote")
    found = sorted(out_dir.iterdir())
    if not found:
        return
    if not (out_dir / MARKER).is_file():
        raise InputError(f"{out_dir}: was not written by seqtool export (no {MARKER} in it), so --force will not replace it; "
                         f"choose another OUT_DIR or remove it yourself")
    try:
        written = json.loads((out_dir / MARKER).read_text(encoding="utf-8")).get("files")
    except (ValueError, AttributeError, OSError):  # (UnicodeDecodeError is a ValueError)
        written = None
    if not isinstance(written, list):
        raise InputError(f"{out_dir / MARKER}: does not list the files seqtool export wrote (an older seqtool wrote it, or it "
                         f"was edited), so --force will not replace {out_dir}; choose another OUT_DIR or remove it yourself")
    others = [p.name for p in found if p.name not in written or (p.is_dir() and not p.is_symlink())]
    if others:
        named = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise InputError(f"{out_dir}: holds files seqtool export did not write ({named}), so --force will not replace it; "
                         f"move them out, or choose another OUT_DIR")


def _replace_dir(new: Path, target: Path) -> None:
    """Rename `new` to `target`; an existing target is moved aside first and removed only after."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{new.parent.name}")
        target.rename(old)
    try:
        new.rename(target)
    except OSError:
        if old is not None:
            old.rename(target)  # put the user's directory back
        raise
    if old is not None:
        if old.is_symlink():  # (a link was replaced: the link goes, what it pointed to stays)
            old.unlink()
        else:
            shutil.rmtree(old, ignore_errors=True)


def _numpy(t) -> Any:
    return t.detach().float().cpu().contiguous().numpy()


def ctranslate2_spec(ckpt: dict[str, Any]):
    """A ctranslate2 TransformerSpec holding the checkpoint's weights (float32) and vocabulary."""
    import torch
    from ctranslate2.specs import TransformerDecoderSpec, TransformerEncoderSpec, TransformerSpec
    from ctranslate2.specs.common_spec import Activation

    from .model import sinusoidal_positions
    from .tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer

    model = checkpoint.load_model(ckpt)
    c = model.config
    tokenizer = Tokenizer(checkpoint.tokenizer_bytes(ckpt), "checkpoint (tokenizer)")
    if tokenizer.pair:
        raise InputError("checkpoint: an imported model's source and target sentencepiece models are two; --format ctranslate2 "
                         "takes seqtool's joint one only (convert the original Marian directory with ctranslate2's own converter)")
    # a multilingual model's target tags: tokens >>lang<< after the pieces, put first in a source
    vocab = tokenizer.vocabulary(ckpt["configs"].get("languages"))
    if len(vocab) != c.vocab_size:
        raise InputError(f"checkpoint: tokenizer has {len(vocab)} pieces but the model {c.vocab_size} outputs; cannot export")

    activation = {"relu": Activation.RELU, "gelu": Activation.GELU, "swish": Activation.SWISH}[c.activation]
    enc = TransformerEncoderSpec(c.encoder_layers, c.n_heads, pre_norm=c.pre_norm, activation=activation)
    dec = TransformerDecoderSpec(c.decoder_layers, c.n_heads, pre_norm=c.pre_norm, activation=activation)
    # seqtool's table (interleaved sin/cos, first position 0), not CTranslate2's default layout.
    positions = _numpy(sinusoidal_positions(c.max_positions, c.d_model))  # (P, D)
    for spec, emb in ((enc, model.embed), (dec, model.tgt_embed)):
        spec.scale_embeddings = c.scale_embedding  # x sqrt(d_model), as Transformer._embed
        spec.position_encodings.encodings = positions
        (spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings).weight = _numpy(emb.weight)
    for spec, layer in zip(enc.layer, model.encoder):
        _attention(spec.self_attention, layer.self_attn, layer.sub1.norm)
        _ffn(spec.ffn, layer.ffn, layer.sub2.norm)
    for spec, layer in zip(dec.layer, model.decoder):
        _attention(spec.self_attention, layer.self_attn, layer.sub1.norm)
        _attention(spec.attention, layer.cross_attn, layer.sub2.norm)
        _ffn(spec.ffn, layer.ffn, layer.sub3.norm)
    if c.pre_norm:  # the final norms of each stack (post-norm models have none)
        _norm(enc.layer_norm, model.encoder_norm)
        _norm(dec.layer_norm, model.decoder_norm)
    dec.projection.weight = _numpy(model.output.weight)  # (V, D), the embedding when tied
    bias = model.output.bias.detach().float().clone() if model.output.bias is not None else torch.zeros(c.vocab_size)
    bias[[c.pad_id, c.bos_id]] = BANNED_LOGIT_BIAS  # seqtool's search never emits these
    if c.language_tags:
        bias[c.vocab_size - c.language_tags:] = BANNED_LOGIT_BIAS  # nor a target-language tag
    dec.projection.bias = _numpy(bias)

    spec = TransformerSpec(enc, dec)
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = vocab[UNK_ID], vocab[BOS_ID], vocab[EOS_ID]
    spec.config.decoder_start_token = vocab[BOS_ID]  # seqtool decodes from BOS (fairseq: from EOS)
    spec.config.add_source_bos, spec.config.add_source_eos = False, True  # source = pieces + EOS
    spec.config.layer_norm_epsilon = model.encoder[0].sub1.norm.eps
    assert vocab[PAD_ID] not in (vocab[UNK_ID], vocab[BOS_ID], vocab[EOS_ID])
    spec.register_source_vocabulary(vocab)
    spec.register_target_vocabulary(vocab)
    return spec


def _norm(spec, norm) -> None:
    spec.gamma, spec.beta = _numpy(norm.weight), _numpy(norm.bias)


def _linear(spec, linear) -> None:
    spec.weight = _numpy(linear.weight)  # (out, in), as torch stores it
    if linear.bias is not None:
        spec.bias = _numpy(linear.bias)


def _attention(spec, attn, norm) -> None:
    """CTranslate2's layout is seqtool's: self-attention [fused QKV, out]; cross [Q, fused KV, out]."""
    _norm(spec.layer_norm, norm)
    if attn.cross:
        _linear(spec.linear[0], attn.q_proj)
        _linear(spec.linear[1], attn.kv_proj)
    else:
        _linear(spec.linear[0], attn.qkv_proj)
    _linear(spec.linear[-1], attn.out_proj)


def _ffn(spec, ffn, norm) -> None:
    _norm(spec.layer_norm, norm)
    _linear(spec.linear_0, ffn.fc1)
    _linear(spec.linear_1, ffn.fc2)


def _convert(ckpt: dict[str, Any], output_dir: Path, quantization: Optional[str]) -> None:
    """ctranslate2's own Converter does the rest: validate, quantize if asked, write the files."""
    from ctranslate2.converters.converter import Converter

    class SeqtoolConverter(Converter):
        def _load(self):
            return ctranslate2_spec(ckpt)

    SeqtoolConverter().convert(str(output_dir), quantization=quantization)
