"""--score-reference: the model's log-probability of given translations, teacher-forced in batches."""

import subprocess
import sys

import pytest
import torch

from seqtool.config import model_config_for
from seqtool.ensemble import Ensemble
from seqtool.model import Transformer
from seqtool.reference_score import count_lines, reference_logprobs
from seqtool.search import beam_search
from seqtool.textio import InputError
from seqtool.translate import Translator

EOS, PAD = 3, 0


def _model(seed):
    torch.manual_seed(seed)
    model = Transformer(model_config_for("tiny", vocab_size=50, dropout=0.0)).eval()
    with torch.no_grad():
        model.embed.weight.mul_(3.0)
    return model


@pytest.mark.parametrize("members", [1, 2], ids=["model", "ensemble"])
@pytest.mark.parametrize("lenpen", [1.0, 0.6])
@pytest.mark.unit
def test_reference_score_equals_the_beam_score_of_the_same_hypothesis(members, lenpen):
    models = [_model(3 + i) for i in range(members)]
    model = models[0] if members == 1 else Ensemble(models)
    g = torch.Generator().manual_seed(2)
    src = torch.randint(4, 50, (4, 7), generator=g)
    src[:, -1] = EOS
    src[1, 4:] = PAD
    src[1, 3] = EOS
    hyps = beam_search(model, src, beam=3, nbest=3, max_len_a=0.0, max_len_b=10, lenpen=lenpen)
    # every hypothesis fed back as a reference, all in one batch (rows of different lengths)
    rows = [(b, h) for b, sent in enumerate(hyps) for h in sent]
    sources = src[torch.tensor([b for b, _ in rows])]
    totals = reference_logprobs(model, sources, [h.tokens for _, h in rows])
    for (_, h), total in zip(rows, totals):
        assert total / (len(h.tokens) + 1) ** lenpen == pytest.approx(h.score, abs=1e-4)


@pytest.mark.unit
def test_count_lines_counts_as_the_readers_do(tmp_path):
    cases = {b"": 0, b"a": 1, b"a\n": 1, b"a\nb": 2, b"\n\n": 2, b"a\r\nb\rc\n": 2}
    for i, (data, n) in enumerate(cases.items()):
        (tmp_path / f"{i}.txt").write_bytes(data)
        assert count_lines(tmp_path / f"{i}.txt") == n, data


def _cli(ckpt, *args, stdin=b""):
    return subprocess.run([sys.executable, "-m", "seqtool", "translate", "-c", str(ckpt), "--device", "cpu", *args],
                          input=stdin, capture_output=True, timeout=120)


@pytest.mark.system
def test_cli_prints_one_scored_reference_per_input_line(tiny_checkpoint, tmp_path):
    (tmp_path / "src.txt").write_text("a b c\nd e\n\nf g h i\n")
    (tmp_path / "ref.txt").write_text("c b a\ne d\nj\n\n")
    result = _cli(tiny_checkpoint, "--score-reference", "--target", tmp_path / "ref.txt", "--input", tmp_path / "src.txt",
                  "--batch-size", "2", "--lenpen", "0.5")
    assert result.returncode == 0, result.stderr.decode()
    rows = [line.split("\t") for line in result.stdout.decode().splitlines()]
    assert [r[0] for r in rows] == ["0", "1", "2", "3"] and all(len(r) == 5 for r in rows)
    assert [r[2].replace(" ", "") for r in rows] == ["cba", "ed", "j", ""]
    for index, score, _, total, average in rows:
        total, tokens = float(total), round(float(total) / float(average))
        assert float(score) == pytest.approx(total / tokens ** 0.5, abs=2e-3)
        assert total < 0
    # the same numbers from the Python API, and from stdin; batching does not change them
    t = Translator.load(tiny_checkpoint, device="cpu", batch_size=1)
    scores = list(t.score(["a b c", "d e", "", "f g h i"], ["c b a", "e d", "j", ""]))
    assert [f"{s.logprob:.4f}" for s in scores] == [r[3] for r in rows]
    piped = _cli(tiny_checkpoint, "--score-reference", "--target", tmp_path / "ref.txt", "--lenpen", "0.5", "--batch-size", "2",
                 stdin=(tmp_path / "src.txt").read_bytes())
    assert piped.stdout == result.stdout


@pytest.mark.system
def test_unequal_line_counts_are_one_clear_error(tiny_checkpoint, tmp_path):
    (tmp_path / "src.txt").write_text("a\nb\nc\n")
    (tmp_path / "ref.txt").write_text("a\nb\n")
    result = _cli(tiny_checkpoint, "--score-reference", "--target", tmp_path / "ref.txt", "--input", tmp_path / "src.txt")
    err = result.stderr.decode()
    assert result.returncode == 1 and result.stdout == b""
    assert err.strip().count("\n") == 0
    assert f"{tmp_path / 'src.txt'} has 3 lines but {tmp_path / 'ref.txt'} has 2" in err
    # from a pipe the counts are known at the end: longer and shorter input
    for data, n in ((b"a\nb\nc\nd\n", 4), (b"a\n", 1)):
        result = _cli(tiny_checkpoint, "--score-reference", "--target", tmp_path / "ref.txt", stdin=data)
        assert result.returncode == 1 and "Traceback" not in result.stderr.decode()
        assert f"<stdin> has {n} lines but {tmp_path / 'ref.txt'} has 2" in result.stderr.decode()


@pytest.mark.integration
def test_api_refuses_unequal_lists(tiny_checkpoint):
    t = Translator.load(tiny_checkpoint, device="cpu", chunk_lines=2)
    with pytest.raises(InputError, match="3 sources but 2 references"):
        list(t.score(["a", "b", "c"], ["a", "b"]))
    with pytest.raises(InputError, match="2 sources but 5 references"):
        list(t.score(["a", "b"], ["a", "b", "c", "d", "e"]))


@pytest.mark.parametrize("args, message", [
    (["--score-reference"], "--score-reference needs --target FILE"),
    (["--target", "ref.txt"], "add --score-reference"),
    (["--score-reference", "--target", "ref.txt", "--sampling"], "drop --sampling"),
    (["--score-reference", "--target", "absent.txt"], "absent.txt: no such file"),
])
@pytest.mark.integration
def test_score_reference_option_mistakes(tiny_checkpoint, tmp_path, monkeypatch, args, message):
    from typer.testing import CliRunner

    from seqtool.cli import app

    (tmp_path / "ref.txt").write_text("a\n")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["translate", "-c", str(tiny_checkpoint), *args], input="a\n")
    assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output, result.output
