"""seqtool export --format ctranslate2: CTranslate2 decodes the exported model as seqtool does."""

import json
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from conftest import write_reverse_corpus
from seqtool import checkpoint
from seqtool.cli import app
from seqtool.config import OptimConfig, TokenizerConfig, TrainConfig, model_config_for
from seqtool.model import Transformer
from seqtool.textio import InputError
from seqtool.tokenizer import train_tokenizer
from seqtool.translate import Translator

import ctranslate2  # an optional extra of seqtool, installed in CI
from seqtool.export import MARKER, export

runner = CliRunner()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("export")
    texts = write_reverse_corpus(d, 300, 30, seed=3)
    spm = train_tokenizer([d / "train.src", d / "train.tgt"], str(d / "spm"), TokenizerConfig(vocab_size=25))
    return d, texts, spm


def _random_checkpoint(d: Path, spm: Path, pre_norm: bool, layers: tuple[int, int] = (2, 2)) -> Path:
    """Random weights with noise on every tensor (layer norms and biases too, which fresh ones have
    at 1 and 0), so that a mistake in any of them changes the outputs."""
    torch.manual_seed(0)
    config = model_config_for("tiny", vocab_size=25, dropout=0.0, max_positions=40, pre_norm=pre_norm,
                              encoder_layers=layers[0], decoder_layers=layers[1])
    weights = {k: v + 0.3 * torch.randn(v.shape) for k, v in checkpoint.model_state(Transformer(config)).items()}
    configs = {"model": config.to_dict(), "optim": OptimConfig().to_dict(), "train": TrainConfig().to_dict()}
    path = d / f"model-{'pre' if pre_norm else 'post'}-{layers[0]}-{layers[1]}.pt"
    checkpoint.save(checkpoint.build(configs, spm.read_bytes(), weights), path)
    return path


@pytest.mark.parametrize("pre_norm, layers", [(False, (2, 2)), (True, (2, 2)), (False, (4, 1))],
                         ids=["post-norm", "pre-norm", "student-shape-4-1"])  # (a deep encoder, a shallow decoder)
@pytest.mark.integration
def test_ctranslate2_decodes_the_export_as_seqtool_does(corpus, pre_norm, layers):
    d, texts, spm = corpus
    ckpt = _random_checkpoint(d, spm, pre_norm, layers)
    out = export(ckpt, d / f"ct2-{pre_norm}-{layers[0]}-{layers[1]}")
    assert {"model.bin", "config.json", "sentencepiece.model"} <= {p.name for p in out.iterdir()}
    lines = texts["test"][0] + texts["train"][0][:10]
    # (CTranslate2 has no loop guard: random weights loop, so seqtool's is off for the comparison)
    translator = Translator.load(ckpt, beam=1, max_len_a=0.0, max_len_b=25, device="cpu", precision="fp32", loop_guard=0)
    ours = translator.translate_chunk(0, lines)
    piece = translator.tokenizer.sp.id_to_piece

    # The README's usage: the exported directory is all CTranslate2 needs.
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(out / "sentencepiece.model"))
    ct2 = ctranslate2.Translator(str(out), device="cpu", intra_threads=2)
    source = [sp.encode(x, out_type=str) for x in lines]
    theirs = [r.hypotheses[0] for r in ct2.translate_batch(source, beam_size=1, max_decoding_length=25)]
    assert theirs == [[piece(i) for i in t.hypotheses[0].tokens] for t in ours]
    assert [sp.decode(x) for x in theirs] == [t.texts[0] for t in ours]

    # Random weights' greedy outputs repeat a token or two, so also compare what they cannot show:
    # every position of a varied target (the references) gets the same log-probabilities.
    targets = [sp.encode(x, out_type=str) for x in texts["test"][1]]
    scored = ct2.score_batch(source[: len(targets)], targets)
    model = translator.model
    for src_pieces, tgt_pieces, result in zip(source, targets, scored):
        src_ids = torch.tensor([[sp.piece_to_id(p) for p in src_pieces] + [3]])
        tgt_ids = [sp.piece_to_id(p) for p in tgt_pieces]
        with torch.no_grad():
            lprobs = model(src_ids, torch.tensor([[2] + tgt_ids]))[0].float()  # (T+1, V)
        lprobs[:, [0, 2]] = float("-inf")  # seqtool's search never emits pad or BOS
        expected = lprobs.log_softmax(-1).gather(1, torch.tensor(tgt_ids + [3])[:, None]).squeeze(1)
        assert result.tokens == tgt_pieces + ["</s>"]
        torch.testing.assert_close(torch.tensor(result.log_probs), expected, atol=2e-3, rtol=1e-3)  # float32, different kernels


@pytest.mark.integration
def test_refuses_to_overwrite_without_force_and_replaces_only_its_own_output(tiny_checkpoint, tmp_path):
    out = tmp_path / "ct2"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    with pytest.raises(InputError, match="already exists; pass --force"):
        export(tiny_checkpoint, out)
    with pytest.raises(InputError, match="was not written by seqtool export"):  # a user's directory: never deleted
        export(tiny_checkpoint, out, force=True)
    assert (out / "mine.txt").read_text() == "keep"
    run_dir = tiny_checkpoint.parent  # e.g. `seqtool export runs/x/best.pt runs/x --force`: the run directory itself
    before = sorted(p.name for p in run_dir.iterdir())
    with pytest.raises(InputError, match="was not written by seqtool export"):
        export(tiny_checkpoint, run_dir, force=True)
    assert sorted(p.name for p in run_dir.iterdir()) == before
    mine = tmp_path / "exported"
    export(tiny_checkpoint, mine)
    (mine / "model.bin").write_bytes(b"an older model")
    export(tiny_checkpoint, mine, force=True)  # seqtool's own export: replaced
    assert (mine / "model.bin").read_bytes() != b"an older model"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary directory left behind
    assert json.loads((mine / ".seqtool-export").read_text())["checkpoint"] == tiny_checkpoint.name  # a name, never a local path
    link = tmp_path / "latest"  # --force onto a link to an export: the link becomes the new export, what it pointed to stays
    link.symlink_to(mine, target_is_directory=True)
    export(tiny_checkpoint, link, force=True)
    assert link.is_dir() and not link.is_symlink() and (mine / "model.bin").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no .latest.old-... left behind


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir()}


@pytest.mark.integration
def test_force_never_deletes_a_file_added_to_an_exported_directory_and_names_it(tiny_checkpoint, tmp_path):
    out = export(tiny_checkpoint, tmp_path / "ct2")
    assert json.loads((out / MARKER).read_text())["files"] == sorted(p.name for p in out.iterdir())  # what it wrote
    (out / "notes.txt").write_text("mine")
    before = _files(out)
    result = runner.invoke(app, ["export", str(tiny_checkpoint), str(out), "--force"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("error:")]
    assert f"{out}: holds files seqtool export did not write (notes.txt)" in line
    for k in range(4):
        (out / f"extra{k}.txt").write_text("mine")
    with pytest.raises(InputError, match=r"did not write \(extra0.txt, extra1.txt, extra2.txt and 2 more\)"):
        export(tiny_checkpoint, out, force=True)
    assert {name: data for name, data in _files(out).items() if name in before} == before
    for name in ["notes.txt"] + [f"extra{k}.txt" for k in range(4)]:
        (out / name).unlink()
    (out / MARKER).write_text("written by seqtool export from model.pt\n")  # an older seqtool's: no list of files
    with pytest.raises(InputError, match="does not list the files seqtool export wrote"):
        export(tiny_checkpoint, out, force=True)
    assert sorted(_files(out)) == sorted(before.keys() - {"notes.txt"})


@pytest.mark.integration
def test_a_failed_export_leaves_nothing_and_keeps_the_old_directory(tiny_checkpoint, tmp_path, monkeypatch):
    import seqtool.export

    out = tmp_path / "ct2"
    export(tiny_checkpoint, out)
    before = _files(out)

    def broken(ckpt):
        raise RuntimeError("disk full")

    monkeypatch.setattr(seqtool.export, "ctranslate2_spec", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        export(tiny_checkpoint, out, force=True)
    assert _files(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]


@pytest.mark.integration
def test_without_ctranslate2_a_one_line_error_says_how_to_install(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import fails as if not installed
    result = runner.invoke(app, ["export", str(tiny_checkpoint), str(tmp_path / "out")])
    assert result.exit_code == 1
    assert "pip install 'seqtool[ctranslate2]'" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()


@pytest.mark.unit
def test_export_options_reach_the_library_call(monkeypatch, tmp_path):
    import seqtool.export

    seen = {}
    monkeypatch.setattr(seqtool.export, "export", lambda *a, **k: seen.update(args=a, kwargs=k) or a[1])
    result = runner.invoke(app, ["export", "m.pt", str(tmp_path / "out"), "--format", "ctranslate2", "--quantization", "int8", "--force"])
    assert result.exit_code == 0, result.output
    assert seen["args"] == (Path("m.pt"), tmp_path / "out", "ctranslate2")
    assert seen["kwargs"] == {"force": True, "quantization": "int8"}


@pytest.mark.parametrize("args, message", [
    (["--format", "onnx"], "--format must be one of ctranslate2"),
    (["--quantization", "int3"], "--quantization must be one of"),
])
@pytest.mark.integration
def test_bad_options_are_one_line_errors(tiny_checkpoint, tmp_path, args, message):
    result = runner.invoke(app, ["export", str(tiny_checkpoint), str(tmp_path / "out"), *args])
    assert result.exit_code == 1 and message in result.output
    assert not (tmp_path / "out").exists()
