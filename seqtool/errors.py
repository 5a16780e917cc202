"""The errors seqtool reports to its users, and what each means to the process that meets it.

Every problem a user can fix is a SeqtoolError whose message names the file (and line), the
option or the key, and what to do; the CLI prints it as one line. Three kinds, by who must act:

- InputError: the input is wrong (a missing or unreadable file, invalid UTF-8, a damaged checkpoint);
- ConfigError: a setting cannot work (an option's value, a combination, this machine's limits);
- ResourceError: the run needs more than the machine has (memory, disk, a device).

EXIT_CODES maps each to a process exit status (the server maps them to HTTP statuses the same
way). Anything else that escapes a command is a bug in seqtool: exit 2.
"""

from __future__ import annotations

import re
from typing import Callable, Optional


class SeqtoolError(Exception):
    """A problem the user can fix; the message says which and what to do."""


class InputError(SeqtoolError):
    """A problem with the user's input; the message names the file (and line) and what to do."""


class ConfigError(SeqtoolError, ValueError):
    """A setting that cannot work; the message says which and why."""


class FieldError(ConfigError):
    """A setting whose value cannot work, its message written over field names in backquotes
    (`beam`), which each front end renders in its own words: str() gives the command line's
    (--beam, or a field's own `option`), the server its request fields (`render`)."""

    def __init__(self, template: str, options: Optional[dict[str, str]] = None):
        self.template, self.options = template, dict(options or {})
        super().__init__(self.render(self.option))

    @property
    def fields(self) -> list[str]:
        """The fields the message names, the one at fault first."""
        return _FIELD.findall(self.template)

    def option(self, name: str) -> str:
        return self.options.get(name) or "--" + name.rsplit(".", 1)[-1].replace("_", "-")

    def render(self, name_of: Callable[[str], str]) -> str:
        return _FIELD.sub(lambda m: name_of(m.group(1)), self.template)


_FIELD = re.compile(r"`([a-z][a-z0-9_.]*)`")


class ResourceError(SeqtoolError):
    """The machine has too little of something the run needs (memory, disk, a device)."""


EXIT_CODES: dict[type[BaseException], int] = {SeqtoolError: 1, KeyboardInterrupt: 130}
BUG_EXIT_CODE = 2


def exit_code(error: BaseException) -> int:
    """The exit status for an error that ends a command: the first EXIT_CODES entry it is an
    instance of (most specific first), else BUG_EXIT_CODE."""
    for kind in sorted(EXIT_CODES, key=lambda k: -len(k.__mro__)):
        if isinstance(error, kind):
            return EXIT_CODES[kind]
    return BUG_EXIT_CODE
