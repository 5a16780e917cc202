"""`seqtool train`'s settings: its options, a TOML config file, the preset and the defaults, layered.

Owns reading the config file (its [model], [optim] and [train] tables, an arch key, durations such
as "20m") and the one loader the command calls (train_settings); the configs themselves and their
validation are config.py's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from .config import PRESETS, ModelConfig, OptimConfig, TrainConfig, model_config_for
from .fields import checked_settings
from .errors import ConfigError


_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([smhd]?)\s*$")


def parse_duration(text: str) -> float:
    """'90' -> 90 s, '20m' -> 1200 s, '1.5h' -> 5400 s."""
    match = _DURATION.match(text)
    if not match:
        raise ConfigError(f"cannot read duration {text!r}; use e.g. 90s, 20m, 1.5h")
    value, unit = float(match.group(1)), match.group(2) or "s"
    return value * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]


def load_toml(path: Path) -> dict[str, Any]:
    """A TOML file's tables, or a one-line error naming the file."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except OSError as error:
        raise ConfigError(f"{path}: cannot read config file: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from None
    return data


def read_toml(path: Path) -> dict[str, Any]:
    """A training config file has optional [model], [optim] and [train] tables whose keys are field names."""
    data = load_toml(path)
    unknown = sorted(set(data) - {"model", "optim", "train", "arch"})
    if unknown:
        raise ConfigError(f"{path}: unknown table(s) {', '.join(unknown)}; use [model], [optim], [train]")
    if "arch" in data and not (isinstance(data["arch"], str) and data["arch"] in PRESETS):
        raise ConfigError(f"{path}: arch = {data['arch']!r}: expected one of {', '.join(PRESETS)}")
    train = data.get("train")
    if isinstance(train, dict) and isinstance(train.get("max_time"), str):  # max_time = "20m", as --max-time takes
        train["max_time"] = parse_duration(train["max_time"])
    for table, cls in (("model", ModelConfig), ("optim", OptimConfig), ("train", TrainConfig)):
        if table in data:
            if not isinstance(data[table], dict):
                raise ConfigError(f"{path}: {table} must be a table ([{table}]), got {data[table]!r}")
            data[table] = checked_settings(cls, data[table], f"{path}: [{table}]")
    return data


@dataclass(frozen=True)
class TrainSettings:
    """A training run's configs as the command line asked for them (see train_settings)."""
    model: ModelConfig
    optim: OptimConfig
    train: TrainConfig
    asked_model: dict[str, Any]  # the model settings asked for explicitly (--finetune checks them)


def train_settings(arch: str | None, options: dict[str, Any], config_file: Path | None = None) -> TrainSettings:
    """The one config loader of `seqtool train`: options (named as the fields they set; None = not
    given) over the TOML file's [model], [optim] and [train] tables, over the --arch preset (small
    unless the file names one) and the defaults. Each option lands in the config that has its field."""
    file_cfg = read_toml(config_file) if config_file else {}
    tables: dict[type, dict[str, Any]] = {cls: dict(file_cfg.get(name, {})) for name, cls in
                                          (("model", ModelConfig), ("optim", OptimConfig), ("train", TrainConfig))}
    owners = {f.name: cls for cls in (ModelConfig, OptimConfig, TrainConfig) for f in fields(cls) if f.init}
    for key, value in options.items():
        if key not in owners:
            raise TypeError(f"train_settings: {key!r} is no field of the model, optim or train config")
        if value is not None:
            tables[owners[key]][key] = value
    explicit_arch = arch is not None or "arch" in file_cfg
    arch = arch or file_cfg.get("arch", "small")
    model = model_config_for(arch, **tables[ModelConfig])
    asked = {**(PRESETS.get(arch, {}) if explicit_arch else {}), **tables[ModelConfig]}
    return TrainSettings(model, OptimConfig.from_dict(tables[OptimConfig]), TrainConfig.from_dict(tables[TrainConfig]), asked)
