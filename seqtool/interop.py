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

- **A directory is untrusted input.** Only regular files inside it are read (no FIFOs, devices, or
  symlinks leading out of it), each under a size cap; every config.json value is checked for its type
  and bounds, and every tensor for its name, shape (against config.json), dtype and finiteness, before
  anything is allocated from config.json's numbers. Each refusal is one line naming the file and field.

Weights are read with the `safetensors` package, or a pickled .bin with torch.load(weights_only=True)
only. transformers itself is needed only to write (export), never to read: imported lazily.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Optional

import torch

from . import checkpoint, log
from .config import ModelConfig, SearchOptions, ServeConfig
from .fields import field_info
from .errors import InputError
from .languages import CODE, Languages
from .model import Transformer, sinusoidal_positions
from .marian import (SPM_CAP, VOCAB_CAP, checked_weights, model_config, read_bytes, read_json, read_weights, shown, take,
                     weight_map)
from .tokenizer import Tokenizer, pair_bytes



def residual_order(d: int) -> torch.Tensor:
    """perm with seqtool[..., j] = marian[..., perm[j]]: seqtool's 2i is Marian's i (the sine of
    frequency i), seqtool's 2i + 1 is Marian's d/2 + i (its cosine)."""
    half = torch.arange(d // 2)
    return torch.stack([half, half + d // 2], dim=1).reshape(-1)


def marian_positions(n: int, d: int) -> torch.Tensor:
    """Marian's table: sin(pos / 10000^(2i/d)) in dimension i, the cosine in d/2 + i."""
    return sinusoidal_positions(n, d)[:, torch.argsort(residual_order(d))]


def _basis(t: torch.Tensor, how: str, order: torch.Tensor) -> torch.Tensor:
    """t with the residual basis reordered where it enters (weight_map's `how`)."""
    if how == "reads":
        return t[:, order].contiguous()
    return t[order].contiguous() if how == "writes" else t.contiguous()


def seqtool_weights(state: dict[str, torch.Tensor], c: ModelConfig, where: Path) -> dict[str, torch.Tensor]:
    """Marian's state dict (read from `where`) as seqtool's (model.Transformer's names, fused projections,
    the residual basis permuted: see the module's docstring), once checked_weights has found it fit c."""
    state = checked_weights(state, c, where)
    perm = residual_order(c.d_model)

    def get(*names: str) -> torch.Tensor:
        return take(state, where, *names)

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
    # (vocab_size is the embeddings' first dimension by now: zeros of it are no larger than they)
    out["output.bias"] = get("final_logits_bias").reshape(-1) if "final_logits_bias" in state else torch.zeros(c.vocab_size)
    return out


def read_tokenizer(directory: Path, c: ModelConfig, settings: dict[str, Any]) -> bytes:
    """The pair Tokenizer's bytes: source.spm, target.spm and vocab.json's id space (c's vocab_size: checked
    against the weights first). settings: tokenizer_config.json's ({} without one)."""
    where = directory / "tokenizer_config.json"
    if settings.get("separate_vocabs") or os.path.lexists(directory / "target_vocab.json"):
        raise InputError(f"{where}: separate_vocabs = true: separate source and target vocabularies; seqtool's models have one id space")
    vocab = read_json(directory, "vocab.json", VOCAB_CAP)
    pieces: list[Optional[str]] = [None] * c.vocab_size
    for piece, i in vocab.items():
        if isinstance(i, bool) or not isinstance(i, int):
            raise InputError(f"{directory / 'vocab.json'}: {shown(piece)} has id {shown(i)}, not an integer; "
                             "vocab.json maps pieces to ids")
        if not 0 <= i < c.vocab_size:
            raise InputError(f"{directory / 'vocab.json'}: {shown(piece)} has id {i}, outside the model's {c.vocab_size} (config.json vocab_size)")
        if pieces[i] is not None:
            raise InputError(f"{directory / 'vocab.json'}: {shown(pieces[i])} and {shown(piece)} both have id {i}; one id is one piece")
        pieces[i] = piece
    specials = {}
    for name, default in (("unk", "<unk>"), ("eos", "</s>"), ("pad", "<pad>")):
        token = settings.get(f"{name}_token", default)
        token = token.get("content", default) if isinstance(token, dict) else token
        if not isinstance(token, str):
            raise InputError(f"{where}: {name}_token = {shown(settings.get(f'{name}_token'))}: not a piece (a string)")
        if token not in vocab:
            raise InputError(f"{directory / 'vocab.json'}: no {name} token {token!r}")
        specials[name] = vocab[token]
    for name, held in (("eos", c.eos_id), ("pad", c.pad_id)):
        if specials[name] != held:
            raise InputError(f"{directory / 'config.json'}: {name}_token_id = {held}, but vocab.json gives {name} token id {specials[name]}")
    spm = {}
    for side in ("source", "target"):
        data = read_bytes(directory, f"{side}.spm", SPM_CAP)
        if data is None:
            raise InputError(f"{directory / f'{side}.spm'}: missing; a Marian model has source.spm and target.spm")
        spm[side] = data
    return pair_bytes(spm["source"], spm["target"], [p or "" for p in pieces], pad=c.pad_id, unk=specials["unk"], bos=c.bos_id,
                      eos=c.eos_id)


def decoding_defaults(generation: dict[str, Any], config: dict[str, Any], directory: Path) -> dict[str, Any]:
    """The model's own decoding defaults (translate and serve use them unless told otherwise): its beam
    (generation_config.json's num_beams, else config.json's), within `serve`'s default --max-beam so that
    the checkpoint serves as it is; a value over it is lowered to it, one that is no beam size left out,
    each with a warning."""
    name = "generation_config.json" if "num_beams" in generation else "config.json"
    beams = (generation if "num_beams" in generation else config).get("num_beams")
    if beams is None:
        return {}
    if isinstance(beams, bool) or not isinstance(beams, int) or beams < 1:
        log.warn(f"{directory / name}: num_beams = {shown(beams)} is not a beam size; left out (translate and serve use their default)")
        return {}
    cap = field_info(ServeConfig, "max_beam")["default"]
    if beams > cap:
        log.warn(f"{directory / name}: num_beams = {beams} is over serve's --max-beam {cap}; the checkpoint's default beam is {cap}")
        beams = cap
    return {"beam": beams}


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


def import_marian(directory: Path, output: Path, src_lang: str = "", tgt_lang: str = "", force: bool = False) -> dict[str, Any]:
    """The `seqtool import` command: DIRECTORY (transformers' Marian format) as a seqtool checkpoint
    at OUTPUT (written atomically; an existing one replaced only with force). Returns the checkpoint."""
    from .textio import refuse_existing

    refuse_existing(output, force)
    directory = Path(directory)
    if not directory.is_dir():
        raise InputError(f"{directory}: not a directory; give the folder a Marian model was saved in (save_pretrained)")
    config = read_json(directory, "config.json")
    c = model_config(config, str(directory / "config.json"))
    state, where = read_weights(directory)
    weights = seqtool_weights(state, c, where)  # first: every number of c is the weights' before anything is made from it
    del state
    settings = read_json(directory, "tokenizer_config.json", required=False) or {}
    generation = read_json(directory, "generation_config.json", required=False) or {}
    for name, value in (("source_lang", settings.get("source_lang")), ("target_lang", settings.get("target_lang"))):
        if value is not None and not isinstance(value, str):
            raise InputError(f"{directory / 'tokenizer_config.json'}: {name} = {shown(value)}: not a language code")
    tokenizer = Tokenizer(read_tokenizer(directory, c, settings), f"{directory} (source.spm, target.spm)")
    decoding = decoding_defaults(generation, config, directory)
    version = config.get("transformers_version") if isinstance(config.get("transformers_version"), str) else None
    configs = {
        "model": c.to_dict(),
        "train": {"src_lang": src_lang or settings.get("source_lang") or "", "tgt_lang": tgt_lang or settings.get("target_lang") or ""},
        "decoding": decoding,
        "imported": {"format": "marian", "from": directory.resolve().name, "transformers_version": version},
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
