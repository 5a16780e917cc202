"""transformers' Marian format (the OPUS-MT models): read one into a seqtool checkpoint, write one out.

Owns the mapping between a MarianMTModel directory (config.json, model.safetensors or
pytorch_model.bin, source.spm, target.spm, vocab.json, tokenizer_config.json, generation_config.json)
and seqtool's checkpoint: names, fused projections, special ids, tokenizers, and the one layout
difference that is not a name:

- **Positions.** Marian's sinusoids put every sine first and every cosine after them (dimension i
  and d/2 + i share frequency i); seqtool's interleave them (2i and 2i + 1), as the paper does. The
  residual stream's dimensions are a basis nothing else singles out: layer norms, residual sums and
  every projection treat them alike. So a model is carried across by permuting that basis (the
  embedding columns, each projection's input columns where it reads the stream and its output rows
  where it writes it, the norms' weights) so that Marian's position table becomes seqtool's. The
  same network, exactly: no new kind of layer in model.py.
- **What seqtool runs as Marian does** (ModelConfig fields): the activation (relu, gelu, swish),
  scaled or unscaled embeddings, `final_logits_bias` (output_bias), decoding from pad
  (bos_id = decoder_start_token_id), tied or separate embeddings, post-norm.
- **Refused, by the field that asks for it** (never approximated): another model_type, different
  encoder and decoder head counts or feed-forward widths, another activation, an odd d_model,
  separate source and target vocabularies, learned positions that are not Marian's sinusoids.
- **Tokenizers.** Marian's source.spm and target.spm over one id space (vocab.json): a pair
  Tokenizer (tokenizer.py), stored in the checkpoint like seqtool's own.

Weights are read with the `safetensors` package, or a pickled .bin with torch.load(weights_only=True)
only. transformers itself is needed only to write (export), never to read: imported lazily.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Optional

import torch

from . import checkpoint
from .config import ModelConfig, SearchOptions
from .errors import InputError
from .languages import CODE, Languages
from .model import Transformer, sinusoidal_positions
from .tokenizer import Tokenizer, pair_bytes

ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}  # Marian's name -> seqtool's
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def residual_order(d: int) -> torch.Tensor:
    """perm with seqtool[..., j] = marian[..., perm[j]]: seqtool's 2i is Marian's i (the sine of
    frequency i), seqtool's 2i + 1 is Marian's d/2 + i (its cosine)."""
    half = torch.arange(d // 2)
    return torch.stack([half, half + d // 2], dim=1).reshape(-1)


def marian_positions(n: int, d: int) -> torch.Tensor:
    """Marian's table: sin(pos / 10000^(2i/d)) in dimension i, the cosine in d/2 + i."""
    return sinusoidal_positions(n, d)[:, torch.argsort(residual_order(d))]


# ---- reading -----------------------------------------------------------------------------------
def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: missing; a transformers Marian directory holds config.json, model.safetensors "
                         "(or pytorch_model.bin), source.spm, target.spm and vocab.json") from None
    except (ValueError, OSError) as error:
        raise InputError(f"{path}: not readable JSON ({str(error).splitlines()[0][:120]})") from None


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """The state dict, from model.safetensors (safetensors) or pytorch_model.bin (weights_only=True)."""
    for name in WEIGHT_FILES:
        path = directory / name
        if not path.exists():
            continue
        if name.endswith(".safetensors"):
            try:
                from safetensors.torch import load_file
            except ImportError:
                raise InputError(f"{path}: reading safetensors needs the safetensors package: pip install 'seqtool[hf]'") from None
            try:
                return load_file(str(path))
            except Exception as error:  # noqa: BLE001 - safetensors raises its own error types
                raise InputError(f"{path}: not a readable safetensors file ({str(error).splitlines()[0][:120]})") from None
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # noqa: BLE001 - weights_only refuses code; a damaged file fails otherwise
            raise InputError(f"{path}: refused or unreadable with torch.load(weights_only=True) "
                             f"({str(error).strip().splitlines()[0][:120]})") from None
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise InputError(f"{path}: not a state dict of tensors")
        return state
    raise InputError(f"{directory}: no weights ({' or '.join(WEIGHT_FILES)})")


def model_config(config: dict, where: str) -> ModelConfig:
    """seqtool's ModelConfig for a Marian config.json, or a refusal naming the field seqtool cannot run exactly."""
    def field(name: str, default: Any = None) -> Any:
        return config.get(name, default)

    def refuse(name: str, why: str) -> InputError:
        return InputError(f"{where}: {name} = {json.dumps(field(name))}: {why}; seqtool runs a model only exactly, never approximately")

    if field("model_type") != "marian":
        raise refuse("model_type", "not a Marian model (transformers' MarianMTModel)")
    for enc, dec, what in (("encoder_attention_heads", "decoder_attention_heads", "heads"),
                           ("encoder_ffn_dim", "decoder_ffn_dim", "feed-forward widths")):
        if field(enc) != field(dec):
            raise refuse(dec, f"differs from {enc} = {field(enc)} (seqtool's encoder and decoder share their {what})")
    activation = ACTIVATIONS.get(str(field("activation_function", "gelu")))
    if activation is None:
        raise refuse("activation_function", f"seqtool has {', '.join(sorted(ACTIVATIONS))}")
    d = int(field("d_model", 1024))
    if d % 2:
        raise refuse("d_model", "odd: Marian's and seqtool's sinusoids differ there")
    vocab = int(field("vocab_size", 58101))
    if field("decoder_vocab_size") not in (None, vocab) or field("share_encoder_decoder_embeddings", True) is False and field("separate_vocabs"):
        raise refuse("decoder_vocab_size", f"separate source and target vocabularies (vocab_size = {vocab}); seqtool's models have one id space")
    for name in ("eos_token_id", "pad_token_id", "decoder_start_token_id"):
        if not isinstance(field(name), int):
            raise refuse(name, "not one token id")
    if field("normalize_before") or field("add_final_layer_norm") or field("normalize_embedding"):
        raise refuse("normalize_before" if field("normalize_before") else "add_final_layer_norm" if field("add_final_layer_norm")
                     else "normalize_embedding", "Marian in transformers is post-norm without extra norms")
    pad, start = field("pad_token_id"), field("decoder_start_token_id")
    shared = field("share_encoder_decoder_embeddings", True) is not False
    tied = shared and field("tie_word_embeddings", True) is not False
    try:
        return ModelConfig(
            vocab_size=vocab, d_model=d, n_heads=int(field("encoder_attention_heads", 16)), d_ff=int(field("encoder_ffn_dim", 4096)),
            encoder_layers=int(field("encoder_layers", 12)), decoder_layers=int(field("decoder_layers", 12)),
            dropout=float(field("dropout", 0.1)), attention_dropout=float(field("attention_dropout", 0.0)),
            activation_dropout=float(field("activation_dropout", 0.0)), max_positions=int(field("max_position_embeddings", 1024)),
            pre_norm=False, tie_embeddings=tied, pad_id=pad, bos_id=start, eos_id=field("eos_token_id"),
            activation=activation, scale_embedding=bool(field("scale_embedding", False)), output_bias=True)
    except (ValueError, TypeError) as error:
        raise InputError(f"{where}: {error}") from None


def _take(state: dict[str, torch.Tensor], where: Path, *names: str) -> torch.Tensor:
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


def _basis(t: torch.Tensor, how: str, order: torch.Tensor) -> torch.Tensor:
    """t with the residual basis reordered where it enters (weight_map's `how`)."""
    if how == "reads":
        return t[:, order].contiguous()
    return t[order].contiguous() if how == "writes" else t.contiguous()


def seqtool_weights(state: dict[str, torch.Tensor], c: ModelConfig, where: Path) -> dict[str, torch.Tensor]:
    """Marian's state dict as seqtool's (model.Transformer's names, fused projections, the residual
    basis permuted: see the module's docstring)."""
    state = {k.removeprefix("model."): v for k, v in state.items()}
    perm = residual_order(c.d_model)

    def get(*names: str) -> torch.Tensor:
        return _take(state, where, *names)

    for stack in ("encoder", "decoder"):
        table = state.get(f"{stack}.embed_positions.weight")
        if table is not None and not torch.allclose(table.float(), marian_positions(table.size(0), c.d_model), atol=1e-4):
            raise InputError(f"{where}: {stack}.embed_positions.weight is not Marian's sinusoid table (learned positions?); "
                             "seqtool runs sinusoidal positions only")
    out = {ours: torch.cat([_basis(get(t), how, perm) for t in theirs]) for ours, theirs, how in weight_map(c)}
    out["embed.weight"] = _basis(get("encoder.embed_tokens.weight", "shared.weight"), "reads", perm)
    if not c.tie_embeddings:  # (the decoder's a copy of the encoder's when only the output is untied)
        out["tgt_embed.weight"] = _basis(get("decoder.embed_tokens.weight", "shared.weight"), "reads", perm)
        out["output.weight"] = _basis(get("lm_head.weight", "decoder.embed_tokens.weight", "shared.weight"), "reads", perm)
    out["output.bias"] = get("final_logits_bias").reshape(-1) if "final_logits_bias" in state else torch.zeros(c.vocab_size)
    extra = sorted(k for k in state if k.startswith(("encoder.layers.", "decoder.layers.")) and int(k.split(".")[2]) >=
                   (c.encoder_layers if k.startswith("encoder") else c.decoder_layers))
    if extra:
        raise InputError(f"{where}: holds {extra[0]}, beyond the layers config.json declares")
    return out


def read_tokenizer(directory: Path, c: ModelConfig) -> bytes:
    """The pair Tokenizer's bytes: source.spm, target.spm and vocab.json's id space."""
    vocab = _read_json(directory / "vocab.json")
    settings = _read_json(directory / "tokenizer_config.json") if (directory / "tokenizer_config.json").exists() else {}
    if settings.get("separate_vocabs") or (directory / "target_vocab.json").exists():
        raise InputError(f"{directory / 'tokenizer_config.json'}: separate_vocabs = true: separate source and target "
                         "vocabularies; seqtool's models have one id space")
    if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
        raise InputError(f"{directory / 'vocab.json'}: not a table of piece -> id")
    pieces = [""] * c.vocab_size
    for piece, i in vocab.items():
        if not 0 <= i < c.vocab_size:
            raise InputError(f"{directory / 'vocab.json'}: {piece!r} has id {i}, outside the model's {c.vocab_size} (config.json vocab_size)")
        pieces[i] = piece
    specials = {}
    for name, default in (("unk", "<unk>"), ("eos", "</s>"), ("pad", "<pad>")):
        token = settings.get(f"{name}_token", default)
        token = token.get("content", default) if isinstance(token, dict) else token
        if token not in vocab:
            raise InputError(f"{directory / 'vocab.json'}: no {name} token {token!r}")
        specials[name] = vocab[token]
    for name, held in (("eos", c.eos_id), ("pad", c.pad_id)):
        if specials[name] != held:
            raise InputError(f"{directory / 'config.json'}: {name}_token_id = {held}, but vocab.json gives {name} token id {specials[name]}")
    spm = {}
    for side in ("source", "target"):
        path = directory / f"{side}.spm"
        try:
            spm[side] = path.read_bytes()
        except OSError:
            raise InputError(f"{path}: missing; a Marian model has source.spm and target.spm") from None
    return pair_bytes(spm["source"], spm["target"], pieces, pad=c.pad_id, unk=specials["unk"], bos=c.bos_id, eos=c.eos_id)


TAG = re.compile(r">>(.+)<<")  # OPUS-MT's target-language token, e.g. >>fra<<


def target_tags(pieces: list[str], src_lang: str) -> Optional[Languages]:
    """A multi-target OPUS-MT model's languages: vocab.json's >>lang<< entries (MarianTokenizer
    reads one at a text's start) become the targets of --tgt-lang and the server's `target`, each
    tag its own vocabulary id. The source is tokenizer_config.json's when it is a language code
    (not one of the targets), else "mul" (ISO 639's "multiple languages"). None: no such entry."""
    found = {m.group(1): i for i, p in enumerate(pieces) if (m := TAG.fullmatch(p)) and CODE.fullmatch(m.group(1))}
    if not found:
        return None
    targets = sorted(found)
    src = src_lang if CODE.fullmatch(src_lang or "") and src_lang not in found else "mul"
    return Languages(tuple((src, t) for t in targets), first_tag=len(pieces), tag_ids=tuple(found[t] for t in targets))


def import_marian(directory: Path, output: Path, src_lang: str = "", tgt_lang: str = "") -> dict[str, Any]:
    """The `seqtool import` command: DIRECTORY (transformers' Marian format) as a seqtool checkpoint
    at OUTPUT (written atomically). Returns the checkpoint."""
    directory = Path(directory)
    if not directory.is_dir():
        raise InputError(f"{directory}: not a directory; give the folder a Marian model was saved in (save_pretrained)")
    config = _read_json(directory / "config.json")
    c = model_config(config, str(directory / "config.json"))
    tokenizer = Tokenizer(read_tokenizer(directory, c), f"{directory} (source.spm, target.spm)")
    weights = seqtool_weights(read_weights(directory), c, directory)
    generation = _read_json(directory / "generation_config.json") if (directory / "generation_config.json").exists() else {}
    settings = _read_json(directory / "tokenizer_config.json") if (directory / "tokenizer_config.json").exists() else {}
    decoding = {}
    beams = generation.get("num_beams", config.get("num_beams"))
    if isinstance(beams, int) and beams >= 1:
        decoding["beam"] = beams  # the model's own decoding default (translate and serve use it unless told)
    configs = {
        "model": c.to_dict(),
        "train": {"src_lang": src_lang or settings.get("source_lang") or "", "tgt_lang": tgt_lang or settings.get("target_lang") or ""},
        "decoding": decoding,
        "imported": {"format": "marian", "from": directory.resolve().name, "transformers_version": config.get("transformers_version")},
    }
    languages = target_tags(tokenizer.vocabulary(), configs["train"]["src_lang"])
    if languages is not None:
        configs["languages"] = languages.to_dict()
    model = Transformer(c)  # the weights must fit the model exactly: every name, every shape
    try:
        missing, unexpected = model.load_state_dict(weights, strict=False)
    except RuntimeError as error:  # a shape config.json does not give
        raise InputError(f"{directory}: weights do not fit config.json ({str(error).splitlines()[-1].strip()[:160]})") from None
    tied = {"output.weight", "tgt_embed.weight"} if c.tie_embeddings else set()
    if [m for m in missing if m not in tied] or unexpected:
        raise InputError(f"{directory}: weights do not fit config.json: missing {missing[:3]}, unexpected {unexpected[:3]}")
    ckpt = checkpoint.build(configs, tokenizer.model_bytes, checkpoint.model_state(model))
    checkpoint.save(ckpt, Path(output))
    return ckpt


# ---- writing -----------------------------------------------------------------------------------
def export_marian(ckpt: dict[str, Any], out: Path) -> None:
    """Write a MarianMTModel directory into `out` (an empty directory): config.json,
    generation_config.json, model.safetensors, source.spm, target.spm, vocab.json, tokenizer_config.json."""
    from safetensors.torch import save_file

    c = ModelConfig.from_dict(ckpt["model_config"])
    if c.pre_norm:
        raise InputError("--format huggingface: this model is pre-norm (model.pre_norm = true) and transformers' MarianMTModel is "
                         "post-norm only; no transformers Marian model computes it")
    tokenizer = Tokenizer(checkpoint.tokenizer_bytes(ckpt), "checkpoint (tokenizer)")
    vocab = tokenizer.vocabulary(ckpt["configs"].get("languages"))  # (target tags: >>lang<<, which MarianTokenizer reads at a text's start)
    if len(vocab) != c.vocab_size:
        raise InputError(f"checkpoint: tokenizer has {len(vocab)} pieces but the model {c.vocab_size} outputs; cannot export")
    if len(set(vocab)) != len(vocab):
        raise InputError("checkpoint: two ids share a piece; vocab.json cannot hold them")
    model = checkpoint.load_model(ckpt)
    state = {k: v.detach().float() for k, v in model.state_dict().items()}
    back = torch.argsort(residual_order(c.d_model))  # marian[..., j] = seqtool[..., back[j]]
    out_state: dict[str, torch.Tensor] = {}
    for ours, theirs, how in weight_map(c):
        for name, part in zip(theirs, state[ours].chunk(len(theirs))):
            out_state[f"model.{name}"] = _basis(part, how, back)
    embed = _basis(state["embed.weight"], "reads", back)
    if c.tie_embeddings:
        out_state["model.shared.weight"] = embed
    else:
        out_state["model.encoder.embed_tokens.weight"] = embed
        out_state["model.decoder.embed_tokens.weight"] = _basis(state["tgt_embed.weight"], "reads", back)
        out_state["lm_head.weight"] = _basis(state["output.weight"], "reads", back)
    out_state["final_logits_bias"] = state.get("output.bias", torch.zeros(c.vocab_size)).reshape(1, -1).contiguous()
    for stack in ("encoder", "decoder"):  # (transformers would make the same table; written, nothing is left to initialise)
        out_state[f"model.{stack}.embed_positions.weight"] = marian_positions(c.max_positions, c.d_model)
    save_file(out_state, str(out / "model.safetensors"), metadata={"format": "pt"})

    banned = sorted({c.pad_id, c.bos_id} | set(range(c.vocab_size - c.language_tags, c.vocab_size)))
    config = {
        "architectures": ["MarianMTModel"], "model_type": "marian",
        "vocab_size": c.vocab_size, "decoder_vocab_size": c.vocab_size, "d_model": c.d_model,
        "encoder_layers": c.encoder_layers, "decoder_layers": c.decoder_layers,
        "encoder_attention_heads": c.n_heads, "decoder_attention_heads": c.n_heads,
        "encoder_ffn_dim": c.d_ff, "decoder_ffn_dim": c.d_ff, "activation_function": c.activation,
        "dropout": c.dropout, "attention_dropout": c.attention_dropout, "activation_dropout": c.activation_dropout,
        "max_position_embeddings": c.max_positions, "scale_embedding": c.scale_embedding,
        "share_encoder_decoder_embeddings": c.tie_embeddings, "tie_word_embeddings": c.tie_embeddings,
        "pad_token_id": c.pad_id, "eos_token_id": c.eos_id, "decoder_start_token_id": c.bos_id,
        "forced_eos_token_id": c.eos_id, "bos_token_id": None, "is_encoder_decoder": True,
        "init_std": 0.02, "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0, "use_cache": True,
    }
    generation = {"decoder_start_token_id": c.bos_id, "pad_token_id": c.pad_id, "eos_token_id": c.eos_id,
                  "forced_eos_token_id": c.eos_id, "bad_words_ids": [[i] for i in banned],
                  "num_beams": int((ckpt["configs"].get("decoding") or {}).get("beam", SearchOptions().beam)), "max_length": c.max_positions}
    train = ckpt["configs"].get("train") or {}
    names = tokenizer.special_pieces()
    settings = {"tokenizer_class": "MarianTokenizer", "source_lang": train.get("src_lang") or None,
                "target_lang": train.get("tgt_lang") or None, "unk_token": names["unk"], "eos_token": names["eos"],
                "pad_token": names["pad"], "model_max_length": c.max_positions, "separate_vocabs": False,
                "clean_up_tokenization_spaces": False}  # (seqtool writes what sentencepiece decodes: no "cleaning" of spaces)
    source, target = tokenizer.model_pair()
    for name, data in (("source.spm", source), ("target.spm", target)):
        (out / name).write_bytes(data)
    for name, value in (("config.json", config), ("generation_config.json", generation), ("tokenizer_config.json", settings),
                        ("vocab.json", {piece: i for i, piece in enumerate(vocab)})):
        (out / name).write_text(json.dumps(value, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
