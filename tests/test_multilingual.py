"""Many pairs, one model (languages.py, training/multilingual.py): --corpus training with target tags
drawn per epoch in temperature shares, per-pair validation, --src-lang/--tgt-lang, the server's
/languages and target."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import numpy as np
import pytest

from seqtool.config import TokenizerConfig
from seqtool.data import Mixture, ParallelDataset
from seqtool.errors import ConfigError, InputError
from seqtool.languages import Corpus, Languages, pair_corpora, temperature_shares

from conftest import seqtool


def cli(*args, cwd, stdin=None):
    """The CLI as a user runs it, whatever its exit status."""
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "seqtool", *map(str, args)], cwd=cwd, input=stdin, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="2"))

LETTERS = "abcdefghij"
TRAIN = ("--arch", "tiny", "--pre-norm", "--dropout", "0", "--label-smoothing", "0", "--lr", "3e-3", "--warmup", "50",
         "--max-tokens", "800", "--threads", "2", "--vocab-size", "24")


def write_pairs(d: Path, n_train: int, n_valid: int, seed: int = 0) -> dict:
    """Three pairs over letter sequences, named as real languages (the server's detector needs real
    codes): es -> en reverses them, es -> de copies them, en -> es reverses them back. The tag
    alone tells es -> en from es -> de."""
    rng = random.Random(seed)
    tasks = {("es", "en"): lambda s: s[::-1], ("es", "de"): lambda s: list(s), ("en", "es"): lambda s: s[::-1]}
    out = {}
    for (src, tgt), task in tasks.items():
        for split, n in (("train", n_train), ("valid", n_valid), ("test", n_valid)):
            seqs = [[rng.choice(LETTERS) for _ in range(rng.randint(3, 8))] for _ in range(n)]
            (d / f"{src}{tgt}.{split}.{src}").write_text("\n".join(" ".join(s) for s in seqs) + "\n")
            (d / f"{src}{tgt}.{split}.{tgt}").write_text("\n".join(" ".join(task(s)) for s in seqs) + "\n")
            out[(src, tgt, split)] = ([" ".join(s) for s in seqs], [" ".join(task(s)) for s in seqs])
    return out


def corpus_args(d: Path, sizes=("es-en", "es-de", "en-es")) -> list[str]:
    args = []
    for pair in sizes:
        name = pair.replace("-", "")
        args += ["--corpus", f"{pair}:{d / name}.train", "--valid-corpus", f"{pair}:{d / name}.valid"]
    return args


@pytest.fixture(scope="module")
def multi(tmp_path_factory):
    """A tiny model trained on the three pairs (600 updates through the CLI)."""
    d = tmp_path_factory.mktemp("multi")
    texts = write_pairs(d, 1500, 40)
    seqtool("train", *corpus_args(d), "--save-dir", "run", *TRAIN, "--max-updates", "600", "--eval-bleu", cwd=d)
    return d, texts


# ---- unit ------------------------------------------------------------------------------------
@pytest.mark.unit
def test_corpus_arguments_and_their_one_line_errors():
    assert Corpus.parse("es-en:data/bible/train") == Corpus("es", "en", "data/bible/train")
    assert Corpus.parse("pt_BR-en:x").pair == "pt_BR-en"
    for bad, says in (("es-en", "SRC-TGT:PREFIX"), ("esen:x", "SRC-TGT:PREFIX"), ("es-es:x", "both 'es'"),
                      ("e1-en:x", "not a language code"), ("es-en:", "SRC-TGT:PREFIX")):
        with pytest.raises(ConfigError, match=says):
            Corpus.parse(bad)
    with pytest.raises(ConfigError, match="none for de-en"):
        pair_corpora(["es-en:a", "de-en:b"], ["es-en:c"])
    with pytest.raises(ConfigError, match="given twice"):
        pair_corpora(["es-en:a", "es-en:b"], ["es-en:c"])
    with pytest.raises(ConfigError, match="no --corpus of that pair"):
        pair_corpora(["es-en:a"], ["es-en:c", "fr-en:d"])


@pytest.mark.unit
def test_temperature_shares_go_from_proportional_to_uniform():
    sizes = [27000, 121000]
    assert temperature_shares(sizes, 1.0) == pytest.approx([27 / 148, 121 / 148])
    five = temperature_shares(sizes, 5.0)
    assert sum(five) == pytest.approx(1.0) and 27 / 148 < five[0] < 0.5  # the small pair gains, never past uniform
    assert temperature_shares(sizes, 1e6) == pytest.approx([0.5, 0.5], abs=1e-4)


@pytest.mark.unit
def test_languages_name_their_tags_and_refuse_what_they_lack():
    langs = Languages((("aa", "bb"), ("aa", "cc"), ("bb", "aa")), first_tag=40, shares=(0.3, 0.3, 0.4), temperature=5.0)
    assert langs.targets == ("aa", "bb", "cc") and langs.sources == ("aa", "bb")
    assert [langs.tag(t) for t in langs.targets] == [40, 41, 42]
    assert Languages.from_dict(langs.to_dict()) == langs
    assert langs.zero_shot("bb", "cc") and not langs.zero_shot("aa", "cc") and not langs.zero_shot("", "cc")
    with pytest.raises(InputError, match="--tgt-lang 'de': this model translates into aa, bb, cc"):
        langs.tag("de")
    with pytest.raises(InputError, match="trained on sources aa, bb"):
        langs.check_source("cc")
    assert "aa-bb 30.0%" in langs.describe() and "cc=42" in langs.describe()


@pytest.mark.unit
def test_a_mixture_leads_each_source_with_its_tag_and_draws_each_epoch_in_its_shares(small_corpus):
    a = ParallelDataset(small_corpus / "bin", "train")  # 300 pairs
    b = ParallelDataset(small_corpus / "bin", "valid")  # 20 pairs
    shares = temperature_shares([len(a), len(b)], 5.0)
    mix = Mixture([a, b], [100, 101], shares)
    first, again, second = mix.epoch(1, 1), mix.epoch(1, 1), mix.epoch(1, 2)
    n = len(a) + len(b)
    assert len(first.src) == n and len(first.tgt) == n
    tags = np.array([first.src[i][0] for i in range(n)])
    assert (tags == 101).sum() == round(n * shares[1]) > len(b)  # the small pair repeats its lines
    assert (tags == 100).sum() == round(n * shares[0]) < len(a)  # the large one leaves some out
    assert all(first.src[i][1:].tolist() in ([a.src[k].tolist() for k in range(len(a))] if tags[i] == 100 else
                                             [b.src[k].tolist() for k in range(len(b))]) for i in range(0, n, 37))
    assert np.array_equal(first.src.lengths, again.src.lengths) and not np.array_equal(first.src.index, second.src.index)


# ---- system: the CLI, on the model trained on three pairs --------------------------------------
@pytest.mark.system
def test_a_multilingual_run_records_its_pairs_and_validates_each(multi):
    d, _ = multi
    config = json.loads((d / "run" / "config.json").read_text())
    langs = Languages.from_dict(config["languages"])
    assert langs.pairs == (("es", "en"), ("es", "de"), ("en", "es")) and config["model"]["language_tags"] == 3
    assert config["model"]["vocab_size"] == langs.first_tag + 3 and sum(langs.shares) == pytest.approx(1.0)
    valid = [json.loads(line) for line in (d / "run" / "metrics.jsonl").read_text().splitlines() if '"valid"' in line]
    last = valid[-1]
    assert set(last["pairs"]) == {"es-en", "es-de", "en-es"}
    assert last["loss"] == pytest.approx(np.mean([p["loss"] for p in last["pairs"].values()]))  # best.pt by the mean
    assert last["bleu"] == pytest.approx(np.mean([p["bleu"] for p in last["pairs"].values()]))
    info = seqtool("info", "run/best.pt", cwd=d).stdout
    assert "es-en" in info and "target tags de=" in info and "temperature 1" in info


@pytest.mark.system
def test_the_target_tag_chooses_the_output_language(multi):
    d, texts = multi
    sources, reversed_ = texts[("es", "en", "test")]
    stdin = "\n".join(sources) + "\n"

    def translate(*options, check=True):
        run = seqtool if check else cli
        return run("translate", "-c", "run/best.pt", "--threads", "2", *options, cwd=d, stdin=stdin)

    into_en = translate("--tgt-lang", "en").stdout.splitlines()
    into_de = translate("--tgt-lang", "de", "--src-lang", "es").stdout.splitlines()
    assert sum(h == r for h, r in zip(into_en, reversed_)) >= 0.8 * len(sources)
    assert sum(h == s for h, s in zip(into_de, sources)) >= 0.8 * len(sources)  # copied, not reversed
    missing = translate(check=False)
    assert missing.returncode == 1 and "translates into de, en, es: choose one with --tgt-lang" in missing.stderr
    assert missing.stderr.count("\n") == 1 and missing.stdout == ""
    unknown = translate("--tgt-lang", "fr", check=False)
    assert unknown.returncode == 1 and "--tgt-lang 'fr': this model translates into de, en, es" in unknown.stderr
    zero = translate("--src-lang", "en", "--tgt-lang", "de")  # never trained: translated, with a warning
    assert "en -> de was not trained (zero-shot" in zero.stderr and len(zero.stdout.splitlines()) == len(sources)


@pytest.mark.integration
def test_text_that_looks_like_a_tag_never_becomes_one(multi):
    from seqtool.translate import Translator

    d, _ = multi
    t = Translator.load(d / "run" / "best.pt", tgt_lang="en", device="cpu")
    first = t.languages.first_tag
    for line in (">>de<< a b c", "<2de> a b", "__de__ a", ">>es<<"):
        ids = t.encode(0, [line])[0]
        assert ids[0] == t.languages.tag("en") and all(i < first for i in ids[1:])  # one tag: the chosen one
    assert all(not (set(h) & set(range(first, first + 3))) for h in
               (x.tokens for tr in t.translate_chunk(0, ["a b c", "j i h"]) for x in tr.hypotheses))  # never an output
    with pytest.raises(ConfigError, match="choose one with --tgt-lang"):
        Translator.load(d / "run" / "best.pt", device="cpu").translate("a b c")
    assert Translator.load(d / "run" / "best.pt", tgt_lang="de", device="cpu").translate("a b c") != t.translate("a b c")


@pytest.mark.system
def test_the_server_lists_languages_and_translates_into_the_requested_target(multi):
    import httpx

    from servers import Server

    d, texts = multi
    sources, reversed_ = texts[("es", "en", "test")]
    server = Server(d / "run" / "best.pt", "--max-len-a", "0", "--max-len-b", "40")
    base = server.url
    try:
        languages = httpx.get(f"{base}/languages").json()
        assert {l["code"]: l["targets"] for l in languages} == {"de": [], "en": ["de", "es"], "es": ["de", "en"]}
        got = httpx.post(f"{base}/translate", json={"q": sources[:10], "source": "es", "target": "en"}).json()["translatedText"]
        assert sum(g == r for g, r in zip(got, reversed_)) >= 8
        copied = httpx.post(f"{base}/v1/translate", json={"segments": sources[:10], "target": "de"}).json()["translations"]
        assert sum(c["text"] == s for c, s in zip(copied, sources)) >= 8
        # source "auto": LibreTranslate's detectedLanguage, among the model's sources (es, en: de is a target only)
        detected = httpx.post(f"{base}/detect", json={"q": "¿Dónde está la biblioteca de la ciudad?"}).json()
        assert detected[0]["language"] == "es" and 50 < detected[0]["confidence"] <= 100 and {d["language"] for d in detected} <= {"es", "en"}
        auto = httpx.post(f"{base}/translate", json={"q": ["Where is the library?", "¿Dónde está?"], "source": "auto", "target": "de"}).json()
        assert [d["language"] for d in auto["detectedLanguage"]] == ["en", "es"] and len(auto["translatedText"]) == 2
        assert "detectedLanguage" not in httpx.post(f"{base}/translate", json={"q": "a b", "source": "es", "target": "de"}).json()
        page = '<div class="the where is of and the"><p data-x="of the and">¿Dónde está la biblioteca de la ciudad?</p></div>'
        auto = httpx.post(f"{base}/translate", json={"q": page, "source": "auto", "target": "de", "format": "html"}).json()
        assert auto["detectedLanguage"]["language"] == "es"  # (detected on the page's text, not on its tags)
        start = time.monotonic()  # every size limit before any work: 150,000 short items (under the body cap) are refused before detecting one
        many = httpx.post(f"{base}/translate", content=json.dumps({"q": ["ja"] * 150_000, "source": "auto", "target": "de"}, separators=(",", ":")),
                              headers={"content-type": "application/json"},
                          timeout=120)
        assert many.status_code == 413 and "--max-lines" in many.json()["error"] and time.monotonic() - start < 10
        for body, says in (({"q": "a b", "source": "es"}, "target: required; this model translates into de, en, es"),
                           ({"q": "a b", "source": "es", "target": "fr"}, "target 'fr'"),
                           ({"q": "a b", "source": "zz", "target": "en"}, "source 'zz'")):
            answer = httpx.post(f"{base}/translate", json=body)
            assert answer.status_code == 400 and says in answer.json()["error"], answer.text
    finally:
        assert "Traceback" not in server.stop()


@pytest.mark.system
def test_one_corpus_is_a_one_pair_run_and_bad_corpora_are_one_line_errors(tmp_path):
    write_pairs(tmp_path, 60, 10)
    seqtool("train", *corpus_args(tmp_path, ("es-en",)), "--save-dir", "one", *TRAIN, "--max-updates", "1", cwd=tmp_path)
    config = json.loads((tmp_path / "one" / "config.json").read_text())
    assert "languages" not in config and config["model"]["language_tags"] == 0
    assert (config["train"]["src_lang"], config["train"]["tgt_lang"]) == ("es", "en")
    (tmp_path / "short.train.es").write_text("a b\nc d\n")
    (tmp_path / "short.train.de").write_text("A B\n")
    for args, says in (
        (["--corpus", f"es-en:{tmp_path}/none", "--corpus", f"es-de:{tmp_path}/esde.train",
          "--valid-corpus", f"es-en:{tmp_path}/esen.valid", "--valid-corpus", f"es-de:{tmp_path}/esde.valid"], "none.es"),
        (["--corpus", f"es-en:{tmp_path}/esen.train", "--corpus", f"es-de:{tmp_path}/short.train",
          "--valid-corpus", f"es-en:{tmp_path}/esen.valid", "--valid-corpus", f"es-de:{tmp_path}/esde.valid"], "short.train"),
        (["--corpus", f"es-en:{tmp_path}/esen.train", "--corpus", f"es-de:{tmp_path}/esde.train",
          "--valid-corpus", f"es-en:{tmp_path}/esen.valid"], "--valid-corpus: none for es-de"),
        (["--corpus", f"es-en:{tmp_path}/esen.train", "--src", "es"], "drop --src"),
    ):
        result = cli("train", *args, "--save-dir", "bad", *TRAIN, "--max-updates", "1", cwd=tmp_path)
        assert result.returncode == 1 and says in result.stderr and result.stderr.strip().count("\n") == 0, result.stderr


@pytest.mark.system
def test_an_export_takes_the_tags_as_tokens_and_decodes_as_seqtool_does(multi):
    import ctranslate2
    import sentencepiece

    from seqtool.export import export
    from seqtool.translate import Translator

    d, texts = multi
    out = export(d / "run" / "best.pt", d / "ct2")
    sp = sentencepiece.SentencePieceProcessor(model_file=str(out / "sentencepiece.model"))
    ct2 = ctranslate2.Translator(str(out), device="cpu", intra_threads=2)
    lines = texts[("es", "en", "test")][0][:20]
    for target in ("en", "de"):
        ours = Translator.load(d / "run" / "best.pt", tgt_lang=target, beam=1, device="cpu", precision="fp32", loop_guard=0).translate(lines)
        theirs = ct2.translate_batch([[f">>{target}<<", *sp.encode(x, out_type=str)] for x in lines], beam_size=1, max_decoding_length=40)
        assert [sp.decode(r.hypotheses[0]) for r in theirs] == ours


@pytest.mark.system
def test_binarize_makes_a_multilingual_data_dir_that_train_reads(tmp_path):
    write_pairs(tmp_path, 80, 10)
    seqtool("train-tokenizer", *(tmp_path.glob("*.train.*")), "--model-prefix", "spm", "--vocab-size", "24", cwd=tmp_path)
    seqtool("binarize", *corpus_args(tmp_path), "--tokenizer", "spm.model", "--out", "bin", cwd=tmp_path)
    meta = json.loads((tmp_path / "bin" / "meta.json").read_text())
    assert [f"{s}-{t}" for s, t in meta["languages"]["pairs"]] == ["es-en", "es-de", "en-es"] and meta["vocab_size"] == 24 + 3
    assert all((tmp_path / "bin" / pair / "meta.json").exists() for pair in ("es-en", "es-de", "en-es"))
    again = cli("binarize", *corpus_args(tmp_path), "--tokenizer", "spm.model", "--out", "bin", cwd=tmp_path)
    assert again.returncode == 1 and "already holds binarized data" in again.stderr
    seqtool("train", "bin", "--save-dir", "run", *TRAIN[:-2], "--max-updates", "2", cwd=tmp_path)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["model"]["language_tags"] == 3 and Languages.from_dict(config["languages"]).first_tag == 24


@pytest.mark.system
def test_finetuning_a_multilingual_model_keeps_its_tags_on_one_pair_or_a_new_pair(multi):
    d, texts = multi
    tags = Languages.from_dict(json.loads((d / "run" / "config.json").read_text())["languages"])
    seqtool("train", "--finetune", "run/best.pt", "--src", "es", "--tgt", "de", "--train", "esde.train", "--valid", "esde.valid",
            "--save-dir", "tuned-es-de", *TRAIN[:-2], "--max-updates", "5", "--lr", "1e-5", cwd=d)
    config = json.loads((d / "tuned-es-de" / "config.json").read_text())
    tuned = Languages.from_dict(config["languages"])
    assert tuned.pairs == tags.pairs and [tuned.tag(t) for t in tuned.targets] == [tags.tag(t) for t in tags.targets]
    assert dict(zip(tuned.pairs, tuned.shares)) == {("es", "en"): 0.0, ("es", "de"): 1.0, ("en", "es"): 0.0}
    assert config["model"]["language_tags"] == 3 and config["model"]["vocab_size"] == tags.first_tag + 3
    sources = texts[("es", "de", "test")][0][:10]
    out = seqtool("translate", "-c", "tuned-es-de/best.pt", "--tgt-lang", "de", cwd=d, stdin="\n".join(sources) + "\n").stdout
    assert sum(h == s for h, s in zip(out.splitlines(), sources)) >= 8  # still copies into de
    # a pair the model never trained on (en -> de: copies), into a target it has a tag for
    rows = texts[("en", "es", "train")][0][:300]
    for split, lines in (("train", rows), ("valid", rows[:20])):
        (d / f"ende.{split}.en").write_text("\n".join(lines) + "\n")
        (d / f"ende.{split}.de").write_text("\n".join(lines) + "\n")
    seqtool("train", "--finetune", "run/best.pt", "--corpus", f"en-de:{d}/ende.train", "--valid-corpus", f"en-de:{d}/ende.valid",
            "--save-dir", "tuned-en-de", *TRAIN[:-2], "--max-updates", "5", cwd=d)
    added = Languages.from_dict(json.loads((d / "tuned-en-de" / "config.json").read_text())["languages"])
    assert added.pairs == tags.pairs + (("en", "de"),) and added.tag("de") == tags.tag("de") and not added.zero_shot("en", "de")
    (d / "enfr.train.fr").write_text("\n".join(rows) + "\n")
    (d / "enfr.valid.fr").write_text("\n".join(rows[:20]) + "\n")
    for name in ("train", "valid"):
        (d / f"enfr.{name}.en").write_text((d / f"ende.{name}.en").read_text())
    lacking = cli("train", "--finetune", "run/best.pt", "--corpus", f"en-fr:{d}/enfr.train", "--valid-corpus", f"en-fr:{d}/enfr.valid",
                  "--save-dir", "tuned-en-fr", *TRAIN[:-2], "--max-updates", "5", cwd=d)
    assert lacking.returncode == 1 and "no tag for target 'fr' (it translates into de, en, es)" in lacking.stderr
    assert lacking.stderr.strip().count("\n") == 0
