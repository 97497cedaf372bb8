"""Where a run's time went: a per-suite table at the end, against the profile's budgets.

Why: the nightly main job has a time budget (20 minutes at 7,500 nodes on
the reference machine), and each suite has its own (``budget_<suite>_s``;
the embedded cluster's bring-up ``budget_bringup_s``). pytest's
``--durations`` lists tests; an SRE planning a nightly slot needs suites.
Over budget is reported, not failed: time is a benchmark figure here, not a
verdict on the cluster. The table also goes into the Allure results
(``timing.json``) for the report.
"""
from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import pytest

from clusterproof.fixtures import BRINGUP_S, PROFILE

BRINGUP = "embedded cluster bring-up"
_durations: dict[str, float] = defaultdict(float)
_tests: dict[str, int] = defaultdict(int)
_started = [time.monotonic()]
_bringup = [0.0]
_config = []


def pytest_configure(config) -> None:
    _config.append(config)


def suite_of(nodeid: str) -> str:
    """'suites/test_gang_scheduling.py::x[y]' -> 'gang_scheduling'."""
    return Path(nodeid.split("::", 1)[0]).stem.removeprefix("test_")


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    suite = suite_of(report.nodeid)
    _durations[suite] += report.duration
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        _tests[suite] += 1
    # The session fixture that built the cluster ran inside this set-up: move it out of the suite.
    seconds = _config[0].stash.get(BRINGUP_S, 0.0) if _config else 0.0
    if report.when == "setup" and seconds and not _bringup[0]:
        _bringup[0] = seconds
        _durations[suite] -= seconds


def rows(profile) -> list[dict]:
    out = []
    if _bringup[0]:
        out.append({"suite": BRINGUP, "seconds": round(_bringup[0], 1), "tests": None,
                    "budget_s": getattr(profile, "budget_bringup_s", None) or None})
    for suite, secs in _durations.items():
        out.append({"suite": suite, "seconds": round(secs, 1), "tests": _tests[suite],
                    "budget_s": getattr(profile, f"budget_{suite}_s", None) or None})
    out.append({"suite": "total (wall clock)", "seconds": round(time.monotonic() - _started[0], 1), "tests": None,
                "budget_s": getattr(profile, "budget_total_s", None) or None})
    for r in out:
        r["over_budget"] = bool(r["budget_s"]) and r["seconds"] > r["budget_s"]
    return out


def _fmt(secs: float | None) -> str:
    if secs is None:
        return "-"
    return f"{int(secs // 60)}:{secs % 60:04.1f}" if secs >= 60 else f"{secs:.1f} s"


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    profile = config.stash.get(PROFILE, None)
    table = rows(profile)
    if len(table) <= 1:
        return
    tr = terminalreporter
    tr.section(f"time per suite (profile {getattr(profile, 'name', '?')})")
    tr.write_line(f"{'suite':32} {'tests':>6} {'time':>10} {'budget':>10}")
    for r in table:
        flag = "  OVER BUDGET" if r["over_budget"] else ""
        tests = "" if r["tests"] is None else str(r["tests"])
        tr.write_line(f"{r['suite']:32} {tests:>6} {_fmt(r['seconds']):>10} {_fmt(r['budget_s']):>10}{flag}")
    alluredir = config.getoption("allure_report_dir", None)
    if alluredir:
        Path(alluredir).mkdir(parents=True, exist_ok=True)
        (Path(alluredir) / "timing.json").write_text(json.dumps(table, indent=2))
