"""config.py: settings from a TOML file are checked like options: unknown keys and wrong types are the
user's mistakes (one line naming the file, the table and the key), never a bug."""

import pytest

from seqtool.config import TrainConfig
from seqtool.errors import ConfigError


def _toml(tmp_path, text):
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, fragments", [
    ("[model]\nd_modle = 512\n", ["run.toml: [model]", "unknown setting(s) d_modle", "d_model"]),
    ('[train]\nmax_tokens = "big"\n', ["run.toml: [train]", "max_tokens = 'big'", "expected an integer"]),
    ("[optim]\nbetas = 0.9\n", ["run.toml: [optim]", "betas = 0.9", "expected a list of 2 numbers"]),
    ("[model]\npre_norm = 1\n", ["pre_norm = 1", "expected true or false"]),
    ('arch = "huge"\n', ["run.toml: arch = 'huge'", "expected one of"]),
    ("model = 3\n", ["model must be a table"]),
])
@pytest.mark.unit
def test_config_file_mistakes_name_the_file_and_key(tmp_path, text, fragments):
    from seqtool.settings import read_toml

    with pytest.raises(ConfigError) as info:
        read_toml(_toml(tmp_path, text))
    for fragment in fragments:
        assert fragment in str(info.value)


@pytest.mark.unit
def test_config_file_values_are_normalised(tmp_path):
    from seqtool.settings import read_toml

    data = read_toml(_toml(tmp_path, '[optim]\nbetas = [0.9, 0.98]\nlr = 1\n[train]\nmax_time = "20m"\n'))
    assert data["optim"]["betas"] == (0.9, 0.98) and data["optim"]["lr"] == 1 and data["train"]["max_time"] == 1200


@pytest.mark.parametrize("cls, value, words", [
    ("TrainConfig", dict(seed=-1), "--seed must be in [0, 2^32), got -1"),
    ("SearchOptions", dict(lenpen=float("nan")), "--lenpen must be a finite number, got nan"),
    ("SearchOptions", dict(lenpen=1000.0), "--lenpen must be in [0, 10], got 1000"),
    ("SearchOptions", dict(lenpen=-1e308), "--lenpen must be in [0, 10], got -1e+308"),
    ("SearchOptions", dict(max_len_b=10 ** 30), "--max-len-b must be in [0, 1,000,000], got 1e+30"),
    ("Sampling", dict(temperature=float("inf")), "--temperature must be a finite number, got inf"),
    ("OptimConfig", dict(betas=(0.9, float("nan"))), "--betas must be a finite number, got nan"),
    ("TrainConfig", dict(max_time=float("inf")), "--max-time must be a finite number, got inf"),
    ("TrainConfig", dict(max_tokens=2 ** 70), "--max-tokens must be in [-2^63, 2^63), got 2^70"),
    ("ModelConfig", dict(d_ff=-5), "model.d_ff must be in [1, 2^18], got -5"),
    ("ModelConfig", dict(dropout=1.5), "--dropout must be in [0, 1), got 1.5"),
    ("ServeConfig", dict(port=70000), "--port must be in [0, 65,535], got 70,000"),
])
@pytest.mark.unit
def test_every_number_is_finite_and_in_its_declared_range(cls, value, words):
    """One rule for every config (the bounds declared with each field): one line naming the field, as
    the command line names it; the server renders the same error with its request fields."""
    import seqtool.config as config
    from seqtool.errors import FieldError

    with pytest.raises(FieldError) as info:
        getattr(config, cls)(**value)
    assert str(info.value) == words
    assert info.value.fields == [next(iter(value))]


@pytest.mark.unit
def test_a_rule_across_fields_names_them_in_each_front_end_s_words():
    from seqtool.config import SearchOptions
    from seqtool.errors import FieldError

    with pytest.raises(FieldError) as info:
        SearchOptions(beam=2, nbest=3)
    assert str(info.value) == "--nbest must be between 1 and --beam (2), got 3"
    assert info.value.render(str.upper) == "NBEST must be between 1 and BEAM (2), got 3"


@pytest.mark.parametrize("option, value, words", [
    ("--lenpen", "1000", "--lenpen must be in [0, 10], got 1000"),
    ("--lenpen", "nan", "--lenpen must be a finite number, got nan"),
    ("--max-len-b", str(10 ** 30), "--max-len-b must be in [0, 1,000,000], got 1e+30"),
])
@pytest.mark.system
def test_out_of_range_numbers_on_the_command_line_exit_1_naming_the_option(tiny_checkpoint, option, value, words):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "seqtool", "translate", "-c", str(tiny_checkpoint), option, value],
                            input="a b\n", capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stderr.strip() == f"error: {words}", result.stderr


@pytest.mark.unit
def test_config_file_mistakes_exit_1_on_the_command_line(tmp_path):
    from typer.testing import CliRunner

    from seqtool.cli import app

    result = CliRunner().invoke(app, ["train", str(tmp_path / "data"), "--save-dir", str(tmp_path / "run"),
                                      "--config", str(_toml(tmp_path, "[model]\nd_modle = 512\n"))])
    assert result.exit_code == 1 and "d_modle" in result.stderr and "unexpected" not in result.stderr


@pytest.mark.unit
def test_train_settings_layer_options_over_the_file_over_the_preset(tmp_path):
    """One loader for `seqtool train`: each option lands in the config owning its field; options
    given win over the TOML file, which wins over --arch's preset and the defaults; None = not given
    (so a file's precision or seed is no longer overridden by the option's default)."""
    from seqtool.config import PRESETS
    from seqtool.settings import train_settings

    toml = tmp_path / "run.toml"
    toml.write_text('arch = "tiny"\n[model]\ndropout = 0.3\n[optim]\nlr = 0.002\nwarmup = 10\n'
                    '[train]\nprecision = "fp32"\nseed = 7\nmax_time = "2m"\n')
    s = train_settings(None, dict(lr=0.005, dropout=None, seed=None, max_updates=9, compile=True, src_lang="es"), toml)
    assert (s.optim.lr, s.optim.warmup) == (0.005, 10)  # option over file; file over default
    assert (s.model.dropout, s.model.d_model) == (0.3, PRESETS["tiny"]["d_model"])  # file over the file's arch
    assert (s.train.precision, s.train.seed, s.train.max_time) == ("fp32", 7, 120.0)
    assert (s.train.max_updates, s.train.compile, s.train.src_lang) == (9, True, "es")
    assert s.asked_model["dropout"] == 0.3 and s.asked_model["d_model"] == PRESETS["tiny"]["d_model"]
    plain = train_settings(None, {})
    assert plain.model.d_model == PRESETS["small"]["d_model"] and "d_model" not in plain.asked_model  # no arch asked
    with pytest.raises(TypeError, match="no field"):
        train_settings(None, dict(tensorboard="x"))  # a misnamed option is a bug, not a user error
