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
def test_config_file_mistakes_name_the_file_and_key(tmp_path, text, fragments):
    from seqtool.config import read_toml

    with pytest.raises(ConfigError) as info:
        read_toml(_toml(tmp_path, text))
    for fragment in fragments:
        assert fragment in str(info.value)


def test_config_file_values_are_normalised(tmp_path):
    from seqtool.config import read_toml

    data = read_toml(_toml(tmp_path, '[optim]\nbetas = [0.9, 0.98]\nlr = 1\n[train]\nmax_time = "20m"\n'))
    assert data["optim"]["betas"] == (0.9, 0.98) and data["optim"]["lr"] == 1 and data["train"]["max_time"] == 1200


def test_a_negative_seed_is_a_setting_error():
    with pytest.raises(ConfigError, match="--seed must be between 0"):
        TrainConfig(seed=-1)


def test_config_file_mistakes_exit_1_on_the_command_line(tmp_path):
    from typer.testing import CliRunner

    from seqtool.cli import app

    result = CliRunner().invoke(app, ["train", str(tmp_path / "data"), "--save-dir", str(tmp_path / "run"),
                                      "--config", str(_toml(tmp_path, "[model]\nd_modle = 512\n"))])
    assert result.exit_code == 1 and "d_modle" in result.stderr and "unexpected" not in result.stderr
