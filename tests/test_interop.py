"""transformers' Marian format (interop.py): `seqtool import` of a MarianMTModel directory, and
`seqtool export --format huggingface` of a seqtool model. Nothing is downloaded: the Marian models
are built here with transformers' own classes (random weights, drawn wide enough that no two
logits tie), with source and target sentencepiece models trained on the bundled bible."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from conftest import seqtool

BIBLE = Path(__file__).resolve().parents[1] / "data" / "bible-es-en"


def bible(split: str, lang: str, n: int) -> list[str]:
    with gzip.open(BIBLE / f"{split}.{lang}.gz", "rt", encoding="utf-8") as fh:
        return [next(fh).strip() for _ in range(n)]


def cli(*args, cwd):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "seqtool", *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS="2"))


@pytest.fixture(scope="module")
def spms(tmp_path_factory) -> Path:
    """source.spm (Spanish) and target.spm (English), 300 pieces each, with Marian's special ids
    (unk 0, bos 1, eos 2: sentencepiece's own defaults), and vocab.json over both: </s> 0, <unk> 1,
    the pieces, <pad> last, as OPUS-MT's are laid out."""
    import sentencepiece as spm

    d = tmp_path_factory.mktemp("spm")
    for side, lang in (("source", "es"), ("target", "en")):
        (d / f"{lang}.txt").write_text("\n".join(bible("train", lang, 3000)) + "\n", encoding="utf-8")
        spm.SentencePieceTrainer.train(input=str(d / f"{lang}.txt"), model_prefix=str(d / side), vocab_size=300,
                                       model_type="unigram", minloglevel=2)
        (d / f"{side}.model").rename(d / f"{side}.spm")
    pieces = ["</s>", "<unk>"]
    for side in ("source", "target"):
        sp = spm.SentencePieceProcessor(model_file=str(d / f"{side}.spm"))
        pieces += [p for p in (sp.id_to_piece(i) for i in range(sp.get_piece_size())) if p not in pieces and p not in ("<s>",)]
    pieces.append("<pad>")
    (d / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}, ensure_ascii=False))
    return d


def marian_dir(spms: Path, out: Path, seed: int = 0, **config) -> Path:
    """A random MarianMTModel saved as transformers saves one, with spms' tokenizer files."""
    import shutil

    from transformers import MarianConfig, MarianMTModel

    vocab = json.loads((spms / "vocab.json").read_text())
    V = len(vocab)
    settings = dict(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                    decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
                    activation_function="swish", scale_embedding=True, pad_token_id=V - 1, eos_token_id=0,
                    decoder_start_token_id=V - 1, forced_eos_token_id=0, dropout=0.0)
    settings.update(config)
    torch.manual_seed(seed)
    model = MarianMTModel(MarianConfig(**settings)).eval()
    with torch.no_grad():  # wide weights: logits far apart, so float rounding never decides an argmax
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if name.endswith("weight") else 0.0))
            elif "embed_positions" not in name:
                p.normal_(0.0, 0.25)
        bias = torch.randn(1, V) * 0.5
        bias[0, 0] = 2.0  # EOS likelier: outputs of many lengths, some ending before the limit
        bias[0, 1] = -1e4  # never <unk> (transformers' decode drops it, seqtool's writes it)
        model.final_logits_bias.copy_(bias)
    model.save_pretrained(out)
    for name in ("source.spm", "target.spm", "vocab.json"):
        shutil.copy(spms / name, out / name)
    (out / "tokenizer_config.json").write_text(json.dumps({"source_lang": "es", "target_lang": "en", "tokenizer_class": "MarianTokenizer"}))
    return out


# ---- unit --------------------------------------------------------------------------------------
@pytest.mark.unit
def test_marian_positions_are_seqtool_positions_in_another_order():
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    from seqtool.interop import marian_positions, residual_order
    from seqtool.model import sinusoidal_positions

    table = MarianSinusoidalPositionalEmbedding(50, 16)
    theirs = table.create_weight() if hasattr(table, "create_weight") else table.weight
    assert torch.allclose(marian_positions(50, 16), theirs, atol=1e-6)
    assert torch.equal(sinusoidal_positions(50, 16), marian_positions(50, 16)[:, residual_order(16)])
    assert sorted(residual_order(16).tolist()) == list(range(16))


@pytest.mark.unit
def test_what_seqtool_cannot_run_exactly_is_refused_by_its_field():
    from seqtool.errors import InputError
    from seqtool.marian import model_config

    good = dict(model_type="marian", d_model=32, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                decoder_ffn_dim=64, activation_function="swish", vocab_size=100, pad_token_id=99, eos_token_id=0,
                decoder_start_token_id=99, scale_embedding=True)
    c = model_config(good, "config.json")
    assert (c.activation, c.scale_embedding, c.output_bias, c.pre_norm, c.bos_id, c.pad_id) == ("swish", True, True, False, 99, 99)
    for change, field in (({"model_type": "bart"}, "model_type"), ({"decoder_attention_heads": 8}, "decoder_attention_heads"),
                          ({"decoder_ffn_dim": 128}, "decoder_ffn_dim"), ({"activation_function": "gelu_new"}, "activation_function"),
                          ({"d_model": 33}, "d_model"), ({"decoder_vocab_size": 50}, "decoder_vocab_size"),
                          ({"eos_token_id": [0, 1]}, "eos_token_id"), ({"normalize_before": True}, "normalize_before")):
        with pytest.raises(InputError, match=f"config.json: {field} = "):
            model_config({**good, **change}, "config.json")


# ---- integration: imported models compute what transformers computes ---------------------------
@pytest.mark.integration
@pytest.mark.parametrize("config", [
    dict(activation_function="swish", scale_embedding=True),
    dict(activation_function="gelu", scale_embedding=False),
    dict(activation_function="relu", share_encoder_decoder_embeddings=False, tie_word_embeddings=False),
], ids=["swish-scaled-tied", "gelu-unscaled", "relu-separate-embeddings"])
def test_an_imported_model_gives_transformers_logits(spms, tmp_path, config):
    from transformers import MarianMTModel, MarianTokenizer

    from seqtool import checkpoint
    from seqtool.interop import import_marian
    from seqtool.model import padded

    d = marian_dir(spms, tmp_path / "marian", **config)
    import_marian(d, tmp_path / "model.pt")
    ours = checkpoint.load_model(checkpoint.load(tmp_path / "model.pt"))
    theirs = MarianMTModel.from_pretrained(d).eval()
    tok = MarianTokenizer.from_pretrained(d)
    lines = bible("test", "es", 8)
    batch = tok(lines, return_tensors="pt", padding=True)
    targets = tok(text_target=bible("test", "en", 8), return_tensors="pt", padding=True).input_ids
    start = torch.full((targets.size(0), 1), theirs.config.decoder_start_token_id)
    tgt_in = torch.cat([start, targets[:, :-1]], dim=1)
    with torch.no_grad():
        expected = theirs(**batch, decoder_input_ids=tgt_in).logits
        got = ours(padded([[i for i in row if i != tok.pad_token_id] for row in batch.input_ids.tolist()], ours.config.pad_id), tgt_in)
    real = tgt_in.ne(tok.pad_token_id) | (torch.arange(tgt_in.size(1)) == 0)  # (padding positions are free to differ)
    assert (got - expected)[real].abs().max() < 1e-4


@pytest.mark.integration
def test_an_imported_model_searches_as_generate_does(spms, tmp_path):
    """Greedy and beam 4 (transformers with early_stopping=True: stop at 4 finished hypotheses, as
    seqtool's beam search does) on 100 sentences, with one length penalty and one length limit:
    the same token ids (beam: but for hypotheses cut at the limit, which the two score otherwise),
    and the same source ids from the pair tokenizer as from MarianTokenizer."""
    from transformers import MarianMTModel, MarianTokenizer

    from seqtool.interop import import_marian
    from seqtool.translate import Translator

    d = marian_dir(spms, tmp_path / "marian")
    import_marian(d, tmp_path / "model.pt")
    theirs = MarianMTModel.from_pretrained(d).eval()
    tok = MarianTokenizer.from_pretrained(d)
    lines = bible("test", "es", 100)
    M = 20  # seqtool: at most M tokens, then EOS; transformers: M + 1 new tokens, the last one forced EOS
    for beam, lenpen in ((1, 1.0), (4, 1.0), (4, 0.6)):  # (transformers warns that greedy ignores early_stopping)
        t = Translator.load(tmp_path / "model.pt", beam=beam, lenpen=lenpen, max_len_a=0, max_len_b=M, loop_guard=0,
                            device="cpu", precision="fp32")
        assert [row + [tok.eos_token_id] for row in t.encode(0, lines)] == tok(lines).input_ids
        ours = [tr.hypotheses[0].tokens for tr in t.translate_chunk(0, lines)]
        with torch.no_grad():
            out = theirs.generate(**tok(lines, return_tensors="pt", padding=True), num_beams=beam, length_penalty=lenpen,
                                  early_stopping=True, max_new_tokens=M + 1, min_new_tokens=1, do_sample=False)
        expected = [[i for i in row[1:] if i not in (tok.pad_token_id, tok.eos_token_id)] for row in out.tolist()]
        differ = [k for k, (a, b) in enumerate(zip(ours, expected)) if a != b]
        if beam == 1:
            assert not differ, f"greedy: {len(differ)} of {len(lines)} differ"
        else:  # at the length limit seqtool charges the forced EOS its log-probability (a score is the model's probability
            # of the output, which score_reference reproduces) where transformers' forced_eos scores it 0: hypotheses cut
            # there may rank otherwise; every one that ends before the limit is the same
            assert all(len(ours[k]) == M and len(expected[k]) == M for k in differ), f"beam {beam}: {differ}"
            assert len(differ) <= 10, f"beam {beam}, lenpen {lenpen}: {len(differ)} of {len(lines)} differ"
        assert len({tuple(x) for x in ours}) >= 20 and any(len(x) < M for x in ours)  # not one output for all; some end early


# ---- system: the CLI ---------------------------------------------------------------------------
@pytest.mark.system
def test_seqtool_import_then_translate_with_seqtool_features(spms, tmp_path):
    from transformers import MarianMTModel, MarianTokenizer

    d = marian_dir(spms, tmp_path / "opus-mt-es-en")
    seqtool("import", d, "--output", "model.pt", cwd=tmp_path)
    lines = bible("test", "es", 30)
    out = seqtool("translate", "-c", "model.pt", "--beam", "1", "--max-len-a", "0", "--max-len-b", "20", "--loop-guard", "0",
                  "--precision", "fp32", "--split-sentences", "never", cwd=tmp_path, stdin="\n".join(lines) + "\n").stdout.splitlines()
    theirs, tok = MarianMTModel.from_pretrained(d).eval(), MarianTokenizer.from_pretrained(d)
    with torch.no_grad():
        ids = theirs.generate(**tok(lines, return_tensors="pt", padding=True), num_beams=1, max_new_tokens=21, min_new_tokens=1)
    # seqtool decodes an output with target.spm, as Marian does and transformers 4 did (transformers 5 decodes a
    # shared-vocabulary model's output with source.spm unless told otherwise)
    assert out == tok.batch_decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False, use_source_tokenizer=False)
    info = seqtool("info", "model.pt", cwd=tmp_path).stdout
    assert "a source and a target model over one id space" in info and "format=marian" in info and "src_lang=es" in info
    for split, n in (("ft", 200), ("ftv", 20)):  # fine-tuning keeps both tokenizers: the targets are encoded by target.spm
        for lang in ("es", "en"):
            (tmp_path / f"{split}.{lang}").write_text("\n".join(bible("train", lang, n)) + "\n", encoding="utf-8")
    seqtool("train", "--finetune", "model.pt", "--src", "es", "--tgt", "en", "--train", "ft", "--valid", "ftv", "--save-dir", "tuned",
            "--max-updates", "3", "--threads", "2", cwd=tmp_path)
    from seqtool import checkpoint
    from seqtool.tokenizer import Tokenizer

    tuned = checkpoint.load(tmp_path / "tuned" / "best.pt")
    assert checkpoint.tokenizer_bytes(tuned) == checkpoint.tokenizer_bytes(checkpoint.load(tmp_path / "model.pt"))
    meta = json.loads((tmp_path / "tuned" / "data" / "meta.json").read_text())
    english = Tokenizer(checkpoint.tokenizer_bytes(tuned)).encode_batch([bible("train", "en", 1)[0]], "target")[0]
    assert meta["special_ids"]["eos"] == 0 and english == tok(text_target=bible("train", "en", 1)).input_ids[0][:-1]
    assert len(seqtool("translate", "-c", "tuned/best.pt", "--max-len-a", "0", "--max-len-b", "10", cwd=tmp_path, stdin=lines[0] + "\n").stdout.splitlines()) == 1
    int8 = seqtool("translate", "-c", "model.pt", "--quantize", "int8", "--max-len-a", "0", "--max-len-b", "20", cwd=tmp_path, stdin="\n".join(lines[:5]) + "\n")
    assert len(int8.stdout.splitlines()) == 5
    (tmp_path / "prefix.txt").write_text("And\n")  # encoded by target.spm
    prefixed = seqtool("translate", "-c", "model.pt", "--beam", "2", "--max-len-a", "0", "--max-len-b", "20", "--target-prefix", "prefix.txt", cwd=tmp_path,
                       stdin=lines[0] + "\n").stdout
    assert prefixed.startswith("And")
    bf16 = seqtool("translate", "-c", "model.pt", "--precision", "bf16", "--max-len-a", "0", "--max-len-b", "20", cwd=tmp_path, stdin="\n".join(lines[:5]) + "\n")
    assert len(bf16.stdout.splitlines()) == 5
    (tmp_path / "page.html").write_text(f"<p>{lines[0]} <b>{lines[1]}</b></p>\n<pre>{lines[2]}</pre>\n")
    page = seqtool("translate", "-c", "model.pt", "--format", "html", "-i", "page.html", "--max-len-a", "0", "--max-len-b", "20", cwd=tmp_path).stdout
    assert page.count("<b>") == 1 and f"<pre>{lines[2]}</pre>" in page  # tags kept, pre untouched
    again = cli("import", d, "--output", "model.pt", cwd=tmp_path)
    assert again.returncode == 1 and "already exists" in again.stderr
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "activation_function": "gelu_new"}))
    refused = cli("import", d, "--output", "other.pt", cwd=tmp_path)
    assert refused.returncode == 1 and "activation_function = \"gelu_new\"" in refused.stderr and refused.stderr.count("\n") == 1
    assert not (tmp_path / "other.pt").exists()


@pytest.mark.system
def test_an_imported_model_serves_keeps_terminology_and_draws_its_attention(spms, tmp_path):
    """The rest of what a seqtool model does, on an imported one: terminology (hard constraints,
    encoded by target.spm), `attention` (source pieces of source.spm, target pieces of target.spm)
    and `serve` as a real process: LibreTranslate's /languages and /translate, and /v1/translate
    with constraints giving what the Python API gives."""
    import httpx
    import sentencepiece as spm
    from servers import Server

    from seqtool.translate import Translator

    d = marian_dir(spms, tmp_path / "opus-mt-es-en", seed=1)
    seqtool("import", d, "--output", "model.pt", cwd=tmp_path)
    lines = bible("test", "es", 6)
    want = [["the Lord"], [], [["the house", "the houses"]], ["Jesus said"], [], ["and the"]]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(w) + "\n" for w in want))
    out = seqtool("translate", "-c", "model.pt", "--constraints", "c.jsonl", "--max-len-a", "0", "--max-len-b", "25", "--precision", "fp32",
                  cwd=tmp_path, stdin="\n".join(lines) + "\n").stdout.splitlines()
    assert len(out) == 6
    for text, phrases in zip(out, want):  # every constraint appears (one of the forms, for a list)
        assert all(any(f in text for f in ([p] if isinstance(p, str) else p)) for p in phrases), (text, phrases)
    picture = seqtool("attention", lines[0], "-c", "model.pt", "--target", "And the Lord said", "--terminal", "--device", "cpu",
                      cwd=tmp_path).stdout
    target_pieces = spm.SentencePieceProcessor(model_file=str(spms / "target.spm")).encode("And the Lord said", out_type=str)
    source_pieces = spm.SentencePieceProcessor(model_file=str(spms / "source.spm")).encode(lines[0], out_type=str)
    assert all(p in picture for p in target_pieces + source_pieces[:3]) and "encoder-decoder attention" in picture
    server = Server(tmp_path / "model.pt")
    try:
        assert httpx.get(f"{server.url}/languages").json()[0] | {"name": None} == {"code": "es", "name": None, "targets": ["en"]}
        t = Translator.load(tmp_path / "model.pt", device="cpu", precision="fp32", threads=2, max_len_a=0.0, max_len_b=8)
        r = httpx.post(f"{server.url}/translate", json={"q": lines[:3], "source": "es", "target": "en"}, timeout=60)
        assert r.status_code == 200 and r.json()["translatedText"] == t.translate(lines[:3])
        r = httpx.post(f"{server.url}/v1/translate", json={"segments": lines, "constraints": want}, timeout=60)
        assert r.status_code == 200 and [x["text"] for x in r.json()["translations"]] == t.translate(lines, constraints=want)
    finally:
        assert server.stop() is not None


@pytest.mark.system
def test_a_multi_target_opus_model_takes_its_target_from_tgt_lang(spms, tmp_path):
    """OPUS-MT's multi-target models choose the output language by a >>lang<< token at the source's
    start (vocabulary entries MarianTokenizer reads there): imported, they are --tgt-lang's targets,
    and `--tgt-lang ita` translates as generate does on ">>ita<< " + the text."""
    import shutil

    from transformers import MarianMTModel, MarianTokenizer

    tagged = tmp_path / "spm"
    tagged.mkdir()
    for name in ("source.spm", "target.spm"):
        shutil.copy(spms / name, tagged / name)
    pieces = list(json.loads((spms / "vocab.json").read_text()))
    pieces = pieces[:2] + [">>fra<<", ">>ita<<", ">>por<<"] + pieces[2:]
    (tagged / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}, ensure_ascii=False))
    d = marian_dir(tagged, tmp_path / "opus-mt-es-ROMANCE", seed=2)
    seqtool("import", d, "--output", "model.pt", cwd=tmp_path)
    assert "es-fra, es-ita, es-por; target tags fra=2, ita=3, por=4" in seqtool("info", "model.pt", cwd=tmp_path).stdout
    lines = bible("test", "es", 20)
    missing = cli("translate", "-c", "model.pt", cwd=tmp_path)
    assert missing.returncode == 1 and "fra, ita, por" in missing.stderr
    theirs, tok = MarianMTModel.from_pretrained(d).eval(), MarianTokenizer.from_pretrained(d)
    for lang in ("ita", "fra"):
        out = seqtool("translate", "-c", "model.pt", "--tgt-lang", lang, "--beam", "1", "--max-len-a", "0", "--max-len-b", "20",
                      "--loop-guard", "0", "--precision", "fp32", "--split-sentences", "never", cwd=tmp_path,
                      stdin="\n".join(lines) + "\n").stdout.splitlines()
        batch = tok([f">>{lang}<< {x}" for x in lines], return_tensors="pt", padding=True)
        assert (batch.input_ids[:, 0] == pieces.index(f">>{lang}<<")).all()  # their tag: the source's first id
        with torch.no_grad():
            ids = theirs.generate(**batch, num_beams=1, max_new_tokens=21, min_new_tokens=1)
        assert out == tok.batch_decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False, use_source_tokenizer=False)
    wrong = cli("translate", "-c", "model.pt", "--tgt-lang", "deu", cwd=tmp_path)
    assert wrong.returncode == 1 and "--tgt-lang 'deu': this model translates into fra, ita, por" in wrong.stderr
    seqtool("export", "model.pt", "again", "--format", "huggingface", cwd=tmp_path)  # and out again: the same vocabulary and model
    assert json.loads((tmp_path / "again" / "vocab.json").read_text()) == json.loads((d / "vocab.json").read_text())
    again, tok2 = MarianMTModel.from_pretrained(tmp_path / "again").eval(), MarianTokenizer.from_pretrained(tmp_path / "again")
    with torch.no_grad():
        ids2 = again.generate(**tok2([f">>fra<< {x}" for x in lines], return_tensors="pt", padding=True), num_beams=1,
                              max_new_tokens=21, min_new_tokens=1)
    assert tok2.batch_decode(ids2, skip_special_tokens=True, clean_up_tokenization_spaces=False, use_source_tokenizer=False) == out


@pytest.mark.system
def test_a_trained_seqtool_model_exports_to_transformers_and_generates_as_seqtool_translates(tmp_path):
    """A post-norm model trained briefly on 3,000 bible lines, exported, loaded by MarianMTModel and
    AutoTokenizer: its greedy output equals `seqtool translate --beam 1` on >= 95 of 100 test lines."""
    from transformers import AutoTokenizer, MarianMTModel

    for split, n in (("train", 3000), ("valid", 100)):
        for lang in ("es", "en"):
            (tmp_path / f"{split}.{lang}").write_text("\n".join(bible(split, lang, n)) + "\n", encoding="utf-8")
    seqtool("train", "--src", "es", "--tgt", "en", "--train", "train", "--valid", "valid", "--save-dir", "run", "--arch", "tiny",
            "--vocab-size", "500", "--max-updates", "150", "--max-tokens", "2000", "--threads", "2", cwd=tmp_path)
    seqtool("export", "run/best.pt", "hf", "--format", "huggingface", cwd=tmp_path)
    lines = bible("test", "es", 100)
    ours = seqtool("translate", "-c", "run/best.pt", "--beam", "1", "--max-len-a", "0", "--max-len-b", "30", "--loop-guard", "0",
                   "--precision", "fp32", "--split-sentences", "never", cwd=tmp_path, stdin="\n".join(lines) + "\n").stdout.splitlines()
    model, tok = MarianMTModel.from_pretrained(tmp_path / "hf").eval(), AutoTokenizer.from_pretrained(tmp_path / "hf")
    with torch.no_grad():
        ids = model.generate(**tok(lines, return_tensors="pt", padding=True), num_beams=1, max_new_tokens=31, min_new_tokens=1)
    theirs = tok.batch_decode(ids, skip_special_tokens=True)
    assert sum(a == b for a, b in zip(ours, theirs)) >= 95
    seqtool("import", "hf", "--output", "back.pt", cwd=tmp_path)  # and back: the same translations
    back = seqtool("translate", "-c", "back.pt", "--beam", "1", "--max-len-a", "0", "--max-len-b", "30", "--loop-guard", "0",
                   "--precision", "fp32", "--split-sentences", "never", cwd=tmp_path, stdin="\n".join(lines) + "\n").stdout.splitlines()
    assert sum(a == b for a, b in zip(ours, back)) >= 95


@pytest.mark.integration
def test_a_pre_norm_model_is_refused_by_the_huggingface_export(tiny_checkpoint, tmp_path):
    from seqtool import checkpoint
    from seqtool.config import ModelConfig
    from seqtool.errors import InputError
    from seqtool.export import export
    from seqtool.model import Transformer

    ckpt = checkpoint.load(tiny_checkpoint)
    config = ModelConfig.from_dict(ckpt["model_config"]).replace(pre_norm=True)
    pre = checkpoint.build({**ckpt["configs"], "model": config.to_dict()}, checkpoint.tokenizer_bytes(ckpt),
                           checkpoint.model_state(Transformer(config)))
    checkpoint.save(pre, tmp_path / "pre.pt")
    with pytest.raises(InputError, match="pre-norm .* post-norm only"):
        export(tmp_path / "pre.pt", tmp_path / "hf", "huggingface")
    assert not (tmp_path / "hf").exists()
    with pytest.raises(Exception, match="--quantization is CTranslate2's"):
        export(tiny_checkpoint, tmp_path / "hf", "huggingface", quantization="int8")


# ---- hostile directories: `seqtool import` refuses them in one line (exit 1), never exit 2 ----------------
@pytest.fixture(scope="module")
def small_marian(spms, tmp_path_factory) -> Path:
    """One small MarianMTModel directory (1 + 1 layers, d_model 32): what the hostile copies below are made of."""
    return marian_dir(spms, tmp_path_factory.mktemp("small") / "marian", encoder_layers=1, decoder_layers=1)


def hostile(base: Path, out: Path, config=None, weights=None, files=None) -> Path:
    """A copy of base with config.json's fields changed (config), tensors of model.safetensors replaced
    (weights: name -> tensor), and files written whole (files: name -> bytes, or a JSON value)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(base, out)
    if config:
        (out / "config.json").write_text(json.dumps({**json.loads((out / "config.json").read_text()), **config}))
    if weights:
        save_file({**load_file(out / "model.safetensors"), **weights}, out / "model.safetensors")
    for name, value in (files or {}).items():
        (out / name).write_bytes(value if isinstance(value, bytes) else json.dumps(value).encode())
    return out


def refusal(directory: Path) -> str:
    """import_marian's refusal of directory: a SeqtoolError (the CLI's one line and exit 1), never anything
    else (the CLI's exit 2, "a bug in seqtool"), and no checkpoint written."""
    from seqtool.errors import SeqtoolError
    from seqtool.interop import import_marian

    output = directory.parent / f"{directory.name}.pt"
    with pytest.raises(SeqtoolError) as caught:
        import_marian(directory, output)
    assert "\n" not in str(caught.value) and not output.exists()
    return str(caught.value)


# the CLI, for directories an import must neither read without end nor wait on: each in a process of at most 4 GiB of
# address space (torch itself takes under 1), stopped after 20 s; one JSON line per directory (exit status, stderr)
BOUNDED_IMPORTS = r"""
import json, signal, sys
from typer.testing import CliRunner
from seqtool.cli import app

class Hung(BaseException):
    pass

def hang(*_):
    raise Hung()

signal.signal(signal.SIGALRM, hang)
for directory in sys.argv[1:]:
    signal.alarm(20)
    try:
        result = CliRunner().invoke(app, ["import", directory, "--output", directory + ".pt"])
        print(json.dumps({"exit": result.exit_code, "stderr": result.stderr}), flush=True)
    except Hung:
        print(json.dumps({"exit": None, "stderr": "hung for 20 s"}), flush=True)
    signal.alarm(0)
"""


def bounded_imports(directories: list[Path]) -> list[dict]:
    import os
    import resource
    import subprocess
    import sys

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (4 * 2 ** 30, 4 * 2 ** 30))

    run = subprocess.run([sys.executable, "-c", BOUNDED_IMPORTS, *map(str, directories)], capture_output=True, text=True,
                         timeout=300, preexec_fn=limit, env=dict(os.environ, OMP_NUM_THREADS="2"))
    assert run.returncode == 0, run.stderr[-2000:]
    return [json.loads(line) for line in run.stdout.splitlines()]


@pytest.mark.system
def test_import_reads_only_regular_files_of_the_directory_within_caps_and_checks_sizes_first(small_marian, tmp_path):
    """#42 item 8: /dev/zero as config.json, vocab.json or source.spm, a FIFO as source.spm, a symlink out of
    the directory, a vocab.json over its cap and vocab_size 2^31 - 1 (16 GB of pieces, when allocated before
    anything is checked) are each refused in one line, naming the file (and field), in bounded memory and
    time. Symlinks within the directory, and a Hugging Face hub snapshot's into its blobs, are read."""
    import os
    import shutil

    from seqtool.marian import VOCAB_CAP

    (tmp_path / "elsewhere").mkdir()
    shutil.copy(small_marian / "vocab.json", tmp_path / "elsewhere" / "vocab.json")
    cases = {}  # name -> (directory, what its refusal says, or None: imported)
    for name in ("config.json", "vocab.json", "source.spm"):
        d = hostile(small_marian, tmp_path / f"zero-{name}")
        (d / name).unlink()
        (d / name).symlink_to("/dev/zero")
        cases[f"zero-{name}"] = (d, f"{name}: a symlink out of the model directory")
    d = hostile(small_marian, tmp_path / "fifo")
    (d / "source.spm").unlink()
    os.mkfifo(d / "source.spm")
    cases["fifo"] = (d, "source.spm: not a regular file (a FIFO)")
    d = hostile(small_marian, tmp_path / "outside")
    (d / "vocab.json").unlink()
    (d / "vocab.json").symlink_to(tmp_path / "elsewhere" / "vocab.json")
    cases["outside"] = (d, "vocab.json: a symlink out of the model directory")
    d = hostile(small_marian, tmp_path / "big-vocab")
    os.truncate(d / "vocab.json", VOCAB_CAP + 1)  # (sparse: no disk used)
    cases["big-vocab"] = (d, f"vocab.json: {VOCAB_CAP + 1:,} bytes, over the {VOCAB_CAP:,}")
    d = hostile(small_marian, tmp_path / "vocab-size", config={"vocab_size": 2 ** 31 - 1, "decoder_vocab_size": 2 ** 31 - 1})
    cases["vocab-size"] = (d, "config.json gives it [1, 2147483647] (vocab_size = 2147483647)")
    d = hostile(small_marian, tmp_path / "inside")
    (d / "tokenizer").mkdir()
    (d / "vocab.json").rename(d / "tokenizer" / "vocab.json")
    (d / "vocab.json").symlink_to(Path("tokenizer") / "vocab.json")
    cases["inside"] = (d, None)
    snapshot = tmp_path / "hub" / "models--x--y" / "snapshots" / "0123abc"  # the hub's cache: every file a symlink to a blob
    snapshot.mkdir(parents=True)
    (tmp_path / "hub" / "models--x--y" / "blobs").mkdir()
    for f in small_marian.iterdir():
        shutil.copy(f, tmp_path / "hub" / "models--x--y" / "blobs" / f"blob-{f.name}")
        (snapshot / f.name).symlink_to(Path("..", "..", "blobs", f"blob-{f.name}"))
    cases["hub"] = (snapshot, None)
    outcomes = dict(zip(cases, bounded_imports([d for d, _ in cases.values()])))
    for name, (d, says) in cases.items():
        got = outcomes[name]
        if says is None:
            assert got["exit"] == 0, (name, got)
        else:
            assert got["exit"] == 1 and got["stderr"].count("\n") == 1 and says in got["stderr"], (name, got)
            assert not Path(f"{d}.pt").exists()


@pytest.mark.integration
@pytest.mark.parametrize("change, says", [
    ({"config": {"d_model": "32"}}, "config.json: d_model = \"32\": not an integer"),
    ({"config": {"d_model": None}}, "config.json: d_model = null: not an integer"),
    ({"config": {"d_model": float("inf")}}, "config.json: d_model = Infinity: not an integer"),
    ({"config": {"d_model": 2 ** 40}}, "config.json: d_model = 1099511627776: outside [1, 65536]"),
    ({"files": {"config.json": [1, 2]}}, "config.json: [1, 2]: not a JSON object"),
    ({"files": {"config.json": None}}, "config.json: null: not a JSON object"),
    ({"files": {"generation_config.json": ["num_beams"]}}, "generation_config.json: [\"num_beams\"]: not a JSON object"),
    ({"files": {"generation_config.json": None}}, "generation_config.json: null: not a JSON object"),
    ({"files": {"tokenizer_config.json": []}}, "tokenizer_config.json: []: not a JSON object"),
    ({"files": {"tokenizer_config.json": None}}, "tokenizer_config.json: null: not a JSON object"),
    ({"files": {"tokenizer_config.json": {"unk_token": ["<unk>"]}}}, "tokenizer_config.json: unk_token = [\"<unk>\"]: not a piece"),
    ({"files": {"tokenizer_config.json": {"source_lang": {"es": 1}}}}, "tokenizer_config.json: source_lang = {\"es\": 1}"),
    ({"weights": {"model.encoder.layers.0.fc1.weight": torch.zeros(63, 32)}},
     "model.safetensors: model.encoder.layers.0.fc1.weight has shape [63, 32], but config.json gives it [64, 32] (encoder_ffn_dim = 64)"),
    ({"weights": {"model.decoder.layers.0.self_attn.q_proj.bias": torch.zeros(32, 1)}},
     "model.safetensors: model.decoder.layers.0.self_attn.q_proj.bias has shape [32, 1], but config.json gives it [32] (d_model = 32)"),
    ({"weights": {"model.encoder.layers.x.foo": torch.zeros(2)}}, "model.safetensors: holds model.encoder.layers.x.foo, which no MarianMTModel has"),
    ({"weights": {"model.decoder.layers.1.fc1.bias": torch.zeros(64)}},
     "model.safetensors: holds model.decoder.layers.1.fc1.bias, beyond the decoder_layers = 1 config.json declares"),
], ids=["d_model-string", "d_model-null", "d_model-infinite", "d_model-huge", "config-list", "config-null", "generation-list",
        "generation-null", "tokenizer-config-list", "tokenizer-config-null", "unk-token-list", "source-lang-object", "wrong-shape",
        "wrong-rank", "non-numeric-layer", "extra-layer"])
def test_import_refuses_a_hostile_value_in_one_line_naming_file_and_field(small_marian, tmp_path, change, says):
    """#42 item 9: each of these ended in exit 2, "a bug in seqtool"; now a SeqtoolError (exit 1) naming the file and field."""
    assert says in refusal(hostile(small_marian, tmp_path / "marian", **change))


@pytest.mark.integration
@pytest.mark.parametrize("case", ["nan", "inf", "bool", "int", "fractional-d_model", "duplicate-ids"])
def test_import_refuses_weights_and_values_no_model_computes_with(small_marian, tmp_path, case):
    """#42 item 10: NaN or infinite weights (every translation empty, exit 0), bool or int weights, a fractional
    d_model and two pieces with one id were imported; now each is refused naming the tensor or field."""
    from safetensors.torch import load_file

    state = load_file(small_marian / "model.safetensors")
    vocab = json.loads((small_marian / "vocab.json").read_text())
    bias = state["final_logits_bias"].clone()
    bias[0, 7] = float("inf")
    fc2, norm, fc1 = ("model.encoder.layers.0.fc2.weight", "model.decoder.layers.0.final_layer_norm.weight", "model.decoder.layers.0.fc1.bias")
    change, says = {
        "nan": ({"weights": {fc2: torch.full_like(state[fc2], float("nan"))}}, f"model.safetensors: {fc2} holds NaN or infinite values"),
        "inf": ({"weights": {"final_logits_bias": bias}}, "model.safetensors: final_logits_bias holds NaN or infinite values"),
        "bool": ({"weights": {norm: state[norm].bool()}}, f"model.safetensors: {norm} holds bool values; a model's weights are floating point"),
        "int": ({"weights": {fc1: state[fc1].long()}}, f"model.safetensors: {fc1} holds int64 values"),
        "fractional-d_model": ({"config": {"d_model": 32.5}}, "config.json: d_model = 32.5: not an integer"),
        "duplicate-ids": ({"files": {"vocab.json": {**vocab, "<pad>": vocab["<unk>"]}}},
                          "vocab.json: \"<unk>\" and \"<pad>\" both have id 1; one id is one piece"),
    }[case]
    assert says in refusal(hostile(small_marian, tmp_path / "marian", **change))


@pytest.mark.system
def test_imported_decoding_defaults_are_within_the_servers_caps(small_marian, tmp_path, capsys):
    """#42 item 11: generation_config.json's num_beams 1024 made `serve` fail with "--beam 1024 is over
    --max-beam" though no --beam was given. An import lowers it to serve's --max-beam, with a warning; a
    checkpoint that already holds such a default serves with it lowered to the cap, with a warning; a
    --beam given on the command line over --max-beam is still refused."""
    import httpx
    from servers import Server
    from typer.testing import CliRunner

    from seqtool import checkpoint
    from seqtool.cli import app
    from seqtool.interop import import_marian

    d = hostile(small_marian, tmp_path / "marian", files={"generation_config.json": {"num_beams": 1024}})
    assert import_marian(d, tmp_path / "model.pt")["configs"]["decoding"] == {"beam": 16}
    assert "generation_config.json: num_beams = 1024 is over serve's --max-beam 16; the checkpoint's default beam is 16" in capsys.readouterr().err
    held = checkpoint.load(tmp_path / "model.pt")  # as an import before this fix wrote it
    held["configs"]["decoding"] = {"beam": 1024}
    checkpoint.save(held, tmp_path / "held.pt")
    server = Server(tmp_path / "held.pt")
    try:
        r = httpx.post(f"{server.url}/v1/translate", json={"segments": ["Hola mundo."]}, timeout=60)
        assert r.status_code == 200 and len(r.json()["translations"]) == 1
    finally:
        err = server.stop()
    assert "the checkpoint's default beam 1024 is over --max-beam 16; serving with beam 16" in err
    refused = CliRunner().invoke(app, ["serve", "-c", str(tmp_path / "held.pt"), "--beam", "1024", "--port", "0"])
    assert refused.exit_code == 1 and "--beam 1024 is over --max-beam 16" in refused.stderr
