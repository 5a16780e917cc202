"""Command-line options made from the configs' fields, so that an option is declared once (fields.setting).

A command names its scope and the configs it reads, `@options("translate", SearchOptions, Sampling,
...)`, and gets every field those configs offer in that scope as an option: the field's flag, help,
default and metavar, plus `--config FILE`, a TOML file whose `[translate]` table sets the same
settings by their field names. The command receives `given`: only what the command line or the
file said (the command line wins), so a checkpoint's recorded defaults still apply where the user
said nothing, and each config's own checks (FieldError, worded for the command line) validate it;
the server's request models take the same fields (serving/schemas.py).

`Command` is the click command class of every seqtool command: the help shows no value for a flag,
a value's metavar by its kind (INT, NUMBER, TEXT, PATH, or the field's own), and arguments by name.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer
from typer.core import TyperArgument, TyperCommand, TyperOption

from .errors import ConfigError
from .fields import _Config, checked_settings, field_info, scoped

METAVARS = {int: "INT", float: "NUMBER", str: "TEXT", Path: "PATH"}


class Command(TyperCommand):
    """A seqtool command's help: flags without a value, values by their kind, arguments by name."""

    def format_help(self, ctx, formatter) -> None:
        for param in self.params:
            if param.metavar is not None:
                continue
            if isinstance(param, TyperArgument):  # FILES... (typer: "files... <list[Path]>")
                param.metavar = param.name.upper() + ("..." if param.nargs != 1 else "")
                param.display_type_rich = lambda ctx: None
            elif isinstance(param, TyperOption) and not param.is_flag:
                kind = param.bare_type().removeprefix("list[").removesuffix("]")
                param.metavar = {"int": "INT", "float": "NUMBER", "Path": "PATH"}.get(kind, "TEXT")
        super().format_help(ctx, formatter)

    def collect_usage_pieces(self, ctx) -> list[str]:
        """The usage line: [OPTIONS] then each argument by name, optional ones in brackets (typer: {files}...)."""
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.params:
            if isinstance(param, TyperArgument):
                name = param.name.upper() + ("..." if param.nargs != 1 else "")
                pieces.append(name if param.required else f"[{name}]")
        return pieces


def command(app: typer.Typer, name: Optional[str] = None) -> Callable[[Callable], Callable]:
    """app.command with seqtool's help (Command) and its way of failing (exits.handles_user_errors)."""
    from .exits import handles_user_errors

    return lambda fn: app.command(name, cls=Command)(handles_user_errors(fn))


def print_version(value: bool) -> None:
    """--version's callback: `seqtool X.Y.Z`, from the installed package's metadata."""
    if value:
        from importlib.metadata import version

        typer.echo(f"seqtool {version('seqtool')}")
        raise typer.Exit()


def _kind(cls, name: str) -> type:
    """The command-line type of a field: a config inside a config (SearchOptions.sampling) is a flag."""
    hint = typing.get_type_hints(cls)[name]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) or (isinstance(hint, type) and issubclass(hint, _Config)):
        return bool
    return hint


def option_for(cls, name: str) -> tuple[type, Any, Any]:
    """(type, typer.Option, default) of field `name` of cls, all from its declaration."""
    info, kind = field_info(cls, name), _kind(cls, name)
    flags = (info["option"] or "--" + name.replace("_", "-"),) + ((info["short"],) if info["short"] else ())
    default = info["default"] if kind is not bool else bool(info["default"])
    shown = kind is not bool and default not in ("", None)
    metavar = None if kind is bool else info["metavar"] or METAVARS.get(kind, "VALUE")
    return kind, typer.Option(*flags, help=info["help"], metavar=metavar, show_default=shown), default


def owners(scope: str, classes) -> dict[str, type]:
    """Each option of `scope` with the config that declares it: one name, one field."""
    out: dict[str, type] = {}
    for cls in classes:
        for name in scoped(cls, scope):
            if name in out:
                raise TypeError(f"{name} is a {scope} field of both {out[name].__name__} and {cls.__name__}")
            out[name] = cls
    return out


def from_file(path: Path, scope: str, fields: dict[str, type]) -> dict[str, Any]:
    """The settings of a TOML file's [scope] table, each of its field's type, or a one-line error
    naming the file, table and key."""
    from .settings import load_toml

    data = load_toml(path)
    unknown = sorted(set(data) - {scope})
    if unknown:
        raise ConfigError(f"{path}: unknown table(s) {', '.join(unknown)}; `{scope}` reads only [{scope}]")
    table = data.get(scope, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: {scope} must be a table ([{scope}]), got {table!r}")
    where = f"{path}: [{scope}]"
    strange = sorted(set(table) - set(fields))
    if strange:
        raise ConfigError(f"{where}: unknown setting(s) {', '.join(strange)}; known: {', '.join(sorted(fields))}")
    out: dict[str, Any] = {}
    for key, value in table.items():
        if _kind(fields[key], key) is bool:  # (a flag: also SearchOptions.sampling, a config when set)
            if not isinstance(value, bool):
                raise ConfigError(f"{where}: {key} = {value!r}: expected true or false")
            out[key] = value
        else:
            out.update(checked_settings(fields[key], {key: value}, where))
    return out


def options(scope: str, *classes, toml: bool = True) -> Callable[[Callable], Callable]:
    """Give a command every field of `classes` offered in `scope` as an option, and (toml) --config
    FILE; the command takes `given` (dict: field name -> value) in their place."""
    fields = owners(scope, classes)

    def wrap(fn: Callable) -> Callable:
        signature = inspect.signature(fn, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != "given"]
        made = []
        for name, cls in fields.items():
            kind, option, default = option_for(cls, name)
            made.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, option]))
        if toml:
            made.append(inspect.Parameter("config_file", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
                Optional[Path], typer.Option("--config", metavar="FILE", help=f"A TOML file whose [{scope}] table sets any of "
                                             "these options by field name (max_len_b = 50); the command line wins.")]))

        @functools.wraps(fn)
        def command(*args, **kwargs):
            ctx = kwargs.pop("options_context")
            values = {name: kwargs.pop(name) for name in fields}
            config_file = kwargs.pop("config_file") if toml else None
            given = from_file(config_file, scope, fields) if config_file is not None else {}
            given.update({name: value for name, value in values.items()
                          if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")})
            return fn(*args, given=given, **kwargs)

        made.append(inspect.Parameter("options_context", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))
        command.__signature__ = signature.replace(parameters=own + made)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in own + made}
        return command
    return wrap
