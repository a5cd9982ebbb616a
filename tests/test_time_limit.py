"""The fast loop's time held (tests/time_limit.py): a test outside the `slow` marker fails past the limit, with the fix."""

from __future__ import annotations

import re

import pytest

TESTS = '''
import time

import pytest


@pytest.fixture
def costly():
    time.sleep(0.3)


def test_quick():
    assert True


def test_long():
    time.sleep(0.6)


def test_long_fixture(costly):
    time.sleep(0.3)


@pytest.mark.slow
def test_long_but_slow():
    time.sleep(0.6)
'''


@pytest.mark.slow
def test_a_test_not_marked_slow_fails_past_the_limit_with_its_time_and_the_fix(pytester):
    pytester.makeconftest("from tests.time_limit import pytest_addoption, pytest_runtest_makereport  # noqa: F401\n")
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\nfast_test_limit_s = 0.5\n")
    pytester.makepyfile(test_timed=TESTS)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=2)  # quick and the slow-marked one pass; the long call and the long fixture fail
    text = result.stdout.str()
    took = dict(re.findall(r"test_timed.py::(\w+) took (\d+\.\d) s \(setup and call\), over the 0.5 s a test not marked slow may take", text))
    assert set(took) == {"test_long", "test_long_fixture"} and all(float(seconds) >= 0.6 for seconds in took.values())
    assert "mark it @pytest.mark.slow (make test runs it, make test-fast leaves it out) or make it cheaper" in text
