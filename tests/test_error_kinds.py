"""errors.py: one base error, three kinds, one table from error to exit status (the CLI-level
behaviour of each error is tests/test_errors.py)."""


import pytest

from seqtool import errors
from seqtool.config import ConfigError as ConfigErrorFromConfig
from seqtool.textio import InputError as InputErrorFromTextio

pytestmark = pytest.mark.unit


def test_every_user_error_is_a_seqtool_error_and_exits_1():
    for kind in (errors.InputError, errors.ConfigError, errors.ResourceError):
        assert issubclass(kind, errors.SeqtoolError)
        assert errors.exit_code(kind("x")) == 1


def test_interrupt_exits_130_and_anything_else_is_a_bug():
    assert errors.exit_code(KeyboardInterrupt()) == 130
    assert errors.exit_code(RuntimeError("boom")) == errors.BUG_EXIT_CODE == 2
    assert errors.exit_code(ValueError("not ours")) == 2  # ConfigError is a ValueError, not the reverse


def test_the_most_specific_entry_wins(monkeypatch):
    monkeypatch.setitem(errors.EXIT_CODES, errors.ResourceError, 75)
    assert errors.exit_code(errors.ResourceError("disk")) == 75
    assert errors.exit_code(errors.InputError("file")) == 1


def test_the_old_import_places_name_the_same_classes():
    assert InputErrorFromTextio is errors.InputError and ConfigErrorFromConfig is errors.ConfigError


def test_training_errors_are_classified():
    from seqtool.training import distributed, update

    assert issubclass(update.OutOfMemory, errors.ResourceError)
    assert issubclass(update.Diverged, errors.ConfigError)
    assert issubclass(distributed.DistributedError, errors.SeqtoolError)
