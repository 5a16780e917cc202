"""Subword tokenization with sentencepiece.

Owns training a joint sentencepiece model (BPE or unigram) on plain or .gz text, and the
Tokenizer used everywhere else: encode to ids, decode to text, and loading from a path or from the
bytes stored inside a checkpoint. A Tokenizer is one of two kinds:

- **joint** (seqtool's own): one sentencepiece model for both sides, with fixed special ids
  (pad 0, unk 1, bos 2, eos 3) that are its own piece ids;
- **pair** (an imported Marian model's, interop.py): a source and a target sentencepiece model over
  one shared id space (the model's vocab.json), with that model's special ids. Source text is
  encoded by the source model, output ids decoded by the target model, each through the id space.
  Its bytes are PAIR_MAGIC, one JSON line (the pieces by id, the special ids, the two models'
  sizes), then the two models: stored in a checkpoint exactly as a joint model's bytes are.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

import numpy as np
import sentencepiece as spm

from .config import TokenizerConfig
from .errors import InputError
from .interrupts import die_with_parent
from .languages import Languages
from .textio import read_lines

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
PAIR_MAGIC = b"seqtool tokenizer pair 1\n"
_SURROGATE = re.compile("[\ud800-\udfff]")  # not UTF-8: sentencepiece cannot read them


def _processor(data: bytes, source: str) -> spm.SentencePieceProcessor:
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(data)
    except (RuntimeError, OSError) as error:
        raise InputError(f"{source}: not a sentencepiece model ({error})") from None
    return sp


def pair_bytes(source: bytes, target: bytes, pieces: Sequence[str], pad: int, unk: int, bos: int, eos: int) -> bytes:
    """A pair Tokenizer's bytes: the two sentencepiece models and the id space (pieces[i] is id i's piece)."""
    header = {"pieces": list(pieces), "pad": pad, "unk": unk, "bos": bos, "eos": eos, "source": len(source), "target": len(target)}
    return PAIR_MAGIC + json.dumps(header, ensure_ascii=False).encode("utf-8") + b"\n" + source + target


class Tokenizer:
    def __init__(self, model_bytes: bytes, source: str = "<bytes>"):
        self.model_bytes = bytes(model_bytes)
        self.pair = self.model_bytes.startswith(PAIR_MAGIC)
        if self.pair:
            self._load_pair(source)
            return
        self.sp = self.source_sp = self.target_sp = _processor(self.model_bytes, source)
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID
        if (self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id()) != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise InputError(
                f"{source}: special ids pad/unk/bos/eos are {self.sp.pad_id()}/{self.sp.unk_id()}/"
                f"{self.sp.bos_id()}/{self.sp.eos_id()}, seqtool needs 0/1/2/3; train it with seqtool train-tokenizer"
            )
        self._pieces: Optional[list[str]] = None
        self._to_target = None  # ids are the sentencepiece model's own

    def _load_pair(self, source: str) -> None:
        rest = self.model_bytes[len(PAIR_MAGIC):]
        line, _, models = rest.partition(b"\n")
        try:
            h = json.loads(line)
            sizes = (int(h["source"]), int(h["target"]))
            self._pieces = [str(p) for p in h["pieces"]]
            self.pad_id, self.unk_id, self.bos_id, self.eos_id = (int(h[k]) for k in ("pad", "unk", "bos", "eos"))
        except (ValueError, KeyError, TypeError) as error:
            raise InputError(f"{source}: a damaged tokenizer pair ({error})") from None
        if len(models) != sum(sizes):
            raise InputError(f"{source}: a damaged tokenizer pair (its models are {len(models)} bytes, not {sum(sizes)})")
        self.source_sp = _processor(models[: sizes[0]], f"{source} (source model)")
        self.target_sp = _processor(models[sizes[0]:], f"{source} (target model)")
        self._ids = {p: i for i, p in enumerate(self._pieces) if p}
        # Text is encoded as MarianTokenizer does: the model's pieces as strings (an unknown character
        # is its own text), each looked up in the id space (missing: unk). Output ids are decoded by
        # the target model: id -> its piece -> the target model's id for it; where a piece of the
        # shared id space is not the target model's (-1 here), the output's pieces are written as
        # their text, as sentencepiece's DecodePieces (and so MarianTokenizer) writes them.
        unk = self.target_sp.unk_id()
        self._to_target = np.array([-1 if not p else (k if (k := self.target_sp.piece_to_id(p)) != unk or i == self.unk_id else -1)
                                    for i, p in enumerate(self._pieces)], dtype=np.int64)
        self._source_models = (models[: sizes[0]], models[sizes[0]:])

    @classmethod
    def load(cls, path: Path) -> "Tokenizer":
        path = Path(path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise InputError(f"{path}: no such tokenizer model") from None
        except OSError as error:
            raise InputError(f"{path}: cannot read: {error.strerror}") from None
        return cls(data, str(path))

    @property
    def vocab_size(self) -> int:
        return len(self._pieces) if self.pair else self.sp.get_piece_size()

    def id_to_piece(self, i: int) -> str:
        return self._pieces[i] if self.pair else self.sp.id_to_piece(i)

    def vocabulary(self, languages: Optional[dict] = None) -> list[str]:
        """Every id's piece; a multilingual model's target tags (its configs' "languages") as >>lang<< after them
        (an imported model's tags are among its pieces already)."""
        pieces = list(self._pieces) if self.pair else [self.sp.id_to_piece(i) for i in range(self.sp.get_piece_size())]
        langs = Languages.from_dict(languages)
        return pieces + ([f">>{t}<<" for t in langs.targets] if langs is not None and not langs.tag_ids else [])

    def special_pieces(self) -> dict[str, str]:
        return {name: self.id_to_piece(i) for name, i in (("pad", self.pad_id), ("unk", self.unk_id), ("bos", self.bos_id), ("eos", self.eos_id))}

    def model_pair(self) -> tuple[bytes, bytes]:
        """The source and the target sentencepiece model (a joint tokenizer's one model, twice)."""
        return self._source_models if self.pair else (self.model_bytes, self.model_bytes)

    def _lookup(self, pieces: Sequence[str]) -> list[int]:
        return [self._ids.get(p, self.unk_id) for p in pieces]

    def _out(self, ids: Iterable[int]) -> list[int]:
        """The ids decode writes (pad, bos and eos write nothing)."""
        return [i for i in ids if i not in (self.pad_id, self.bos_id, self.eos_id)]

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str], side: str = "source") -> list[list[int]]:
        """Token ids of each text; side "target" (references, prefixes, constraints: text of the output
        language) encodes with a pair's target model."""
        sp = self.target_sp if side == "target" else self.source_sp
        texts = list(texts)
        kind = str if self.pair else int
        try:
            rows = sp.encode(texts, out_type=kind)
        except (TypeError, UnicodeEncodeError):
            # lone surrogates (text read with errors="surrogateescape") are not UTF-8: U+FFFD, as for bad bytes
            rows = sp.encode([t.encode("utf-8", "surrogatepass").decode("utf-8", "replace") for t in texts], out_type=kind)
        return [self._lookup(row) for row in rows] if self.pair else rows

    def pieces(self, text: str) -> list[str]:
        return self.source_sp.encode(text, out_type=str)

    def decode(self, ids: Iterable[int]) -> str:
        return self.decode_batch([ids])[0]

    def decode_batch(self, seqs: Sequence[Iterable[int]]) -> list[str]:
        """decode() of each sequence, in one sentencepiece call (translate decodes a chunk at once); a
        pair's output holding a piece its target model lacks is written as its pieces' text."""
        if not seqs:
            return []
        outs = [self._out(ids) for ids in seqs]
        if not self.pair:
            return self.sp.decode(outs)
        mapped = [self._to_target[np.asarray(o, dtype=np.int64)].tolist() for o in outs]  # -1: not the target model's
        whole = [k for k, m in enumerate(mapped) if not m or min(m) >= 0]
        texts = [self._as_text(o)[0] for o in outs] if len(whole) < len(outs) else [""] * len(outs)
        for k, text in zip(whole, self.target_sp.decode([mapped[k] for k in whole])):
            texts[k] = text
        return texts

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """encode(text), and the [start, end) character range in `text` of each piece: sentencepiece's
        own spans (a piece starting with '▁' covers the whitespace before its word; a character
        split into byte pieces is covered by its last byte piece, the others get an empty range).
        A lone surrogate is read as U+FFFD, as encode_batch does, so offsets still count `text`'s characters."""
        text = _SURROGATE.sub("\ufffd", text)
        if self.pair:  # the pieces as encode_batch reads them (an unknown character: its own text), and their spans
            pieces = self.source_sp.encode(text, out_type=str)
            mapping = self.source_sp.encode(text, return_type="offset_mapping")
            return self._lookup(pieces), [(a, b) for a, b in mapping["offsets"]]
        try:
            mapping = self.sp.encode(text, return_type="offset_mapping")  # sentencepiece >= 0.2.3
        except TypeError:  # older: no return_type, an immutable proto with character offsets
            proto = self.sp.encode(text, out_type="immutable_proto")
            return [p.id for p in proto.pieces], [(p.begin, p.end) for p in proto.pieces]
        return list(mapping["ids"]), [(a, b) for a, b in mapping["offsets"]]

    def decode_with_offsets(self, ids: Iterable[int]) -> tuple[str, list[tuple[int, int]]]:
        """decode(ids), and the [start, end) character range in that text of each id, one per id given:
        a '▁' piece's range covers its space; pad, bos and eos write nothing and get an empty range
        where they stand; a character written by byte pieces belongs to its last byte piece."""
        ids = [int(i) for i in ids]
        kept = [k for k, i in enumerate(ids) if i not in (self.pad_id, self.bos_id, self.eos_id)]
        if not kept:
            return "", [(0, 0)] * len(ids)
        written = [ids[k] for k in kept]
        if self.pair:
            written = self._to_target[np.asarray(written, dtype=np.int64)].tolist()
            if min(written) < 0:  # a piece the target model lacks: every piece as its text
                text, offsets = self._as_text([ids[k] for k in kept])
                written = []
        if written:
            try:
                mapping = self.target_sp.decode(written, return_type="offset_mapping")
                text, offsets = mapping["text"], [(a, b) for a, b in mapping["offsets"]]
            except TypeError:
                proto = self.target_sp.decode(written, out_type="immutable_proto")
                text, offsets = proto.text, [(p.begin, p.end) for p in proto.pieces]
        ranges, at, position = [], 0, 0
        for k in range(len(ids)):
            if at < len(kept) and kept[at] == k:
                ranges.append(offsets[at])
                position = offsets[at][1]
                at += 1
            else:
                ranges.append((position, position))
        return text, ranges

    def _as_text(self, ids: list[int]) -> tuple[str, list[tuple[int, int]]]:
        """A pair's pieces written as their text ('▁' a space, unk as sentencepiece writes it), the text
        stripped as MarianTokenizer strips it, and each piece's range in it."""
        parts = [" \u2047 " if i == self.unk_id else self._pieces[i].replace("\u2581", " ") for i in ids]
        whole = "".join(parts)
        lead = len(whole) - len(whole.lstrip())
        text = whole.strip()
        ranges, at = [], 0
        for part in parts:
            a, b = at - lead, at + len(part) - lead
            ranges.append((min(max(a, 0), len(text)), min(max(b, 0), len(text))))
            at += len(part)
        return text, ranges


def train_tokenizer(files: Sequence[Path], model_prefix: str, config: TokenizerConfig,
                    repeats: Optional[Sequence[int]] = None, force: bool = True) -> Path:
    """Train a joint model over all `files`; writes PREFIX.model and PREFIX.vocab; returns the .model path.
    repeats: how many times each file's lines go into the sample (a small language's, to get its pieces).
    force: replace an existing PREFIX.model (the command asks for --force)."""
    from .textio import refuse_existing

    refuse_existing(f"{model_prefix}.model", force)
    prefix = Path(model_prefix)
    if prefix.parent and not prefix.parent.exists():
        prefix.parent.mkdir(parents=True, exist_ok=True)
    files = [Path(f) for f in files]
    if next(_text_lines(files), None) is None:  # (also: every file exists and is readable)
        raise InputError(f"{', '.join(map(str, files))}: no text to train a tokenizer on (empty files?)")
    with tempfile.TemporaryDirectory(prefix="seqtool-spm-") as tmp:
        tmp_prefix = os.path.join(tmp, "spm")
        _train_in_child(files, tmp_prefix, config, repeats)
        model = Path(tmp_prefix + ".model").read_bytes()
        vocab = Path(tmp_prefix + ".vocab").read_bytes()
    from .textio import atomic_write_bytes

    # the .model last: it is what every other step looks for, so it appears only beside its .vocab
    atomic_write_bytes(Path(f"{prefix}.vocab"), vocab)
    atomic_write_bytes(Path(f"{prefix}.model"), model)
    return Path(f"{prefix}.model")


def _train_in_child(files: list[Path], tmp_prefix: str, config: TokenizerConfig, repeats: Optional[Sequence[int]] = None) -> None:
    """Run sentencepiece's trainer in a forked child process.

    Its C++ training loop does not return to Python for minutes on a large corpus, so a Ctrl-C
    would wait for it; in a child, the parent stays responsive: on KeyboardInterrupt it kills the
    child and the temporary directory goes away with everything the child wrote. The child
    inherits `lines` through fork (nothing is pickled). Where fork is not available, train inline.
    """
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods():
        try:
            _train_spm(files, tmp_prefix, config, repeats)
        except RuntimeError as error:
            _raise_for_sentencepiece(str(error), config)
        return
    import signal

    child = multiprocessing.get_context("fork").Process(target=_child_main, args=(files, tmp_prefix, config, os.getpid(), repeats), daemon=True)
    # A Ctrl-C between the fork and start() returning would leave a child we hold no handle to:
    # SIGINT is held back until start() is done, and a pending one is raised once it is released.
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        child.start()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        child.join()
    except BaseException:  # Ctrl-C, SIGTERM: the child's work is thrown away with the temp dir
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        if child.pid is not None:
            child.kill()
            child.join()
        raise
    error_file = Path(tmp_prefix + ".error")
    if error_file.exists():
        _raise_for_sentencepiece(error_file.read_text(), config)
    if child.exitcode != 0:
        raise InputError(f"sentencepiece training stopped (exit status {child.exitcode}); out of memory? try a smaller --input-sentence-size")


def _child_main(files: list[Path], tmp_prefix: str, config: TokenizerConfig, parent: int, repeats=None) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent answers Ctrl-C (and kills us)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # forked while the parent held it back
    die_with_parent(parent)  # a SIGKILL or SIGTERM of the parent leaves no trainer behind
    try:
        _train_spm(files, tmp_prefix, config, repeats)
    except Exception as error:  # reported by the parent as one line, never a child's traceback
        Path(tmp_prefix + ".error").write_text(str(error) or type(error).__name__)


def _train_spm(files: list[Path], tmp_prefix: str, config: TokenizerConfig, repeats: Optional[Sequence[int]] = None) -> None:
    # sentencepiece reads plain files only, and splits on its own idea of lines: feed it the lines
    # we read (\n only, \r stripped, .gz opened) through an iterator. With input_sentence_size it
    # keeps a uniform sample of that many (its reservoir, seeded): memory is bounded by the setting,
    # not by the corpus.
    if config.input_sentence_size:
        spm.set_random_generator_seed(config.seed)
    spm.SentencePieceTrainer.train(
        sentence_iterator=_text_lines(files, repeats),
        input_sentence_size=config.input_sentence_size,
        shuffle_input_sentence=True,
        model_prefix=tmp_prefix,
        vocab_size=config.vocab_size,
        model_type=config.model_type,
        character_coverage=config.character_coverage,
        byte_fallback=config.byte_fallback,
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
        num_threads=config.threads,
        max_sentence_length=1 << 16,
        minloglevel=2,
        hard_vocab_limit=True,
    )


def _text_lines(files: Sequence[Path], repeats: Optional[Sequence[int]] = None) -> Iterator[str]:
    """The non-empty lines of the files, streamed (each file's `repeats` times)."""
    for k, path in enumerate(files):
        for _ in range(repeats[k] if repeats else 1):
            for line in read_lines(Path(path), errors="replace"):
                if line.strip():
                    yield line


def _raise_for_sentencepiece(message: str, config: TokenizerConfig) -> None:
    """sentencepiece's errors, turned into advice."""
    if "Vocabulary size" in message or "vocab_size" in message:
        limit = re.search(r"<= *(\d+)", message)
        most = f"at most {limit.group(1)} pieces fit it" if limit else "it has too few distinct pieces"
        raise InputError(f"--vocab-size {config.vocab_size} is too large for this data ({most}); lower --vocab-size or add text")
    raise InputError(f"sentencepiece failed: {message.strip().splitlines()[-1] if message.strip() else 'no message'}")
