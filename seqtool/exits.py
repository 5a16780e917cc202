"""How a `seqtool` command ends when it does not succeed.

Owns the wrapper every command runs in: a user's mistake (a SeqtoolError) becomes one line on
stderr and its exit status (errors.EXIT_CODES); Ctrl-C exits 130; a closed stdout (`| head`) ends
quietly; a full disk names the file; anything else is a bug in seqtool: one line too, exit 2, and
SEQTOOL_DEBUG=1 shows the traceback.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Callable

import typer


def _fail(message: str, code: int = 1):
    from . import log

    log.error(message)  # the one stderr console
    raise typer.Exit(code)


def _unexpected(error: BaseException):
    if os.environ.get("SEQTOOL_DEBUG"):
        raise error
    message = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
    _fail(f"unexpected {type(error).__name__}: {message} (a bug in seqtool; rerun with SEQTOOL_DEBUG=1 for the traceback and report it)", 2)


# what a command can change to need less memory (by the command function's name); others: no option to give
MEMORY_ADVICE = {
    "train": "lower --max-tokens (and --batch-size), or a smaller --arch",
    "translate": "lower --max-tokens / --batch-size, or fewer --workers",
    "serve": "lower --max-batch-tokens, or fewer --workers",
    "score": "lower --max-tokens / --batch-size",
    "binarize": "fewer --workers",
    "train_tokenizer_cmd": "a smaller --input-sentence-size",
    "attention": "a shorter sentence",
    "import_": "the model is larger than this machine's free memory (import keeps one copy of its weights)",
    "average": "the checkpoints are larger than this machine's free memory (average holds one of them and the sum)",
}


def handles_user_errors(fn: Callable) -> Callable:
    """User mistakes -> one line on stderr, exit 1; Ctrl-C -> exit 130; a closed pipe -> quiet exit.
    Anything unexpected is a bug: one line too (SEQTOOL_DEBUG=1 shows the traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from .errors import SeqtoolError, exit_code

        try:
            return fn(*args, **kwargs)
        except SeqtoolError as error:
            _fail(str(error), exit_code(error))
        except KeyboardInterrupt:
            _fail("interrupted", exit_code(KeyboardInterrupt()))
        except BrokenPipeError:
            # The reader went away (e.g. `| head -1`): stop quietly, and keep Python's exit-time
            # flush from complaining about the closed stdout.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            raise typer.Exit(0)
        except MemoryError:
            _fail(f"out of memory; {MEMORY_ADVICE.get(fn.__name__, 'this machine has too little free memory for it')}")
        except OSError as error:
            if error.errno == 28:  # ENOSPC
                _fail(f"{error.filename or 'output'}: no space left on device; free space and run again (earlier files are intact)")
            if error.filename:
                _fail(f"{error.filename}: {error.strerror}")
            _unexpected(error)
        except (typer.Exit, typer.Abort, typer.exceptions.TyperException):
            raise
        except Exception as error:
            _unexpected(error)

    return wrapper
