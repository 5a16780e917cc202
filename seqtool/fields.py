"""A config field declared once: `setting()` gives a dataclass field its default, help, bounds, how
the command line names it and which front ends offer it (`scope`); `_Validated` checks every
bound and each class's own rules across fields, one FieldError naming the field in the words of
whichever front end was used. config.py declares the configs with it; options.py makes command-line
options of them, serving/schemas.py request fields."""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from dataclasses import field, fields
from typing import Any

from .errors import ConfigError, FieldError


class _Config:
    """Shared to_dict/from_dict for the dataclasses below."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = ""):
        """The config of these settings; unknown keys and values of the wrong type are refused,
        naming `where` (e.g. "run.toml: [train]") and the key."""
        return cls(**checked_settings(cls, data, where or cls.__name__))

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


def checked_settings(cls, data: dict[str, Any], where: str) -> dict[str, Any]:
    """data's keys must be fields of the dataclass cls and its values of their types (an int is a
    valid float; a list of the right length a valid tuple, returned as one)."""
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls) if f.init}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    out = {}
    for key, value in data.items():
        if not _conforms(value, hints[key]):
            raise ConfigError(f"{where}: {key} = {value!r}: expected {_describe(hints[key])}")
        nested = [a for a in (typing.get_args(hints[key]) or (hints[key],)) if isinstance(a, type) and issubclass(a, _Config)]
        if nested and isinstance(value, dict):  # a config inside a config (SearchOptions.sampling)
            value = nested[0].from_dict(value, f"{where}: {key}")
        elif typing.get_origin(hints[key]) is tuple:
            value = tuple(value)
        elif hints[key] is str and isinstance(value, os.PathLike):
            value = str(value)
        out[key] = value
    return out


def _conforms(value: Any, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, (str, os.PathLike))
    if origin is tuple:
        return isinstance(value, (list, tuple)) and len(value) == len(args) and all(map(_conforms, value, args))
    if isinstance(hint, type) and issubclass(hint, _Config):
        return isinstance(value, (dict, hint))
    return True  # anything else is the dataclass's own check


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is tuple:
        return f"a list of {len(args)} " + ("numbers" if all(a in (int, float) for a in args) else "values")
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "nothing"}.get(hint, str(hint))


INT64 = 2 ** 63


def setting(default: Any, help: str = "", *, ge: Any = None, gt: Any = None, le: Any = None, lt: Any = None,
            option: str = "", short: str = "", metavar: str = "", scope: str = "") -> Any:
    """A config field with what every front end needs to know of it, declared once: its default,
    its help, its bounds (every number must also be finite and, for an int, fit int64), where the
    command line names it otherwise than --field-name its option (and a short one), the metavar its
    value shows in help (else the type's), and `scope`: the front ends that offer it, space-separated
    of train, translate, serve (the server's defaults), request (a request to either server API) and
    attention. A field offered nowhere is set in code, a checkpoint or a TOML file only."""
    return field(default=default, metadata={"help": help, "ge": ge, "gt": gt, "le": le, "lt": lt, "option": option,
                                            "short": short, "metavar": metavar, "scope": frozenset(scope.split())})


def field_info(cls, name: str) -> dict[str, Any]:
    """A field's metadata (help, bounds, option, short, metavar, scope) and its default: what the CLI
    and the server's request models take from it."""
    f = next(f for f in fields(cls) if f.name == name)
    return {"help": "", "ge": None, "gt": None, "le": None, "lt": None, "option": "", "short": "", "metavar": "",
            "scope": frozenset(), **f.metadata, "default": f.default}


def scoped(cls, scope: str) -> list[str]:
    """The names of cls's fields that the front end `scope` offers, in declaration order."""
    return [f.name for f in fields(cls) if scope in f.metadata.get("scope", ())]


def _options(cls) -> dict[str, str]:
    """How the command line names each field: its `option`, else the class's naming."""
    return {f.name: f.metadata.get("option", "").split("/")[0] or cls.NAMING.format(f.name.replace("_", "-") if cls.NAMING.startswith("--") else f.name)
            for f in fields(cls)}


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int) and abs(value) >= 2 ** 16 and value & (value - 1) == 0:
        return f"2^{value.bit_length() - 1}"
    return f"{value:.3g}" if isinstance(value, int) and abs(value) >= 10 ** 15 else f"{value:,}" if isinstance(value, int) and abs(value) >= 10_000 else str(value)


def _check_bounds(config) -> None:
    """Every numeric field finite and within its declared bounds: one FieldError naming it."""
    for f in fields(config):
        value = getattr(config, f.name)
        for v in value if isinstance(value, tuple) else (value,):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            problem = None
            m = f.metadata
            low = (m["ge"], ">=") if m.get("ge") is not None else (m["gt"], ">") if m.get("gt") is not None else None
            high = (m["le"], "<=") if m.get("le") is not None else (m["lt"], "<") if m.get("lt") is not None else None
            if isinstance(v, float) and not math.isfinite(v):
                problem = "a finite number"
            elif not ((low is None or (v >= low[0] if low[1] == ">=" else v > low[0])) and
                      (high is None or (v <= high[0] if high[1] == "<=" else v < high[0]))):
                if low and high:
                    problem = f"in {'[' if low[1] == '>=' else '('}{_number(low[0])}, {_number(high[0])}{']' if high[1] == '<=' else ')'}"
                else:
                    problem = " ".join((bound := low or high)[1:] + (_number(bound[0]),))
            elif isinstance(v, int) and not -INT64 <= v < INT64:
                problem = "in [-2^63, 2^63)"
            if problem:
                raise FieldError(f"`{f.name}` must be {problem}, got {_number(v)}", _options(type(config)))


class _Validated(_Config):
    """Bounds first (declared with each field), then the config's own rules across fields."""

    NAMING: typing.ClassVar[str] = "--{}"  # a field without an option of its own: --field-name

    def __post_init__(self):
        _check_bounds(self)
        self.validate()

    def validate(self) -> None:
        pass

    def _check(self, condition: bool, template: str) -> None:
        """A rule across fields: its message names them in backquotes (`beam`) for FieldError."""
        if not condition:
            raise FieldError(template, _options(type(self)))


def split(given: dict[str, Any], *classes) -> list[dict[str, Any]]:
    """`given` (field name -> value) divided among the configs that have each field (the first that
    has it), and, last, what none of them has."""
    out: list[dict[str, Any]] = [{} for _ in range(len(classes) + 1)]
    names = [{f.name for f in fields(cls)} for cls in classes]
    for key, value in given.items():
        out[next((k for k, known in enumerate(names) if key in known), len(classes))][key] = value
    return out
