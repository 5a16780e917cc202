"""The languages of a model trained on several pairs, and the tags that choose its output language.

One shared model for many pairs, the target language named by a token in front of the source
(Johnson et al., 2017, "Google's Multilingual Neural Machine Translation System"; OPUS-MT's
`>>lang<<`). Here a tag is not a piece of the tokenizer but an id after its pieces: target
language k (in sorted order) is id `first_tag + k`. No text encodes to one, so a user's `>>de<<`
or `<2de>` is translated as the text it is and never switches the language (the failure of
eole #314 and transformers #19943, where tags are ordinary vocabulary). The model's output layer
has the tag ids too (one joint embedding), and search never emits them (ModelConfig.language_tags).

A model trained on one pair has no Languages: no tags, exactly as before. Owns: the `SRC-TGT:PREFIX`
corpus argument, the language table (pairs, tags, training shares, the sampling temperature),
and the checks a request's languages get (a target the model lacks; a zero-shot pair).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

from .errors import ConfigError, InputError

CODE = re.compile(r"[A-Za-z]{2,3}(?:_[A-Za-z0-9]+)*")  # es, en, pt_BR, zh_Hant: no "-" (it joins SRC-TGT)


def check_code(code: str, what: str) -> str:
    if not CODE.fullmatch(code or ""):
        raise ConfigError(f"{what}: {code!r} is not a language code (2 or 3 letters, e.g. es, deu, pt_BR)")
    return code


@dataclass(frozen=True)
class Corpus:
    """`--corpus SRC-TGT:PREFIX`: the files PREFIX.SRC and PREFIX.TGT (plain or .gz)."""
    src: str
    tgt: str
    prefix: str

    @property
    def pair(self) -> str:
        return f"{self.src}-{self.tgt}"

    @classmethod
    def parse(cls, text: str, option: str = "--corpus") -> "Corpus":
        langs, sep, prefix = text.partition(":")
        src, dash, tgt = langs.partition("-")
        if not sep or not dash or not prefix:
            raise ConfigError(f"{option} {text!r}: expected SRC-TGT:PREFIX, e.g. es-en:data/bible/train (PREFIX.es, PREFIX.en)")
        check_code(src, f"{option} {text!r}")
        check_code(tgt, f"{option} {text!r}")
        if src == tgt:
            raise ConfigError(f"{option} {text!r}: source and target are both {src!r}")
        return cls(src, tgt, prefix)


def pair_corpora(train: Sequence[str], valid: Sequence[str]) -> list[tuple[Corpus, Corpus]]:
    """--corpus and --valid-corpus, matched by pair: each training pair needs its validation files."""
    train_c = [Corpus.parse(t, "--corpus") for t in train]
    valid_c = {c.pair: c for c in (Corpus.parse(v, "--valid-corpus") for v in valid)}
    seen: set[str] = set()
    for c in train_c:
        if c.pair in seen:
            raise ConfigError(f"--corpus: the pair {c.pair} is given twice; concatenate its files, or give it once")
        seen.add(c.pair)
    missing = [c.pair for c in train_c if c.pair not in valid_c]
    if missing:
        raise ConfigError(f"--valid-corpus: none for {', '.join(missing)}; give --valid-corpus {missing[0]}:PREFIX for each --corpus pair")
    extra = sorted(set(valid_c) - seen)
    if extra:
        raise ConfigError(f"--valid-corpus {extra[0]}: no --corpus of that pair to validate")
    return [(c, valid_c[c.pair]) for c in train_c]


def temperature_shares(sizes: Sequence[int], temperature: float) -> list[float]:
    """Each pair's share of an epoch: its share of the lines to the power 1/T, normalised
    (Arivazhagan et al., 2019: T = 1 samples as the data is, T -> inf uniformly over pairs)."""
    total = float(sum(sizes))
    weights = [(n / total) ** (1.0 / temperature) if n else 0.0 for n in sizes]
    norm = sum(weights)
    return [w / norm for w in weights]


@dataclass(frozen=True)
class Languages:
    pairs: tuple[tuple[str, str], ...]  # the trained (source, target) pairs, in --corpus order
    first_tag: int  # the id of the first target tag: the tokenizer's piece count
    shares: tuple[float, ...] = ()  # each pair's share of the training epochs
    temperature: float = 0.0
    # an imported model's tags are its own vocabulary entries (OPUS-MT's >>fra<<), each target's id
    # (in targets' order); empty: the ids after the pieces, first_tag + k
    tag_ids: tuple[int, ...] = ()

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(sorted({t for _, t in self.pairs}))

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(sorted({s for s, _ in self.pairs}))

    @property
    def tags(self) -> int:
        return len(self.targets)

    def tag(self, tgt: str, field: str = "--tgt-lang") -> int:
        """The tag id of target language `tgt`; a one-line error naming `field` and the targets."""
        if tgt not in self.targets:
            raise InputError(f"{field} {tgt!r}: this model translates into {', '.join(self.targets)}")
        k = self.targets.index(tgt)
        return self.tag_ids[k] if self.tag_ids else self.first_tag + k

    def tag_name(self, i: int) -> Optional[str]:
        """The target language whose tag is id i (None: i is no tag)."""
        if self.tag_ids:
            return self.targets[self.tag_ids.index(i)] if i in self.tag_ids else None
        return self.targets[i - self.first_tag] if self.first_tag <= i < self.first_tag + self.tags else None

    def targets_of(self, src: str) -> tuple[str, ...]:
        """What a source language translates into: every target (zero-shot pairs included) but itself."""
        return tuple(t for t in self.targets if t != src)

    def zero_shot(self, src: Optional[str], tgt: str) -> bool:
        """Whether src -> tgt is a pair the model never trained on (src unknown: not said)."""
        return bool(src) and (src, tgt) not in self.pairs

    def check_source(self, src: str, field: str = "--src-lang") -> str:
        if src not in self.sources:
            raise InputError(f"{field} {src!r}: this model was trained on sources {', '.join(self.sources)}")
        return src

    def to_dict(self) -> dict:
        return {"pairs": [list(p) for p in self.pairs], "first_tag": self.first_tag, "shares": list(self.shares),
                "temperature": self.temperature, **({"tag_ids": list(self.tag_ids)} if self.tag_ids else {})}

    @classmethod
    def from_dict(cls, d: Optional[dict]) -> Optional["Languages"]:
        if not d:
            return None
        return cls(tuple((str(s), str(t)) for s, t in d["pairs"]), int(d["first_tag"]),
                   tuple(float(x) for x in d.get("shares", ())), float(d.get("temperature", 0.0)),
                   tuple(int(i) for i in d.get("tag_ids", ())))

    def describe(self) -> str:
        """One line per pair with its training share, for `seqtool info`."""
        shares = self.shares or (None,) * len(self.pairs)
        rows = [f"{s}-{t}" + (f" {share:.1%}" if share is not None else "") for (s, t), share in zip(self.pairs, shares)]
        return (f"{', '.join(rows)}; target tags {', '.join(f'{t}={self.tag(t)}' for t in self.targets)}"
                + (f"; temperature {self.temperature:g}" if self.temperature else ""))
