"""How the suite is handed out to pytest-xdist's processes (a pytest plugin of tests/conftest.py).

A scope is the unit a process runs whole: a test file, or a test package (a folder with an
`__init__.py`), whose files share one process so that its conftest's package fixtures (the
multi-node cluster) are made once. Scopes are handed out longest first, by the durations one run recorded in tests/durations.json
(`pytest --store-durations` writes them, as pytest-split does; a test without a record counts as
the mean of those with one), so that the two processes end close together. No hand-kept list."""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
DURATIONS = TESTS / "durations.json"


@functools.cache
def _package(folder: str) -> str | None:
    """The outermost test package (a folder with an `__init__.py`, below tests/) that holds `folder`
    (a path relative to the repository, as nodeids give it), or None."""
    parts = Path(folder).parts
    for n in range(2, len(parts) + 1):  # tests/<subsystem>/...: tests/ itself is not a scope
        if (TESTS.parent.joinpath(*parts[:n]) / "__init__.py").is_file():
            return "/".join(parts[:n]) + "/"
    return None


def scope_of(nodeid: str) -> str:
    """The scope of a test: its test package (whose files share its package fixtures), else its file."""
    path = nodeid.split("::", 1)[0]
    return _package(str(Path(path).parent)) or path


def recorded() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except FileNotFoundError:
        return {}
    except (ValueError, TypeError, AttributeError) as err:  # not JSON, not an object, not numbers
        raise pytest.UsageError(
            f"{DURATIONS}: not a JSON object of test ids to seconds ({err}); restore it from git "
            "or delete it and record it again with --store-durations"
        ) from None


def _skipped(item: pytest.Item) -> bool:
    return item.get_closest_marker("skip") is not None


@pytest.hookimpl(trylast=True)  # after `-m` has deselected and the tiers' skips are marked
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Sort `items` in place: scopes by their recorded seconds, most first; each keeps its own order."""
    seconds = recorded()
    known = [seconds[i.nodeid] for i in items if i.nodeid in seconds and not _skipped(i)]
    unknown = sum(known) / len(known) if known else 1.0
    totals: dict[str, float] = defaultdict(float)
    for item in items:
        totals[scope_of(item.nodeid)] += 0.0 if _skipped(item) else seconds.get(item.nodeid, unknown)
    first_seen = {scope: n for n, scope in reversed(list(enumerate(scope_of(i.nodeid) for i in items)))}
    items.sort(key=lambda i: (-totals[scope_of(i.nodeid)], first_seen[scope_of(i.nodeid)]))


def pytest_addoption(parser):
    parser.addoption(
        "--store-durations",
        action="store_true",
        default=False,
        help="write each test's seconds (setup, call and teardown) into tests/durations.json",
    )


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which builds the scheduler that --dist names
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ScopeScheduling(LoadScopeScheduling):
        """xdist's loadscope with our scopes, in the collection's order (longest_scope_first)."""

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    config.option.loadscopereorder = False
    return ScopeScheduling(config, log)


class DurationRecorder:
    """Each test's seconds from its reports (in the controller under xdist), merged into the file at the end."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.skipped: set[str] = set()  # a skipped test keeps the seconds it took where it ran

    def pytest_runtest_logreport(self, report) -> None:
        self.seconds[report.nodeid] += report.duration
        if report.skipped:
            self.skipped.add(report.nodeid)

    def pytest_sessionfinish(self) -> None:
        ran = {k: round(v, 2) for k, v in self.seconds.items() if k not in self.skipped}
        merged = {**recorded(), **ran}
        DURATIONS.write_text(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")


def pytest_configure(config):
    if config.getoption("--store-durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(DurationRecorder(), "convsts-durations")
