"""The command line: help, options reaching the library call, clear errors, instant --help."""

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seqtool.cli import app

runner = CliRunner()
COMMANDS = ["train-tokenizer", "binarize", "train", "translate", "attention", "score", "average"]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.unit
def test_every_command_has_help(command):
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0
    assert "Usage" in result.output


@pytest.mark.system
def test_help_does_not_import_torch():
    code = "import sys; from seqtool.cli import app\ntry:\n    app(['--help'])\nexcept SystemExit:\n    pass\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.system
def test_python_dash_m_works_like_the_script():
    out = subprocess.run([sys.executable, "-m", "seqtool", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "translate" in out.stdout


@pytest.mark.unit
def test_train_options_reach_the_library_call(monkeypatch, tmp_path):
    import seqtool.training.train

    seen = {}

    def fake_train(job):
        seen["job"] = job
        from seqtool.training.train import TrainResult
        return TrainResult(1, 0.1, 1.0, 1.0, 10, 1.0, 0, job.save_dir, "max-updates")

    monkeypatch.setattr(seqtool.training.train, "train", fake_train)
    result = runner.invoke(app, ["train", str(tmp_path / "data"), "--save-dir", str(tmp_path / "run"), "--arch", "tiny",
                                 "--max-tokens", "1234", "--lr", "5e-4", "--warmup", "77", "--label-smoothing", "0.2",
                                 "--dropout", "0.3", "--clip-norm", "0.5", "--max-updates", "9", "--max-epochs", "3",
                                 "--max-time", "20m", "--precision", "bf16", "--device", "cpu", "--seed", "5", "--threads", "2"])
    assert result.exit_code == 0, result.output
    job = seen["job"]
    assert job.data_dir == tmp_path / "data" and job.raw is None
    assert (job.model.d_model, job.model.encoder_layers, job.model.dropout) == (128, 2, 0.3)
    assert (job.optim.lr, job.optim.warmup, job.optim.label_smoothing, job.optim.clip_norm) == (5e-4, 77, 0.2, 0.5)
    t = job.train
    assert (t.max_tokens, t.max_updates, t.max_epochs, t.max_time, t.precision, t.device, t.seed, t.threads) == (1234, 9, 3, 1200.0, "bf16", "cpu", 5, 2)


@pytest.mark.unit
def test_train_on_raw_files_and_config_file(monkeypatch, tmp_path):
    import seqtool.training.train

    seen = {}
    monkeypatch.setattr(seqtool.training.train, "train", lambda job: seen.setdefault("job", job) and (_ for _ in ()).throw(SystemExit(0)))
    cfg = tmp_path / "c.toml"
    cfg.write_text('arch = "base"\n[model]\ndropout = 0.25\n[optim]\nlr = 0.002\n[train]\nmax_updates = 11\n')
    runner.invoke(app, ["train", "--src", "es", "--tgt", "en", "--train", "p/train", "--valid", "p/valid",
                                 "--vocab-size", "500", "--save-dir", str(tmp_path / "r"), "--config", str(cfg), "--lr", "0.003"])
    job = seen["job"]
    assert job.raw.train_prefix == "p/train" and job.raw.valid_prefix == "p/valid" and job.raw.tokenizer.vocab_size == 500
    assert job.model.d_model == 512 and job.model.dropout == 0.25
    assert job.optim.lr == 0.003  # the command line wins over the file
    assert job.train.max_updates == 11 and job.train.src_lang == "es"


@pytest.mark.unit
def test_translate_options_reach_the_library_call(monkeypatch, tmp_path):
    import seqtool.files
    import seqtool.translate

    seen = {}

    def fake(checkpoint, config, options, io, input_path=None, output=None):
        seen.update(checkpoint=checkpoint, config=config, options=options, io=io, input=input_path)
        return 0

    monkeypatch.setattr(seqtool.files, "translate_file", fake)
    result = runner.invoke(app, ["translate", "-c", "m.pt", "--beam", "4", "--lenpen", "0.6", "--nbest", "2",
                                 "--max-tokens", "100", "--batch-size", "7", "--max-len-a", "1.5", "--max-len-b", "9",
                                 "--device", "cpu", "--threads", "1", "--input", "in.txt", "--print-alignment", "--alignment-layer", "2"])
    assert result.exit_code == 0, result.output
    c, o, io = seen["config"], seen["options"], seen["io"]
    assert (o.beam, o.lenpen, o.nbest, c.max_tokens, c.batch_size, o.max_len_a, o.max_len_b, c.device, c.threads) == (4, 0.6, 2, 100, 7, 1.5, 9, "cpu", 1)
    assert (io.print_alignment, c.alignment_layer, io.print_scores) == (True, 2, False)
    assert seen["checkpoint"] == Path("m.pt") and seen["input"] == Path("in.txt")


@pytest.mark.unit
def test_binarize_and_tokenizer_options_reach_the_library(monkeypatch):
    import seqtool.binarize
    import seqtool.tokenizer

    seen = {}
    monkeypatch.setattr(seqtool.tokenizer, "train_tokenizer", lambda files, prefix, config, force: seen.update(files=files, prefix=prefix, config=config) or Path("x.model"))
    result = runner.invoke(app, ["train-tokenizer", "a.txt", "b.txt.gz", "--model-prefix", "tok/spm", "--vocab-size", "321",
                                 "--model-type", "unigram", "--character-coverage", "0.9995", "--input-sentence-size", "1000", "--byte-fallback"])
    assert result.exit_code == 0, result.output
    c = seen["config"]
    assert seen["files"] == [Path("a.txt"), Path("b.txt.gz")] and seen["prefix"] == "tok/spm"
    assert (c.vocab_size, c.model_type, c.character_coverage, c.input_sentence_size, c.byte_fallback) == (321, "unigram", 0.9995, 1000, True)

    def fake_binarize(src, tgt, splits, tokenizer, out, workers, errors, force):
        seen.update(src=src, tgt=tgt, splits=[(s.name, s.prefix) for s in splits], workers=workers, errors=errors)
        return {"splits": {}}

    monkeypatch.setattr(seqtool.binarize, "binarize", fake_binarize)
    result = runner.invoke(app, ["binarize", "--src", "es", "--tgt", "en", "--train", "d/train", "--test", "d/test",
                                 "--tokenizer", "t.model", "--out", "bin", "--workers", "3", "--errors", "replace"])
    assert result.exit_code == 0, result.output
    assert seen["splits"] == [("train", "d/train"), ("test", "d/test")] and seen["workers"] == 3 and seen["errors"] == "replace"


@pytest.mark.parametrize("args, message", [
    (["train", "--save-dir", "x"], "give a DATA_DIR"),
    (["train", "nodata", "--save-dir", "x", "--precision", "fp8"], "--precision must be"),
    (["train", "nodata", "--save-dir", "x", "--max-time", "soon"], "cannot read duration"),
    (["translate", "-c", "missing.pt"], "missing.pt: no such checkpoint"),
    (["translate", "-c", "m.pt", "--beam", "2", "--nbest", "3"], "--nbest must be between"),
    (["translate", "-c", "m.pt", "--print-alignment", "--alignment-layer", "-1"], "--alignment-layer must be in [0, 1024], got -1"),
    (["binarize", "--src", "es", "--tgt", "es", "--train", "x", "--tokenizer", "t", "--out", "o"], "both 'es'"),
    (["score", "--ref", "nope.txt", "--hyp", "nope.txt"], "nope.txt: no such file"),
    (["average", "a.pt", "--output", "o.pt"], "a.pt: no such checkpoint"),
])
@pytest.mark.unit
def test_user_mistakes_get_one_clear_line(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert message in result.output
    assert "Traceback" not in result.output


@pytest.mark.integration
def test_score_reads_stdin_and_prints_json(tmp_path):
    ref = tmp_path / "ref.txt"
    ref.write_text("the cat sat on the mat\nhello world\n")
    result = runner.invoke(app, ["score", "--ref", str(ref), "--metrics", "bleu,chrf,ter", "--json"],
                           input="the cat sat on the mat\nhello world\n")
    assert result.exit_code == 0, result.output
    import json
    scores = json.loads(result.stdout)
    assert scores["bleu"]["score"] == 100.0 and scores["chrf"]["score"] == 100.0 and scores["ter"]["score"] == 0.0
    assert scores["bleu"]["signature"].startswith("nrefs:1")


@pytest.mark.integration
def test_score_with_two_references_and_tokenizer(tmp_path):
    (tmp_path / "r1").write_text("a b c d\n")
    (tmp_path / "r2").write_text("a b c e\n")
    (tmp_path / "h").write_text("a b c e\n")
    result = runner.invoke(app, ["score", "--ref", str(tmp_path / "r1"), "--ref", str(tmp_path / "r2"), "--hyp", str(tmp_path / "h"),
                                 "--tokenize", "intl"])
    assert result.exit_code == 0, result.output
    assert "100.00" in result.stdout and "nrefs:2" in result.stdout and "tok:intl" in result.stdout


@pytest.mark.integration
def test_score_refuses_unequal_line_counts(tmp_path):
    (tmp_path / "r").write_text("a\nb\n")
    result = runner.invoke(app, ["score", "--ref", str(tmp_path / "r")], input="a\n")
    assert result.exit_code == 1 and "<stdin> has 1 lines but" in result.output


@pytest.mark.integration
def test_score_refuses_unknown_tokenizer(tmp_path):
    (tmp_path / "r").write_text("a\n")
    result = runner.invoke(app, ["score", "--ref", str(tmp_path / "r"), "--tokenize", "klingon"], input="a\n")
    assert result.exit_code == 1 and "unknown --tokenize" in result.output


@pytest.mark.unit
def test_every_command_help_tells_the_truth():
    """Every command's help as a user sees it: each option with help, a value option with its default
    (where it has one) and a metavar by name, a flag with none; nothing taken for markup (the
    [tensorboard] extra), no typer type labels (<int>, <list[Path]>, {files}), no help ending in
    " .", and usage lines that name the arguments; --version answers."""
    import re

    import typer.main

    group = typer.main.get_command(app)
    assert len(group.commands) >= 10
    for name, command in group.commands.items():
        result = runner.invoke(app, [name, "--help"], terminal_width=2000)
        assert result.exit_code == 0, (name, result.output)
        text = result.output
        assert not re.search(r"<(int|float|str|bool|path|list\[\w+\])>|\{\w+\}", text, re.I), (name, text)
        assert not re.search(r" \.(\s|$)", text) and ".." not in text.replace("...", ""), name
        usage = text.splitlines()[0]
        ctx = type(group.make_context("seqtool", [name, "--help"], resilient_parsing=True))(command, info_name=name)
        for param in command.params:
            if param.param_type_name == "argument":
                assert param.name.upper() in usage and param.help, (name, usage)
                continue
            flags, help_text = param.get_help_record(ctx)
            assert help_text.strip(), f"{name} {flags}: no help"
            if param.is_flag:
                assert not re.search(r"[A-Z]{2,}$", flags), f"{name}: a flag with a metavar: {flags!r}"
            elif param.default not in (None, "", [], ()) and not param.required:
                assert "[default: " in help_text, f"{name} {flags}: no default shown: {help_text!r}"
    assert "pip install 'seqtool[tensorboard]'" in runner.invoke(app, ["train", "--help"], terminal_width=2000).output
    version = runner.invoke(app, ["--version"])
    assert version.exit_code == 0 and re.fullmatch(r"seqtool \d+\.\d+\.\d+\S*\n", version.output)


@pytest.mark.unit
def test_a_setting_in_scope_reaches_every_front_end_and_a_toml_table(tmp_path, monkeypatch):
    """An option is declared once (fields.setting's scope): every SearchOptions field that a request may
    ask for is a field of both server APIs' request models, every translate field a translate option
    and a key of --config's [translate] table, which the command line overrides; a bad key or value
    is one line naming the file, the table and the key."""
    import seqtool.files
    import seqtool.translate
    from seqtool.config import DecodeConfig, Sampling, SearchOptions, TranslateConfig
    from seqtool.fields import scoped
    from seqtool.serving.schemas import LibreRequest, SamplingIn, TranslateIn

    assert set(scoped(SearchOptions, "request")) <= set(TranslateIn.model_fields)
    assert set(scoped(SearchOptions, "request")) - {"nbest"} <= set(LibreRequest.model_fields)
    assert set(scoped(Sampling, "request")) == set(SamplingIn.model_fields)
    seen = {}
    monkeypatch.setattr(seqtool.files, "translate_command", lambda checkpoints, input, output, given: seen.update(given))
    (tmp_path / "run.toml").write_text("[translate]\nbeam = 3\nmax_len_b = 50\nsampling = true\ntopk = 10\nsplit_sentences = \"never\"\n")
    result = runner.invoke(app, ["translate", "-c", "m.pt", "--config", str(tmp_path / "run.toml"), "--beam", "4"])
    assert result.exit_code == 0, result.output
    assert seen == {"beam": 4, "max_len_b": 50, "sampling": True, "topk": 10, "split_sentences": "never"}
    names = {f for cls in (SearchOptions, Sampling, DecodeConfig, TranslateConfig) for f in scoped(cls, "translate")}
    text = runner.invoke(app, ["translate", "--help"], terminal_width=2000).output
    assert all(f"--{n.replace('_', '-')}" in text for n in names) and len(names) >= 30
    for table, message in (("beam = \"five\"", "run.toml: [translate]: beam = 'five': expected an integer"),
                           ("colour = 1", "run.toml: [translate]: unknown setting(s) colour"),
                           ("sampling = 1", "run.toml: [translate]: sampling = 1: expected true or false")):
        (tmp_path / "run.toml").write_text(f"[translate]\n{table}\n")
        result = runner.invoke(app, ["translate", "-c", "m.pt", "--config", str(tmp_path / "run.toml")])
        assert result.exit_code == 1 and message in result.output, result.output


@pytest.mark.unit
def test_the_readme_option_tables_match_the_commands():
    """The README's CLI reference cannot drift from the commands: each command's table lists every one
    of its options, and a default written there (a number or a word) is the option's default."""
    import re

    import typer.main

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    group = typer.main.get_command(app)
    checked = 0
    for name, command in group.commands.items():
        head = re.search(rf"^### `seqtool {re.escape(name)}[ `].*$", readme, re.M)
        assert head, f"README: no section for seqtool {name}"
        rows = []
        for line in readme[head.end():].split("\n### ", 1)[0].splitlines():
            if line.startswith("| `-"):
                rows.append([cell.strip() for cell in line.strip("|").split("|")])
        assert rows, f"README: no option table for seqtool {name}"
        documented = {flag: row for row in rows for flag in re.findall(r"--[\w-]+", row[0])}
        for param in command.params:
            if param.param_type_name != "option" or param.name == "help":
                continue
            flag = next(o for o in param.opts if o.startswith("--"))
            assert flag in documented, f"README: seqtool {name}'s table lacks {flag}"
            cell = documented[flag][1]
            default = param.default
            number = re.match(r"-?[\d.]+(e-?\d+)?\b", cell.replace(",", ""))
            if len(re.findall(r"--[\w-]+", documented[flag][0])) > 1:
                continue  # (a row of several options: its defaults in order)
            if number and isinstance(default, (int, float)) and not isinstance(default, bool):
                assert float(number.group()) == float(default), f"README: seqtool {name} {flag}: {cell!r}, the default is {default!r}"
                checked += 1
            elif isinstance(default, str) and default and re.fullmatch(r"[\w.-]+", cell.split(" ")[0].strip("`")):
                assert cell.split(" ")[0].strip("`") == default, f"README: seqtool {name} {flag}: {cell!r}, the default is {default!r}"
                checked += 1
    assert checked >= 40
