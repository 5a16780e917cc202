"""Reading binarized data and forming batches.

Owns the memory-mapped dataset of a DATA_DIR split (opening it costs the same for ten thousand or
a hundred million lines), token-budget batches of length-bucketed pairs, the per-epoch seeded
shuffle, the split of every epoch's batches across ranks, and collation into padded tensors.
It never sees the tokenizer: ids only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from .errors import InputError

# The DATA_DIR format (binarize writes it, this module reads it): meta.json with format_version,
# languages, vocabulary size, token dtype and per-split counts; for each split and language a flat
# token array SPLIT.LANG.bin and its int64 offsets SPLIT.LANG.idx (n + 1 entries).
FORMAT_VERSION = 1


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else int32."""
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.int32)


def shard_paths(data_dir: Path, split: str, lang: str) -> tuple[Path, Path]:
    """The token array and offsets of one side of one split."""
    return Path(data_dir) / f"{split}.{lang}.bin", Path(data_dir) / f"{split}.{lang}.idx"


def read_meta(data_dir: Path) -> dict:
    data_dir = Path(data_dir)
    path = data_dir / "meta.json"
    if not path.exists():
        raise InputError(f"{data_dir}: no meta.json; create the data directory with seqtool binarize")
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise InputError(f"{path}: unreadable ({error})") from None
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise InputError(f"{path}: data format version {version}, this seqtool reads version {FORMAT_VERSION}; binarize the data again")
    return meta


class TokenArray:
    """One side of one split: sequence i is bin[idx[i]:idx[i+1]]."""

    def __init__(self, path_bin: Path, path_idx: Path, dtype: str):
        for p in (path_bin, path_idx):
            if not p.exists():
                raise InputError(f"{p}: missing from the data directory; binarize again")
        self.offsets = np.memmap(path_idx, dtype=np.int64, mode="r")
        size = path_bin.stat().st_size
        self.tokens = np.memmap(path_bin, dtype=np.dtype(dtype), mode="r") if size else np.zeros(0, dtype=dtype)
        if self.offsets[-1] != len(self.tokens):
            raise InputError(f"{path_bin}: holds {len(self.tokens)} tokens but {path_idx} expects {self.offsets[-1]}; the data directory is damaged")
        self.lengths = np.diff(self.offsets).astype(np.int64)  # (N,)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        return np.asarray(self.tokens[self.offsets[i] : self.offsets[i + 1]])


class ParallelDataset:
    def __init__(self, data_dir: Path, split: str, meta: Optional[dict] = None):
        data_dir = Path(data_dir)
        meta = meta or read_meta(data_dir)
        if split not in meta["splits"]:
            raise InputError(f"{data_dir}: has no {split!r} split (it has {', '.join(meta['splits'])})")
        s, t, dtype = meta["src_lang"], meta["tgt_lang"], meta["dtype"]
        self.src = TokenArray(*shard_paths(data_dir, split, s), dtype)
        self.tgt = TokenArray(*shard_paths(data_dir, split, t), dtype)
        if len(self.src) != len(self.tgt):
            raise InputError(f"{data_dir}: split {split!r} has {len(self.src)} source but {len(self.tgt)} target lines; binarize again")

    def __len__(self) -> int:
        return len(self.src)

    @classmethod
    def joined(cls, parts: Sequence["ParallelDataset"]) -> "ParallelDataset":
        """The pairs of `parts` one after another, read as one dataset (training on two target
        sides of one source: a teacher's translations and the references)."""
        out = cls.__new__(cls)
        out.src, out.tgt = _Joined([p.src for p in parts]), _Joined([p.tgt for p in parts])
        return out


class _Joined:
    """Token arrays one after another, read as one (sequence i of the whole)."""

    def __init__(self, arrays: Sequence[TokenArray]):
        self.arrays = list(arrays)
        self.lengths = np.concatenate([a.lengths for a in self.arrays])  # (N,)
        self.starts = np.cumsum([0] + [len(a) for a in self.arrays])

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        return self.arrays[k][int(i - self.starts[k])]


class _Tagged:
    """Token arrays with one id in front of every sequence: a source side led by its target-language
    tag (languages.py)."""

    def __init__(self, array, tag: int):
        self.array, self.tag = array, np.asarray([tag], dtype=np.int64)  # (a tag may be past uint16's ids)
        self.lengths = array.lengths + 1

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        return np.concatenate([self.tag, self.array[i]])


class _Indexed:
    """The sequences of an array at `index` (repeats allowed): one epoch's sample of a mixture."""

    def __init__(self, array, index: np.ndarray):
        self.array, self.index = array, index
        self.lengths = array.lengths[index]

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.array[int(self.index[i])]


def tagged(dataset: ParallelDataset, tag: int) -> ParallelDataset:
    """dataset with `tag` in front of every source sequence."""
    out = ParallelDataset.__new__(ParallelDataset)
    out.src, out.tgt = _Tagged(dataset.src, tag), dataset.tgt
    return out


class Mixture:
    """Several pairs' training sets, each source led by its target-language tag, drawn anew every
    epoch in the given shares (languages.temperature_shares): an epoch holds as many pairs as all
    the sets together, a pair with a share above its size repeats lines, one below it leaves some
    out (different ones each epoch). Draws are seeded by (seed, epoch): every rank, and a resumed
    run, sees the same epoch."""

    def __init__(self, parts: Sequence[ParallelDataset], tags: Sequence[int], shares: Sequence[float]):
        self.sizes = [len(p) for p in parts]
        self.shares = list(shares)
        self.joined = ParallelDataset.joined([tagged(p, t) for p, t in zip(parts, tags)])
        self.starts = np.cumsum([0] + self.sizes)

    def epoch(self, seed: int, epoch: int) -> ParallelDataset:
        rng = np.random.default_rng([seed, epoch])
        total = sum(self.sizes)
        index = []
        for k, (n, share) in enumerate(zip(self.sizes, self.shares)):
            m = int(round(total * share)) if n else 0
            whole, rest = divmod(m, n) if n else (0, 0)
            index += [np.tile(np.arange(n), whole), rng.choice(n, rest, replace=False)]
            index[-2:] = [part + self.starts[k] for part in index[-2:]]
        chosen = np.concatenate(index).astype(np.int64)
        out = ParallelDataset.__new__(ParallelDataset)
        out.src, out.tgt = _Indexed(self.joined.src, chosen), _Indexed(self.joined.tgt, chosen)
        return out


def length_profile(lengths: np.ndarray) -> dict[str, int]:
    """What a split's line lengths (tokens) look like: the median, 90th, 99th percentile and the
    longest. A checkpoint keeps its training source's, so translate knows which lines are longer
    than anything the model learnt from (--split-sentences auto)."""
    if len(lengths) == 0:
        return {}
    p50, p90, p99 = np.percentile(lengths, [50, 90, 99]).round().astype(int).tolist()
    return {"p50": p50, "p90": p90, "p99": p99, "max": int(lengths.max()), "lines": int(len(lengths))}


@dataclass
class Batch:
    ids: np.ndarray  # (B,) dataset indices
    src: "object"  # torch (B, S) with EOS
    tgt_in: "object"  # (B, T) BOS + target
    tgt_out: "object"  # (B, T) target + EOS
    ntokens: int  # non-pad target tokens (incl. EOS)


LENGTH_MULTIPLE = 8
"""Batches are padded to a multiple of 8 positions (source and target alike). Training then sees a
few dozen tensor shapes an epoch instead of a few hundred, so oneDNN finds its matmul primitives in
its cache instead of creating them again, and the C allocator gets back blocks of the sizes it
just freed instead of carving new ones. Measured on the cpu-small protocol settings (bf16, 70 s,
2 threads, bench/results.md): target tokens/s +8% despite ~10% more padded positions, peak RSS -13%."""


def padded_length(length, multiple: int = LENGTH_MULTIPLE, limit: int = 0):
    """length rounded up to a multiple, but never past limit (the model's positions) unless length
    itself is; for ints and integer arrays alike."""
    rounded = -(-length // multiple) * multiple
    return np.minimum(rounded, np.maximum(limit, length)) if limit else rounded


def make_batches(src_len: np.ndarray, tgt_len: np.ndarray, max_tokens: int, seed: Optional[int],
                 max_sentences: int = 0, multiple: int = 1, limit: int = 0) -> list[np.ndarray]:
    """Length-bucketed batches whose cost sentences x max(padded source, padded target length)
    stays within max_tokens (padding counted, fairseq's rule); lengths padded as
    padded_length(length, multiple, limit) (collate pads to the same).

    Lengths include the EOS/BOS the collater adds. Pairs are sorted by length (random tie-break
    when seed is given, so batches differ between epochs); batch order is shuffled with the seed.
    A pair longer than max_tokens on its own cannot fit: the caller filters those first.
    """
    n = len(src_len)
    cost = padded_length(np.maximum(src_len, tgt_len), multiple, limit)
    if seed is None:
        order = np.lexsort((src_len, tgt_len))
    else:
        rng = np.random.default_rng(seed)
        order = np.lexsort((rng.random(n), src_len, tgt_len))
    batches: list[np.ndarray] = []
    start, width = 0, 0
    for pos in range(n):
        i = order[pos]
        w = max(width, int(cost[i]))
        size = pos - start + 1
        if size > 1 and (w * size > max_tokens or (max_sentences and size > max_sentences)):
            batches.append(order[start:pos])
            start, w = pos, int(cost[i])
        width = w
    if start < n:
        batches.append(order[start:n])
    if seed is not None:
        perm = np.random.default_rng(seed + 1).permutation(len(batches))
        batches = [batches[k] for k in perm]
    return batches


def shard_batches(batches: list[np.ndarray], rank: int, world: int) -> list[np.ndarray]:
    """Each rank's share of an epoch; every rank gets the same number (the tail is dropped to
    the next multiple of world only when world > 1, and those pairs come back next epoch)."""
    if world == 1:
        return batches
    usable = len(batches) - len(batches) % world
    return batches[rank:usable:world]


def collate(dataset: ParallelDataset, ids: np.ndarray, pad: int, bos: int, eos: int, max_positions: int = 0,
            multiple: int = LENGTH_MULTIPLE):
    """Padded tensors for one batch: src + EOS, BOS + tgt, tgt + EOS (right padding), each padded to
    a multiple of `multiple` positions (not past max_positions, where given)."""
    import torch

    srcs = [dataset.src[i] for i in ids]
    tgts = [dataset.tgt[i] for i in ids]
    B = len(ids)
    S = int(padded_length(max(len(s) for s in srcs) + 1, multiple, max_positions))
    T = int(padded_length(max(len(t) for t in tgts) + 1, multiple, max_positions))
    src = np.full((B, S), pad, dtype=np.int64)
    tgt_in = np.full((B, T), pad, dtype=np.int64)
    tgt_out = np.full((B, T), pad, dtype=np.int64)
    for b, (s, t) in enumerate(zip(srcs, tgts)):
        src[b, : len(s)] = s
        src[b, len(s)] = eos
        tgt_in[b, 0] = bos
        tgt_in[b, 1 : len(t) + 1] = t
        tgt_out[b, : len(t)] = t
        tgt_out[b, len(t)] = eos
    ntokens = int(sum(len(t) + 1 for t in tgts))
    return Batch(ids, torch.from_numpy(src), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out), ntokens)


def min_pair_length(dataset: ParallelDataset) -> int:
    """Cost of the cheapest pair (with EOS/BOS): the smallest token budget that trains anything."""
    return int(np.maximum(dataset.src.lengths, dataset.tgt.lengths).min()) + 1 if len(dataset) else 0


def epoch_batches(dataset: ParallelDataset, max_tokens: int, max_positions: int, seed: int, epoch: int,
                  rank: int = 0, world: int = 1, shuffle: bool = True) -> tuple[list[np.ndarray], int]:
    """This rank's batches for an epoch, and how many pairs were skipped as too long."""
    src_len = dataset.src.lengths + 1
    tgt_len = dataset.tgt.lengths + 1
    fits = (np.maximum(src_len, tgt_len) <= min(max_positions, max_tokens))
    skipped = int((~fits).sum())
    keep = np.nonzero(fits)[0]
    batches = make_batches(src_len[keep], tgt_len[keep], max_tokens, seed * 100003 + epoch if shuffle else None,
                           multiple=LENGTH_MULTIPLE, limit=max_positions)
    batches = [keep[b] for b in batches]
    return shard_batches(batches, rank, world), skipped

