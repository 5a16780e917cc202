"""The tier rule of tests/conftest.py: collection fails when a test has no tier marker (unit,
integration, system) or more than one, before -m picks what runs; a suite that keeps it collects."""

from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

CONFTEST = Path(__file__).with_name("conftest.py")

# pytester runs pytest in a directory of its own: its conftest takes the hook from ours
INNER_CONFTEST = f"""
import importlib.util
import sys

spec = importlib.util.spec_from_file_location("tiers_under_test", {str(CONFTEST)!r})
module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
pytest_collection_modifyitems = module.pytest_collection_modifyitems
"""
INI = "[pytest]\nmarkers =\n    unit: u\n    integration: i\n    system: s\n    slow: l\n"
QUIET = ("--co", "-q", "-p", "no:hypothesispytest", "-p", "no:cacheprovider")  # (hypothesis' summary alone took 1.4 s a run)


@pytest.fixture
def suite(pytester):
    pytester.makeini(INI)
    pytester.makeconftest(INNER_CONFTEST)
    return pytester


def test_a_test_without_a_tier_or_with_two_fails_collection_naming_it(suite):
    suite.makepyfile(test_mixed="""
        import pytest

        @pytest.mark.unit
        def test_good():
            pass

        @pytest.mark.slow
        def test_untiered():
            pass

        @pytest.mark.unit
        @pytest.mark.system
        def test_two_tiers():
            pass
    """)
    for args in ([], ["-m", "unit"], ["-m", "system"], ["-k", "good"]):  # whatever is selected
        result = suite.runpytest(*QUIET, *args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, (args, result.outlines, result.errlines)
        err = "\n".join(result.errlines)
        assert "2 test(s) need exactly one of the markers unit, integration, system" in err
        assert "test_mixed.py::test_untiered: no tier marker" in err
        assert "test_mixed.py::test_two_tiers: several tier markers (system, unit)" in err
        assert "test_good" not in err


def test_module_marks_and_test_marks_each_count_once(suite):
    suite.makepyfile(test_module="""
        import pytest

        pytestmark = pytest.mark.integration

        def test_one():
            pass

        @pytest.mark.integration  # the module's tier again: still one tier
        @pytest.mark.parametrize("n", [1, 2])
        def test_two(n):
            pass
    """, test_other="""
        import pytest

        pytestmark = [pytest.mark.system, pytest.mark.slow]

        def test_three():
            pass

        @pytest.mark.unit  # a second tier beside the module's
        def test_four():
            pass
    """)
    result = suite.runpytest(*QUIET, "test_module.py")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*3 tests collected*"])
    result = suite.runpytest(*QUIET)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "test_other.py::test_four: several tier markers (system, unit)" in "\n".join(result.errlines)
    assert "test_three" not in "\n".join(result.errlines)
