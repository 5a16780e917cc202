"""The Python API (`from seqtool import Translator`) as README documents it, and the new
translate options reaching the library from the command line."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from seqtool.cli import app
from seqtool.config import ConfigError

from conftest import process_running

pytestmark = pytest.mark.system

README = Path(__file__).resolve().parents[1] / "README.md"


def _readme_example() -> str:
    section = README.read_text(encoding="utf-8").split("## Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_example_runs_as_written(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    code = _readme_example()
    paths = sorted(set(re.findall(r'"(runs/[^"]+\.pt)"', code)))
    assert len(paths) >= 2  # one model, and a second one for the ensemble
    for name in paths:  # the documented files, here copies of a tiny model
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(tiny_checkpoint, tmp_path / name)
    (tmp_path / "news.es").write_text("a b c\nd e\nf\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    # str, list, 3 file lines, nbest, samples, then one call's own SearchOptions: greedy, 3-best, 2 samples; one score
    assert len(printed) == 1 + 1 + 3 + 1 + 1 + 3 + 1
    assert all(printed[k].startswith("[") for k in (1, 5, 6, 8, 9)) and not printed[7].startswith("[")


@pytest.fixture(scope="module")
def api(tiny_checkpoint):
    from seqtool import Translator

    return Translator, tiny_checkpoint


def test_import_from_the_package_is_the_translator(api):
    import seqtool.files
    import seqtool.translate

    Translator, _ = api
    assert Translator is seqtool.translate.Translator


def test_translate_returns_what_it_was_given(api):
    Translator, ckpt = api
    t = Translator.load(ckpt, device="cpu", beam=2, max_len_a=0.0, max_len_b=5)
    one = t.translate("a b")
    assert isinstance(one, str)
    assert t.translate(["a b", "", "c"]) == [one, "", t.translate("c")]
    assert t.translate(("a b",)) == [one]
    pairs = Translator.load(ckpt, device="cpu", beam=3, nbest=2, max_len_a=0.0, max_len_b=5).translate(["a b", ""])
    assert [len(p) for p in pairs] == [2, 2] and pairs[0][0] == Translator.load(ckpt, device="cpu", beam=3, max_len_a=0.0, max_len_b=5).translate("a b")


def test_an_iterator_is_translated_lazily(api):
    Translator, ckpt = api
    t = Translator.load(ckpt, device="cpu", beam=1, max_len_a=0.0, max_len_b=4, chunk_lines=3)
    pulled = []

    def lines():
        for i in range(10):
            pulled.append(i)
            yield "a b\n"

    out = t.translate(lines())
    assert pulled == []  # nothing read until asked
    first = next(out)
    assert len(pulled) == 3 and first == t.translate("a b")  # one chunk read; the \n is not part of the line
    assert len(list(out)) == 9 and len(pulled) == 10


def test_load_takes_decode_options_and_refuses_unknown_ones(api, tiny_checkpoint):
    Translator, ckpt = api

    t = Translator.load(ckpt, beam=3, device="cpu", nbest=2)
    assert (t.options.beam, t.options.nbest, t.config.device) == (3, 2, "cpu")
    with pytest.raises(ConfigError, match="unknown setting.*bem"):
        Translator.load(ckpt, bem=3)
    with pytest.raises(ConfigError, match="--topk"):
        Translator.load(ckpt, topk=5)  # without sampling=True


def test_samples_do_not_depend_on_batching_or_chunking(api):
    Translator, ckpt = api
    lines = ["a b c", "d", "", "e f g h", "i j"] * 3
    options = dict(device="cpu", sampling=True, nbest=2, topk=10, seed=11, max_len_a=0.0, max_len_b=6)
    reference = Translator.load(ckpt, **options).translate(lines)
    for batching in (dict(batch_size=1), dict(batch_size=4, chunk_lines=4), dict(max_tokens=7, chunk_lines=2)):
        assert Translator.load(ckpt, **options, **batching).translate(lines) == reference
    assert Translator.load(ckpt, **dict(options, seed=12)).translate(lines) != reference


# ---- the command line -----------------------------------------------------------------------

runner = CliRunner()


def _seen_by_translate_file(monkeypatch, args):
    import seqtool.files
    import seqtool.translate

    seen = {}

    def fake(checkpoint, config, options, io, input_path=None, output=None):
        seen.update(checkpoint=checkpoint, config=config, options=options, io=io)
        return 0

    monkeypatch.setattr(seqtool.files, "translate_file", fake)
    result = runner.invoke(app, ["translate", *args])
    assert result.exit_code == 0, result.output
    return seen


def test_sampling_options_reach_the_library_call(monkeypatch):
    seen = _seen_by_translate_file(monkeypatch, ["-c", "m.pt", "--sampling", "--topk", "8", "--topp", "0.9",
                                                 "--temperature", "0.7", "--seed", "123", "--nbest", "9"])
    o = seen["options"]
    assert (o.sampling.topk, o.sampling.topp, o.sampling.temperature, o.sampling.seed, o.nbest) == (8, 0.9, 0.7, 123, 9)
    assert seen["checkpoint"] == Path("m.pt")


def test_score_reference_and_ensemble_options_reach_the_library_call(monkeypatch):
    seen = _seen_by_translate_file(monkeypatch, ["-c", "a.pt", "--checkpoint", "b.pt", "-c", "c.pt", "--score-reference",
                                                 "--target", "ref.txt"])
    assert seen["checkpoint"] == [Path("a.pt"), Path("b.pt"), Path("c.pt")]
    assert (seen["io"].score_reference, seen["io"].target) == (True, "ref.txt")


@pytest.mark.parametrize("args, message", [
    (["--topk", "5"], "add --sampling"),
    (["--sampling", "--topp", "0"], "--topp must be in (0, 1]"),
    (["--sampling", "--temperature", "0"], "--temperature must be in (0, 1000], got 0"),
    (["--sampling", "--topk", "-1"], "--topk must be in [0, 2^31), got -1"),
    (["--score-reference", "--target", "r.txt", "--nbest", "2"], "drop --nbest"),
])
def test_option_mistakes_get_one_clear_line(args, message):
    result = runner.invoke(app, ["translate", "-c", "m.pt", *args])
    assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output


def test_cli_sampling_is_reproducible(tiny_checkpoint):
    def run(seed):
        result = subprocess.run([sys.executable, "-m", "seqtool", "translate", "-c", str(tiny_checkpoint), "--sampling",
                                 "--nbest", "3", "--seed", str(seed), "--max-len-a", "0", "--max-len-b", "6", "--device", "cpu"],
                                input=b"a b c\nd e\n\nf\n", capture_output=True, timeout=120)
        assert result.returncode == 0, result.stderr.decode()
        return result.stdout.decode()

    first = run(5)
    rows = [line.split("\t") for line in first.splitlines()]
    assert [r[0] for r in rows] == ["0"] * 3 + ["1"] * 3 + ["2"] * 3 + ["3"] * 3 and all(len(r) == 3 for r in rows)
    assert run(5) == first  # (another seed giving other samples: test_samples_do_not_depend_on_batching_or_chunking)


def test_workers_option_reaches_the_library_call(monkeypatch):
    seen = _seen_by_translate_file(monkeypatch, ["-c", "m.pt", "--workers", "2", "--threads", "4"])
    assert (seen["config"].workers, seen["config"].threads) == (2, 4)


@pytest.mark.parametrize("args, message", [
    (["--workers", "0"], "--workers must be in [1, 1024], got 0"),
    (["--workers", "3", "--threads", "2"], "--workers 3 needs at least one thread each"),
])
def test_workers_mistakes_get_one_clear_line(args, message):
    result = runner.invoke(app, ["translate", "-c", "m.pt", *args])
    assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output


def test_worker_processes_translate_exactly_as_one_process(api, tmp_path):
    """Two decoding processes of one thread each give, line for line and in input order, what one
    process with one thread gives: beam search with n-best, scores and alignments, and sampling
    (its numbers depend on the line, not on the process)."""
    Translator, ckpt = api
    lines = [" ".join("abcdefgh"[(i * j) % 8] for j in range(1 + i % 7)) for i in range(40)] + [""]
    options = dict(device="cpu", beam=3, nbest=2, max_len_a=0.0, max_len_b=8, batch_size=4, print_alignment=True)
    one = Translator.load(ckpt, threads=1, **options)
    with Translator.load(ckpt, threads=2, workers=2, **options) as two:
        assert two.pool is not None and two.pool.n == 2
        got, want = two.translate_chunk(0, lines), one.translate_chunk(0, lines)
        assert [(t.index, t.texts, [h.tokens for h in t.hypotheses], t.alignments) for t in got] == \
               [(t.index, t.texts, [h.tokens for h in t.hypotheses], t.alignments) for t in want]
        assert [h.score for t in got for h in t.hypotheses] == pytest.approx([h.score for t in want for h in t.hypotheses])
    assert two.pool is None  # closed
    sampled = dict(device="cpu", sampling=True, nbest=2, max_len_a=0.0, max_len_b=8, batch_size=3, seed=7)
    with Translator.load(ckpt, threads=2, workers=2, **sampled) as two:
        assert not isinstance(two.model, torch.nn.Module)  # the workers hold the models: N workers, N models
        assert two.translate(lines) == Translator.load(ckpt, threads=1, **sampled).translate(lines)
        # a request's own search options reach the workers: here a beam search with 2-best
        from seqtool.config import SearchOptions

        asked = SearchOptions(beam=3, nbest=2, max_len_a=0.0, max_len_b=8)
        assert two.translate(lines, asked) == one.translate(lines, asked)


def _translating_with_two_workers(checkpoint) -> tuple[subprocess.Popen, list[int]]:
    """`translate --workers 2` reading a pipe, one line translated (so both workers are up), and their PIDs."""
    proc = subprocess.Popen([sys.executable, "-m", "seqtool", "translate", "-c", str(checkpoint), "--device", "cpu",
                             "--threads", "2", "--workers", "2", "--max-len-a", "0", "--max-len-b", "4"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdin.write(b"a b\n")
    proc.stdin.flush()
    assert proc.stdout.readline()  # translating: the workers are up
    workers = [int(c) for c in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
    workers = [w for w in workers if b"spawn_main" in Path(f"/proc/{w}/cmdline").read_bytes()]
    assert len(workers) == 2
    return proc, workers


def test_worker_processes_end_with_their_parent_however_it_ends(tiny_checkpoint):
    # SIGKILL (as the OOM killer) leaves the parent no chance to stop them: the kernel does (PDEATHSIG)
    proc, workers = _translating_with_two_workers(tiny_checkpoint)
    proc.kill()
    proc.wait()

    deadline = time.time() + 20
    while any(map(process_running, workers)) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(map(process_running, workers))


def test_a_decoding_worker_killed_is_one_clear_error_not_a_hang(tiny_checkpoint):
    """SIGKILL of one `translate --workers 2` worker (as the OOM killer): the next batch ends the run
    with one line naming it, exit 1, and the other worker is stopped (procpool.WatchedPool)."""
    proc, workers = _translating_with_two_workers(tiny_checkpoint)
    os.kill(workers[1], signal.SIGKILL)
    _, err = proc.communicate(b"c d e\n" * 500, timeout=60)
    assert proc.returncode == 1, err
    assert [line for line in err.decode().splitlines() if line.startswith("error:")] == [
        f"error: a decoding worker process (PID {workers[1]}) died: killed, or out of memory; "
        "use fewer --workers or a smaller --batch-size"], err
    deadline = time.time() + 20
    while any(map(process_running, workers)) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(map(process_running, workers))


def test_cli_workers_write_every_line_in_order(tiny_checkpoint):
    lines = "".join(f"{'a b c d'[: 1 + i % 7]}\n" for i in range(30))
    outs = []
    for extra in (["--threads", "1"], ["--threads", "2", "--workers", "2", "--batch-size", "4"]):
        result = subprocess.run([sys.executable, "-m", "seqtool", "translate", "-c", str(tiny_checkpoint), "--max-len-a", "0", "--max-len-b", "6",
                                 "--device", "cpu", "--print-scores", *extra], input=lines.encode(), capture_output=True, timeout=180)
        assert result.returncode == 0, result.stderr.decode()
        outs.append(result.stdout.decode().splitlines())
    assert [r.split("\t")[0] for r in outs[1]] == [str(i) for i in range(30)]
    assert [r.split("\t")[2] for r in outs[1]] == [r.split("\t")[2] for r in outs[0]]
