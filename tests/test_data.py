"""Tokenizer, binarize and batching: ids round-trip, budgets hold, every pair once per epoch."""

import gzip
import json

import numpy as np
import pytest
import torch

from seqtool.binarize import SplitSpec, binarize
from seqtool.config import TokenizerConfig
from seqtool.data import ParallelDataset, collate, epoch_batches, make_batches, padded_length, read_meta, shard_batches
from seqtool.textio import InputError, read_lines
from seqtool.tokenizer import Tokenizer, train_tokenizer

from conftest import write_reverse_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    texts = write_reverse_corpus(d, 300, 40)
    model = train_tokenizer([d / "train.src", d / "train.tgt"], str(d / "spm"), TokenizerConfig(vocab_size=24))
    return d, texts, model


@pytest.mark.unit
def test_tokenizer_has_fixed_special_ids_and_round_trips(corpus):
    d, texts, model = corpus
    tok = Tokenizer.load(model)
    assert (tok.sp.pad_id(), tok.sp.unk_id(), tok.sp.bos_id(), tok.sp.eos_id()) == (0, 1, 2, 3)
    assert tok.vocab_size == 24
    line = texts["valid"][0][0]
    assert tok.decode(tok.encode(line)) == line
    assert (d / "spm.vocab").exists()


@pytest.mark.unit
def test_tokenizer_reads_gzip_and_samples(tmp_path):
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), rng.integers(3, 9))) for _ in range(300)]
    with gzip.open(tmp_path / "a.gz", "wt") as f:
        f.write("\n".join(" ".join(rng.choice(words, 6)) for _ in range(2000)) + "\n")
    model = train_tokenizer([tmp_path / "a.gz"], str(tmp_path / "m"), TokenizerConfig(vocab_size=100, input_sentence_size=500, model_type="unigram"))
    assert Tokenizer.load(model).vocab_size == 100


@pytest.mark.unit
def test_the_tokenizer_streams_its_text_and_sentencepiece_samples_it_reproducibly(tmp_path, monkeypatch):
    # memory is bounded by --input-sentence-size, not by the corpus: the lines reach sentencepiece as a
    # stream (never a list of the whole corpus), with its own sampling, seeded
    import seqtool.tokenizer as tk

    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), rng.integers(3, 9))) for _ in range(300)]
    (tmp_path / "a.txt").write_text("\n".join(" ".join(rng.choice(words, 6)) for _ in range(3000)) + "\n\n")
    config = TokenizerConfig(vocab_size=100, input_sentence_size=500, threads=1)
    seen = {}
    real = tk.spm.SentencePieceTrainer.train

    def spy(**kwargs):
        seen.update(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(tk, "_train_in_child", lambda files, prefix, cfg, repeats=None: tk._train_spm(files, prefix, cfg, repeats))  # in-process
    monkeypatch.setattr(tk.spm.SentencePieceTrainer, "train", spy)
    train_tokenizer([tmp_path / "a.txt"], str(tmp_path / "m1"), config)
    assert not isinstance(seen["sentence_iterator"], (list, tuple))  # a generator over the files
    assert seen["input_sentence_size"] == 500 and seen["shuffle_input_sentence"]
    train_tokenizer([tmp_path / "a.txt"], str(tmp_path / "m2"), config)
    pieces = [[t.sp.id_to_piece(i) for i in range(t.vocab_size)] for t in map(Tokenizer.load, (tmp_path / "m1.model", tmp_path / "m2.model"))]
    assert pieces[0] == pieces[1]  # the sample is seeded: the same pieces
    assert TokenizerConfig().input_sentence_size == 1_000_000  # bounded by default


@pytest.mark.unit
def test_vocab_too_large_gives_advice(tmp_path):
    (tmp_path / "t.txt").write_text("a b\n")
    with pytest.raises(InputError, match=r"--vocab-size 5000 is too large for this data \(at most \d+ pieces"):
        train_tokenizer([tmp_path / "t.txt"], str(tmp_path / "m"), TokenizerConfig(vocab_size=5000))


@pytest.mark.unit
def test_binarize_round_trips_ids(corpus, tmp_path):
    d, texts, model = corpus
    meta = binarize("src", "tgt", [SplitSpec("train", str(d / "train")), SplitSpec("valid", str(d / "valid"))], model, tmp_path / "bin", workers=1)
    assert meta["splits"]["train"]["lines"] == 300
    assert read_meta(tmp_path / "bin")["dtype"] == "uint16"
    tok = Tokenizer.load(model)
    ds = ParallelDataset(tmp_path / "bin", "train")
    for i in (0, 17, 299):
        assert ds.src[i].tolist() == tok.encode(texts["train"][0][i])
        assert ds.tgt[i].tolist() == tok.encode(texts["train"][1][i])
    assert (tmp_path / "bin" / "tokenizer.model").read_bytes() == model.read_bytes()


@pytest.mark.integration
def test_binarize_with_workers_gives_the_same_arrays(corpus, tmp_path):
    d, _, model = corpus
    splits = [SplitSpec("train", str(d / "train"))]
    binarize("src", "tgt", splits, model, tmp_path / "one", workers=1)
    binarize("src", "tgt", splits, model, tmp_path / "two", workers=2)
    for name in ("train.src.bin", "train.src.idx", "train.tgt.bin", "train.tgt.idx"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


@pytest.mark.unit
def test_binarize_refuses_unequal_line_counts_naming_both(corpus, tmp_path):
    d, _, model = corpus
    (tmp_path / "x.src").write_text("a b\nc d\nd e\n")
    (tmp_path / "x.tgt").write_text("b a\nd c\n")
    with pytest.raises(InputError) as error:
        binarize("src", "tgt", [SplitSpec("train", str(tmp_path / "x"))], model, tmp_path / "bin")
    message = str(error.value)
    assert "x.src has 3 lines" in message and "x.tgt has 2" in message
    assert not (tmp_path / "bin" / "meta.json").exists()
    assert not list((tmp_path / "bin").glob("*.bin"))  # no partial output left


@pytest.mark.unit
def test_binarize_reads_gzip_and_crlf(corpus, tmp_path):
    d, _, model = corpus
    with gzip.open(tmp_path / "g.src.gz", "wb") as f:
        f.write(b"a b c\r\nd e\r\n")
    (tmp_path / "g.tgt").write_bytes(b"c b a\nd\xe2\x80\xa8e\n")  # U+2028 inside a line stays text
    binarize("src", "tgt", [SplitSpec("train", str(tmp_path / "g"))], model, tmp_path / "bin")
    ds = ParallelDataset(tmp_path / "bin", "train")
    tok = Tokenizer.load(model)
    assert len(ds) == 2
    assert ds.src[0].tolist() == tok.encode("a b c")


@pytest.mark.unit
def test_binarize_never_overwrites_without_force(corpus, tmp_path):
    d, _, model = corpus
    splits = [SplitSpec("valid", str(d / "valid"))]
    binarize("src", "tgt", splits, model, tmp_path / "bin")
    with pytest.raises(InputError, match="--force"):
        binarize("src", "tgt", splits, model, tmp_path / "bin")
    binarize("src", "tgt", splits, model, tmp_path / "bin", force=True)


@pytest.mark.unit
def test_lines_end_at_newline_only(tmp_path):
    (tmp_path / "t").write_bytes(b"one\rtwo\x85\xc2\x85x\r\n\nthree")
    with pytest.raises(InputError, match=r"t:1: invalid UTF-8"):
        list(read_lines(tmp_path / "t"))
    (tmp_path / "u").write_bytes("one\rtwo\u2028x\u0085y\r\n\nthree".encode())
    assert list(read_lines(tmp_path / "u")) == ["one\rtwo\u2028x\u0085y", "", "three"]


@pytest.mark.unit
def test_batches_respect_the_budget_and_cover_every_pair_once():
    rng = np.random.default_rng(0)
    src_len = rng.integers(1, 60, 2000)
    tgt_len = rng.integers(1, 60, 2000)
    for seed in (1, 2):
        batches = make_batches(src_len, tgt_len, 500, seed)
        for b in batches:
            assert len(b) * max(src_len[b].max(), tgt_len[b].max()) <= 500
        ids = np.sort(np.concatenate(batches))
        assert ids.tolist() == list(range(2000))
    a = make_batches(src_len, tgt_len, 500, 1)
    b = make_batches(src_len, tgt_len, 500, 1)
    c = make_batches(src_len, tgt_len, 500, 2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))  # seeded: reproducible
    assert not all(len(x) == len(y) and np.array_equal(x, y) for x, y in zip(a, c))  # reshuffled per epoch


@pytest.mark.unit
def test_padded_batches_count_their_padding_and_stay_within_positions():
    rng = np.random.default_rng(0)
    src_len = rng.integers(1, 59, 2000)  # none past the limit (epoch_batches skips those)
    tgt_len = rng.integers(1, 59, 2000)
    batches = make_batches(src_len, tgt_len, 500, 1, multiple=8, limit=58)
    for b in batches:
        width = int(padded_length(max(src_len[b].max(), tgt_len[b].max()), 8, 58))
        assert width % 8 == 0 or width == 58
        assert len(b) == 1 or len(b) * width <= 500
    assert np.sort(np.concatenate(batches)).tolist() == list(range(2000))
    assert padded_length(57, 8, 58) == 58 and padded_length(59, 8, 58) == 59  # never shorter than the length
    assert padded_length(np.array([1, 8, 9]), 8).tolist() == [8, 8, 16]


@pytest.mark.unit
def test_too_long_pairs_are_skipped_and_counted(corpus, tmp_path):
    d, _, model = corpus
    binarize("src", "tgt", [SplitSpec("train", str(d / "train"))], model, tmp_path / "bin")
    ds = ParallelDataset(tmp_path / "bin", "train")
    longest = int(max(ds.src.lengths.max(), ds.tgt.lengths.max())) + 1
    batches, skipped = epoch_batches(ds, 4096, longest - 1, seed=1, epoch=1)
    n_long = int((np.maximum(ds.src.lengths, ds.tgt.lengths) + 1 > longest - 1).sum())
    assert skipped == n_long > 0
    assert sum(len(b) for b in batches) == len(ds) - n_long


@pytest.mark.unit
def test_ranks_get_equal_disjoint_shares():
    batches = [np.array([i]) for i in range(11)]
    shares = [shard_batches(batches, r, 3) for r in range(3)]
    assert [len(s) for s in shares] == [3, 3, 3]
    seen = np.concatenate([np.concatenate(s) for s in shares])
    assert len(set(seen.tolist())) == 9


@pytest.mark.unit
def test_collate_adds_bos_and_eos_and_pads_right(corpus, tmp_path):
    d, _, model = corpus
    binarize("src", "tgt", [SplitSpec("valid", str(d / "valid"))], model, tmp_path / "bin")
    ds = ParallelDataset(tmp_path / "bin", "valid")
    b = collate(ds, np.array([0, 1]), pad=0, bos=2, eos=3)
    for row, i in enumerate((0, 1)):
        t = ds.tgt[i].tolist()
        assert b.tgt_in[row, : len(t) + 1].tolist() == [2] + t
        assert b.tgt_out[row, : len(t) + 1].tolist() == t + [3]
        assert b.src[row, : len(ds.src[i]) + 1].tolist() == ds.src[i].tolist() + [3]
    assert b.ntokens == sum(len(ds.tgt[i]) + 1 for i in (0, 1))
    assert b.src.shape[1] % 8 == 0 and b.tgt_in.shape[1] % 8 == 0  # shape buckets: LENGTH_MULTIPLE
    assert int(b.tgt_out.ne(0).sum()) == b.ntokens  # the extra positions are padding
    exact = collate(ds, np.array([0, 1]), pad=0, bos=2, eos=3, multiple=1)
    assert exact.tgt_in.shape[1] == max(len(ds.tgt[i]) for i in (0, 1)) + 1
    assert torch.equal(b.tgt_in[:, : exact.tgt_in.shape[1]], exact.tgt_in)
    capped = collate(ds, np.array([0, 1]), pad=0, bos=2, eos=3, max_positions=exact.tgt_in.shape[1])
    assert capped.tgt_in.shape[1] == exact.tgt_in.shape[1]


@pytest.mark.unit
def test_meta_records_what_the_data_is(corpus, tmp_path):
    d, _, model = corpus
    binarize("src", "tgt", [SplitSpec("valid", str(d / "valid"))], model, tmp_path / "bin")
    meta = json.loads((tmp_path / "bin" / "meta.json").read_text())
    assert meta["src_lang"] == "src" and meta["tgt_lang"] == "tgt" and meta["vocab_size"] == 24
    assert len(meta["tokenizer_sha256"]) == 64
    meta["format_version"] = 99
    (tmp_path / "bin" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(InputError, match="format version 99"):
        read_meta(tmp_path / "bin")


@pytest.mark.unit
def test_empty_split_is_refused_and_leaves_nothing(corpus, tmp_path):
    d, _, model = corpus
    (tmp_path / "e.src").write_text("")
    (tmp_path / "e.tgt").write_text("")
    with pytest.raises(InputError, match="e.src: empty file"):
        binarize("src", "tgt", [SplitSpec("train", str(tmp_path / "e"))], model, tmp_path / "bin")
    assert not (tmp_path / "bin").exists()  # the directory it created is gone too
