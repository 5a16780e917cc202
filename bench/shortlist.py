#!/usr/bin/env python
"""A lexical shortlist (issue 29): would computing the output layer over a per-batch set of likely
target tokens make the student decode >= 10% faster? Measured here on a prototype; seqtool ships
no shortlist because it does not (bench/results.md, "shortlist").

    python bench/shortlist.py --data runs/demo/data --checkpoint runs/demo/best.pt

- the table: per source token, its top K target tokens by Dice co-occurrence over the training
  pairs of DATA_DIR (Marian's shortlists use fast_align's lexical table; co-occurrence is the
  alignment-free stand-in), plus the F most frequent target tokens and the special ids;
- per batch (the test lines sorted by length, as translate packs them): the union of the table
  rows of its source tokens; reported: its mean size against the vocabulary, and the share of
  reference target tokens it holds (what the search could still choose);
- speed: greedy decoding with the student preset's shape (random weights, the checkpoint's
  vocabulary, every output forced to 40 tokens, the first 1,000 test lines), the output layer over
  the union (its rows gathered once per batch, the result written into a -inf row of the full
  vocabulary, so the search is unchanged) against the full layer; fp32, bf16 and int8; best of 3.

Prints the CPU capability and a markdown table (appended to bench/results.md unless --no-results).
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from seqtool import checkpoint  # noqa: E402
from seqtool.config import DecodeConfig, ModelConfig, SearchOptions  # noqa: E402
from seqtool.data import ParallelDataset  # noqa: E402
from seqtool.device import cpu_capability  # noqa: E402
from seqtool.kernels import Int8Linear, linear  # noqa: E402
from seqtool.model import Transformer  # noqa: E402
from seqtool.precision import quantize_int8  # noqa: E402
from seqtool.tokenizer import Tokenizer  # noqa: E402
from seqtool.translate import Translator  # noqa: E402

SPECIALS = 4  # pad, unk, bos, eos: always in the shortlist


def dice_table(data: Path, vocab: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(vocab, k) target ids per source id by Dice co-occurrence (-1 where fewer), and target counts."""
    ds = ParallelDataset(data, "train")
    src_count, tgt_count = np.zeros(vocab, np.int64), np.zeros(vocab, np.int64)
    parts, chunk = [], []
    for i in range(len(ds)):
        s, t = np.unique(np.asarray(ds.src[i], np.int64)), np.unique(np.asarray(ds.tgt[i], np.int64))
        src_count[s] += 1
        tgt_count[t] += 1
        chunk.append((s[:, None] * vocab + t[None, :]).ravel())  # each pair once per sentence
        if len(chunk) == 4000 or i == len(ds) - 1:
            parts.append(np.unique(np.concatenate(chunk), return_counts=True))
            chunk = []
    codes = np.concatenate([c for c, _ in parts])
    counts = np.concatenate([n for _, n in parts])
    order = np.argsort(codes, kind="stable")
    codes, counts = codes[order], counts[order]
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    pairs, together = codes[starts], np.add.reduceat(counts, starts)
    s_ids, t_ids = pairs // vocab, pairs % vocab
    dice = 2 * together / (src_count[s_ids] + tgt_count[t_ids])
    order = np.lexsort((-dice, s_ids))
    s_ids, t_ids = s_ids[order], t_ids[order]
    first = np.flatnonzero(np.r_[True, s_ids[1:] != s_ids[:-1]])
    table = np.full((vocab, k), -1, np.int64)
    for a, z in zip(first, np.r_[first[1:], len(s_ids)]):
        row = t_ids[a:min(z, a + k)]
        table[s_ids[a], : len(row)] = row
    return table, tgt_count


def union(table: np.ndarray, frequent: np.ndarray, src_ids: np.ndarray) -> np.ndarray:
    rows = table[np.unique(src_ids)].ravel()
    return np.unique(np.concatenate([rows[rows >= 0], frequent, np.arange(SPECIALS)]))


def coverage(data: Path, table, frequent, batch: int, vocab: int) -> tuple[float, float]:
    """Mean union size and the share of reference tokens inside it, over valid batches of `batch` lines."""
    ds = ParallelDataset(data, "valid")
    order = np.argsort([len(ds.src[i]) for i in range(len(ds))], kind="stable")
    sizes, held, total = [], 0, 0
    for j in range(0, len(order), batch):
        rows = order[j : j + batch]
        ids = union(table, frequent, np.concatenate([np.asarray(ds.src[r], np.int64) for r in rows]))
        sizes.append(len(ids))
        inside = np.zeros(vocab, bool)
        inside[ids] = True
        for r in rows:
            t = np.asarray(ds.tgt[r], np.int64)
            held, total = held + int(inside[t].sum()), total + len(t)
    return float(np.mean(sizes)), held / max(total, 1)


class Shortlisted:
    """The prototype: Transformer.encode sees each batch's source ids and takes their union;
    Transformer.decode with a cache computes the output layer over it alone."""

    def __init__(self, table, frequent):
        self.table, self.frequent, self.on, self.sizes = table, frequent, False, []
        self.vocab = self.layer = self.buffer = None
        encode, decode = Transformer.encode, Transformer.decode
        proto = self

        def encode_(model, src, need_weights=False):
            if proto.on:
                proto.vocab = torch.from_numpy(union(proto.table, proto.frequent, src.flatten().numpy()))
                proto.layer = proto.buffer = None
                proto.sizes.append(len(proto.vocab))
            return encode(model, src, need_weights)

        def decode_(model, tgt_in, memory, src_pad, cache=None):
            if not proto.on or cache is None:
                return decode(model, tgt_in, memory, src_pad, cache)
            x = model.decode_features(tgt_in, memory, src_pad, cache)
            if proto.layer is None:
                proto.layer = proto.rows(model.output)
            small = linear(x, proto.layer)  # (B, T, K)
            n = small.shape[0] * small.shape[1]
            if proto.buffer is None or proto.buffer.shape[0] < n:  # -inf outside the shortlist, written once a batch
                proto.buffer = small.new_full((n, model.config.vocab_size), -math.inf)
            full = proto.buffer[:n]
            full.index_copy_(1, proto.vocab, small.reshape(n, -1))
            return full.view(*small.shape[:-1], -1)

        Transformer.encode, Transformer.decode = encode_, decode_

    def rows(self, out):
        if isinstance(out, Int8Linear):
            layer = Int8Linear(torch.zeros(len(self.vocab), out.in_features), None)
            layer.weight_t = out.weight_t[:, self.vocab].contiguous()
            layer.weight_scale = out.weight_scale[self.vocab]
            return layer
        layer = torch.nn.Linear(out.in_features, len(self.vocab), bias=False).to(out.weight.dtype)
        layer.weight.data = out.weight[self.vocab].contiguous()
        return layer


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="a DATA_DIR (train and valid splits), e.g. SAVE_DIR/data of a raw-file run")
    p.add_argument("--checkpoint", type=Path, required=True, help="a checkpoint of that data: its vocabulary and tokenizer")
    p.add_argument("--test", type=Path, default=REPO / "data" / "bible-es-en" / "test.es.gz")
    p.add_argument("--k", type=int, nargs="+", default=[10, 50, 100])
    p.add_argument("--frequent", type=int, default=100)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64, 256])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-results", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    ckpt = checkpoint.load(a.checkpoint)
    config = ModelConfig.from_dict(ckpt["model_config"])
    V = config.vocab_size
    tables = {k: dice_table(a.data, V, k) for k in a.k}
    lines = []
    for k in a.k:
        table, counts = tables[k]
        frequent = np.argsort(-counts)[: a.frequent]
        for b in a.batch:
            size, held = coverage(a.data, table, frequent, b, V)
            lines.append(f"| coverage | K {k} + {a.frequent} frequent | {b} | — | {size:,.0f} ({size / V:.0%}) | {held:.1%} | — | — |")
            print(lines[-1], flush=True)
    # speed: the student preset's shape, random weights
    student = config.replace(d_model=256, n_heads=4, d_ff=1024, encoder_layers=4, decoder_layers=1, dropout=0.0)
    opener = gzip.open if a.test.suffix == ".gz" else open
    with opener(a.test, "rt", encoding="utf-8") as fh:
        test = fh.read().splitlines()[:1000]
    k = 50 if 50 in tables else a.k[0]
    table, counts = tables[k]
    proto = Shortlisted(table, np.argsort(-counts)[: a.frequent])
    for precision in ("fp32", "bf16", "int8"):
        torch.manual_seed(0)
        model = Transformer(student).eval()
        model = quantize_int8(model) if precision == "int8" else model.to(torch.bfloat16) if precision == "bf16" else model
        for b in (64, 256):
            translator = Translator(model, Tokenizer(checkpoint.tokenizer_bytes(ckpt)), DecodeConfig(batch_size=b), torch.device("cpu"),
                                    options=SearchOptions(beam=1, min_len=40, max_len=40, loop_guard=0))
            translator.translate_chunk(0, test[:64])
            best = {}
            for _ in range(3):
                for on in (False, True):
                    proto.on, proto.sizes = on, []
                    t0 = time.perf_counter()
                    translator.translate_chunk(0, test)
                    best[on] = min(best.get(on, math.inf), time.perf_counter() - t0)
            size = float(np.mean(proto.sizes))
            lines.append(f"| speed | K {k} + {a.frequent} frequent | {b} | {precision} | {size:,.0f} ({size / V:.0%}) | — | "
                         f"{len(test) / best[False]:,.0f} / {len(test) / best[True]:,.0f} | {best[False] / best[True]:.2f}x |")
            print(lines[-1], flush=True)
    head = (f"## shortlist, {datetime.datetime.now():%Y-%m-%d %H:%M}, CPU {cpu_capability()}, {a.threads} threads, "
            f"vocabulary {V:,} ({a.checkpoint}), student shape 4+1 d 256 (random weights, greedy, 40 tokens forced)\n\n"
            "| what | table | lines a batch | precision | shortlist: mean ids (of the vocabulary) | reference tokens inside | "
            "sentences/s full / shortlisted | speed-up |\n|---|---|---|---|---|---|---|---|\n")
    table_md = head + "\n".join(lines) + "\n"
    print(table_md)
    if not a.no_results:
        with open(REPO / "bench" / "results.md", "a", encoding="utf-8") as fh:
            fh.write("\n" + table_md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
