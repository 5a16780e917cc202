"""Reading text the way every command promises: lines end at \\n only.

Owns opening plain or gzip files, splitting on b"\\n" alone (so \\r, \\x85 and U+2028 inside a line
stay text), stripping one trailing \\r (CRLF files), decoding UTF-8 with a clear error naming the
file and line, and the one-line errors for missing or unreadable inputs.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import BinaryIO, Callable, Iterator


class InputError(Exception):
    """A problem with the user's input; the message names the file (and line) and what to do."""


def open_binary(path: Path) -> BinaryIO:
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, expected a text file")
    try:
        if path.suffix == ".gz":
            return gzip.open(path, "rb")  # type: ignore[return-value]
        return open(path, "rb")
    except OSError as error:
        raise InputError(f"{path}: cannot read: {error.strerror}") from None


def decode_line(raw: bytes, where: str, lineno: int, errors: str = "strict") -> str:
    """One raw line (with or without its \\n) -> text without the line end."""
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    try:
        return raw.decode("utf-8", errors=errors)
    except UnicodeDecodeError as error:
        raise InputError(
            f"{where}:{lineno}: invalid UTF-8 at byte {error.start} of the line; fix the file or pass --errors replace"
        ) from None


def read_lines(path: Path, errors: str = "strict") -> Iterator[str]:
    """Stream the lines of a plain or .gz file."""
    with open_binary(path) as handle:
        lineno = 0
        try:
            for lineno, raw in enumerate(handle, start=1):
                yield decode_line(raw, str(path), lineno, errors)
        except (OSError, EOFError) as error:  # truncated gzip, I/O error
            raise InputError(f"{path}:{lineno + 1}: cannot read: {error}") from None


def find_split_file(prefix: str, lang: str) -> Path:
    """PREFIX.LANG, or PREFIX.LANG.gz when only that exists."""
    plain = Path(f"{prefix}.{lang}")
    if plain.exists():
        return plain
    gz = Path(f"{prefix}.{lang}.gz")
    if gz.exists():
        return gz
    raise InputError(f"{plain}: no such file (nor {gz.name})")


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """write(handle) into a temp file beside `path`, fsync, rename: a crash or a full disk leaves
    the old file or the new one, never half of one, and no temp file behind."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda handle: handle.write(data))
