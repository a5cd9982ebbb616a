"""The fast loop's time held: a test not marked `slow` fails when it takes longer than `fast_test_limit_s`.

`make test-fast` (the loop to run while working) runs every test not marked `slow`; it stays fast only while each of
them does. A test that grows past the limit (a whole campaign, a server, an interpreter started per case) fails
with the fix in its message: mark it `slow` (it still runs in `make test`) or make it cheaper. The limit counts the
test's own setup (its fixtures) and call, so a costly fixture counts against the test that asks for it.
"""

from __future__ import annotations

import pytest

FAST_TEST_LIMIT_S = 60.0
"""Seconds a test outside the `slow` marker may take, fixtures included: far above such a test's second or two on a
loaded 2-core box, so it never fails by load, only by growth."""
SETUP_S = pytest.StashKey[float]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("fast_test_limit_s", "seconds a test not marked slow may take (setup and call)", default=str(FAST_TEST_LIMIT_S))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # noqa: ANN201 - a hook wrapper
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.when == "setup":
        item.stash[SETUP_S] = report.duration
    if report.when != "call" or not report.passed or item.get_closest_marker("slow") is not None:
        return
    took, limit = item.stash.get(SETUP_S, 0.0) + report.duration, float(item.config.getini("fast_test_limit_s"))
    if took > limit:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} took {took:.1f} s (setup and call), over the {limit:g} s a test not marked slow may take: "
                           "mark it @pytest.mark.slow (make test runs it, make test-fast leaves it out) or make it cheaper")
