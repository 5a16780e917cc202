"""Reading text the way every command promises: lines end at \\n only.

Owns opening plain or gzip files, splitting on b"\\n" alone (so \\r, \\x85 and U+2028 inside a line
stay text), stripping one trailing \\r (CRLF files) and a UTF-8 byte order mark before the first
line (Windows editors write one), decoding UTF-8 with a clear error naming the file and line (or
replacing it with a warning), standard input that is closed, the one-line errors for missing or
unreadable inputs and unwritable outputs, and the temp files of atomic writes (named with their
writer's PID, so a dead writer's are known and removed).
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import gzip
import os
import re
import sys
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Optional, Sequence, TextIO

from . import log
from .errors import InputError
from .interrupts import Interrupts

# Invalid UTF-8 replaced under --errors replace: warn about this many lines per file, then count.
WARN_LINES = 10


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


class LineDecoder:
    """decode_line for one stream, with --errors: strict stops at the first invalid line; replace
    puts U+FFFD for the bad bytes and warns, naming the line (the first WARN_LINES, then a count).
    A byte order mark at the start of line 1 is not text and is dropped."""

    def __init__(self, where: str, errors: str = "strict"):
        if errors not in ("strict", "replace"):
            raise InputError(f"--errors must be strict or replace, got {errors!r}")
        self.where, self.errors, self.replaced = where, errors, 0

    def __call__(self, raw: bytes, lineno: int) -> str:
        if lineno == 1:
            raw = raw.removeprefix(codecs.BOM_UTF8)
        try:
            return decode_line(raw, self.where, lineno)
        except InputError:
            if self.errors == "strict":
                raise
        self.replaced += 1
        if self.replaced <= WARN_LINES:
            log.warn(f"{self.where}:{lineno}: invalid UTF-8, undecodable bytes replaced by U+FFFD")
        return decode_line(raw, self.where, lineno, errors="replace")

    def finish(self) -> None:
        if self.replaced > WARN_LINES:
            log.warn(f"{self.where}: invalid UTF-8 replaced in {self.replaced} lines in all")


def read_lines(path: Path, errors: str = "strict") -> Iterator[str]:
    """Stream the lines of a plain or .gz file."""
    decode = LineDecoder(str(path), errors)
    with open_binary(path) as handle:
        lineno = 0
        try:
            for lineno, raw in enumerate(handle, start=1):
                yield decode(raw, lineno)
        except (OSError, EOFError) as error:  # truncated gzip, I/O error
            raise InputError(f"{path}:{lineno + 1}: cannot read: {error}") from None
    decode.finish()


def strip_line_end(line: str) -> str:
    """A line without its \n or \r\n (a line from an iterator of strings may have either, or none)."""
    return line[:-1].removesuffix("\r") if line.endswith("\n") else line


class LockstepLines:
    """The lines of a file that go with the input's, line for line (translate's --target-prefix):
    taken a chunk at a time, without their line ends; unequal counts are an InputError naming both
    files, the option and what it needs."""

    def __init__(self, path: Path, source_name: str, option: str, needs: str, errors: str = "strict"):
        self.path, self.source_name, self.option, self.needs = path, source_name, option, needs
        self.lines = read_lines(path, errors)

    def take(self, start: int, n: int) -> list[str]:
        got = [line for _, line in zip(range(n), self.lines)]
        if len(got) < n:
            raise InputError(f"{self.path} ends after line {start + len(got)}, but {self.source_name} goes on; "
                             f"{self.option} needs {self.needs}")
        return [strip_line_end(line) for line in got]

    def finish(self, count: int) -> None:
        if next(self.lines, None) is not None:
            raise InputError(f"{self.path} has more lines than the {count} of {self.source_name}; {self.option} needs {self.needs}")


def open_stdin(unbuffered: bool = False) -> BinaryIO:
    """Standard input as bytes; a closed stdin (`<&-`) is a clear error, a terminal gets a hint.
    unbuffered: a raw reader of the same descriptor, for a reading thread (see below)."""
    if sys.stdin is None or sys.stdin.closed:
        raise InputError("<stdin>: standard input is closed; pipe text in or give an input file")
    if sys.stdin.isatty():
        log.info("reading from the terminal: type lines, end with Ctrl-D (or give an input file)")
    if not unbuffered:
        return sys.stdin.buffer
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):  # (io.UnsupportedOperation) a stdin without a descriptor (in-process)
        return sys.stdin.buffer
    # Unbuffered, on the same descriptor: translate reads stdin in a daemon thread (linereader),
    # which may sit in a read when the process exits (Ctrl-C mid-stream). Blocked inside
    # sys.stdin.buffer it would hold that object's lock, and Python's exit-time flush of stdin
    # then aborts the process ("Fatal Python error: _enter_buffered_busy", SIGABRT) instead of
    # exiting 130. A raw FileIO has no such lock; its read(n) returns what a pipe holds, as read1.
    return open(fd, "rb", buffering=0, closefd=False)


def check_output_file(path: Path, inputs: Sequence[tuple[str, Optional[Path]]] = (), option: str = "--output") -> None:
    """Fail before any work when an output file cannot be created where asked, or is one of the
    run's inputs ((option, path) pairs: writing it would destroy what is being read)."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path}: is a directory; give a file name for the output")
    parent = path.parent
    if not parent.is_dir():
        raise InputError(f"{path}: the directory {parent} does not exist; create it first")
    for name, source in inputs:
        if source is not None and path.exists() and Path(source).exists() and os.path.samefile(path, source):
            raise InputError(f"{path}: {option} is the {name} file; write somewhere else")


def find_split_file(prefix: str, lang: str) -> Path:
    """PREFIX.LANG, or PREFIX.LANG.gz when only that exists."""
    plain = Path(f"{prefix}.{lang}")
    if plain.exists():
        return plain
    gz = Path(f"{prefix}.{lang}.gz")
    if gz.exists():
        return gz
    raise InputError(f"{plain}: no such file (nor {gz.name})")


def temp_path(path: Path, pid: int = 0) -> Path:
    """The hidden temp file atomic_write uses for `path` (never named like the real file)."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp{pid or os.getpid()}")


def remove_stale_temps(directory: Path, names: str) -> list[Path]:
    """Delete the temp files (temp_path's) in `directory` of the files whose names match the regular
    expression `names`, left by a process that died (kill -9 mid-write); a live process's are left
    alone, and so is anything else. Returns what was deleted."""
    pattern = re.compile(rf"^\.(?:{names})\.tmp(\d+)$")
    removed = []
    for path in Path(directory).iterdir():
        match = pattern.match(path.name)
        if not match:
            continue
        pid = int(match.group(1))
        if pid != os.getpid() and process_alive(pid):
            continue
        path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists here (True where that cannot be told: its files are kept)."""
    if os.name != "posix":  # os.kill(pid, 0) would terminate the process on Windows
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # exists (another user's) or cannot tell: keep its file
    return True


def fsync_directory(directory: Path) -> None:
    """Make a rename inside `directory` durable: without this, a power cut after os.replace may
    bring back the old directory entry (or none). POSIX only; file systems that cannot sync a
    directory (EINVAL) are left as they are."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as error:
        if error.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """write(handle) into a temp file beside `path`, flush, fsync it, rename over `path`, fsync the
    directory: a crash, kill -9 or a full disk leaves the old file or the new one, never half of
    one (a killed process may leave its hidden temp file, which is never taken for `path`)."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        fsync_directory(path.parent)
    except BaseException as error:
        tmp.unlink(missing_ok=True)
        if isinstance(error, OSError) and error.errno == errno.ENOSPC and not error.filename:
            error.filename = str(path)  # so the message names the file that could not be written
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda handle: handle.write(data))


@contextlib.contextmanager
def atomic_text_output(path: Path) -> Iterator[TextIO]:
    """A UTF-8 text handle (\\n line ends) whose file appears at `path` only when the block ends
    without an error: a partial output never looks complete. SIGTERM, like Ctrl-C, ends the block
    with KeyboardInterrupt, so the temp file goes either way. The temp name carries the PID: two
    runs writing the same path never share one."""
    path = Path(path)
    tmp = temp_path(path)
    interrupts = Interrupts()
    interrupts.install()
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        fsync_directory(path.parent)
    except OSError as error:
        error.filename = error.filename or str(path)  # e.g. a full disk: name the output, not nothing
        raise
    finally:
        interrupts.restore()
        tmp.unlink(missing_ok=True)


def refuse_existing(path, force: bool) -> None:
    """Nothing a user made is overwritten unless they say so: an existing output needs --force."""
    if os.path.lexists(path) and not force:
        raise InputError(f"{path}: already exists; pass --force to replace it")
