"""Where a run's time went: a per-suite table at the end, against the profile's budgets.

Why: the nightly main job has a time budget (20 minutes at 7,500 nodes on
the reference machine), and each suite has its own (``budget_<suite>_s``;
the embedded cluster's bring-up ``budget_bringup_s``). pytest's
``--durations`` lists tests; an SRE planning a nightly slot needs suites.
Over budget is reported, not failed: time is a benchmark figure here, not a
verdict on the cluster. Each suite's time is split into its set-up (module
fixtures: a cluster of objects built, a Prometheus started), its checks'
own calls, and its teardown (what it created, deleted and waited for), so
a suite over budget says at once which part grew. The table also goes into the Allure results
(``timing.json``) for the report, and each suite's time is a figure of the
run's summary (``Timing.figures``).

Pure: the session's ``Timing`` is fed by the report's hooks
(``clusterproof.fixtures.report``).
"""
from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

from clusterproof.core.measurement import LOWER, Figure
from clusterproof.core.texttable import text_table

BRINGUP = "embedded cluster bring-up"
WHEN = ("setup", "call", "teardown")        # pytest's phases of a check, the table's columns
TIME_CHECK = "time"   # the figures' check: their keys read "time :: <suite>"


def suite_of(nodeid: str) -> str:
    """'suites/test_gang_scheduling.py::x[y]' -> 'gang_scheduling'."""
    return Path(nodeid.split("::", 1)[0]).stem.removeprefix("test_")


class Timing:
    """One session's time per suite (the bring-up moved out of the suite whose set-up paid for it)."""

    def __init__(self) -> None:
        self.durations: dict[str, float] = defaultdict(float)
        self.parts: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))   # suite -> when -> s
        self.tests: dict[str, int] = defaultdict(int)
        self.started = time.monotonic()
        self.bringup = 0.0

    def log(self, nodeid: str, when: str, outcome: str, duration: float, bringup_s: float = 0.0) -> None:
        """One phase of one check; ``bringup_s``: the embedded cluster's bring-up, once it is known."""
        suite = suite_of(nodeid)
        self.durations[suite] += duration
        self.parts[suite][when] += duration
        if when == "call" or (when == "setup" and outcome != "passed"):
            self.tests[suite] += 1
        # The session fixture that built the cluster ran inside this set-up: move it out of the suite.
        if when == "setup" and bringup_s and not self.bringup:
            self.bringup = bringup_s
            self.durations[suite] -= bringup_s
            self.parts[suite][when] -= bringup_s

    def rows(self, profile) -> list[dict]:
        out = []
        if self.bringup:
            out.append({"suite": BRINGUP, "seconds": round(self.bringup, 1), "tests": None,
                        "budget_s": getattr(profile, "budget_bringup_s", None) or None})
        for suite, secs in self.durations.items():
            parts = self.parts[suite]
            out.append({"suite": suite, "seconds": round(secs, 1), "tests": self.tests[suite],
                        "budget_s": getattr(profile, f"budget_{suite}_s", None) or None,
                        **{f"{when}_s": round(parts[when], 1) for when in WHEN}})
        out.append({"suite": "total (wall clock)", "seconds": round(time.monotonic() - self.started, 1),
                    "tests": None, "budget_s": getattr(profile, "budget_total_s", None) or None})
        for r in out:
            r["over_budget"] = bool(r["budget_s"]) and r["seconds"] > r["budget_s"]
        return out

    def figures(self, profile) -> list[Figure]:
        """Each suite's time (and the bring-up's) as a figure against its budget, lower is better."""
        return [Figure(TIME_CHECK, r["suite"], r["seconds"], "s", r["budget_s"], "<=" if r["budget_s"] else None,
                       LOWER) for r in self.rows(profile) if not r["suite"].startswith("total")]


def fmt(secs: float | None) -> str:
    if secs is None:
        return "-"
    return f"{int(secs // 60)}:{secs % 60:04.1f}" if secs >= 60 else f"{secs:.1f} s"


def table_lines(rows: list[dict]) -> list[str]:
    """The table for the terminal."""
    return text_table(["suite", "tests", "time", "budget", "set-up", "checks", "teardown"],
                      [[r["suite"], r["tests"], fmt(r["seconds"]), fmt(r["budget_s"]),
                        *(fmt(r[f"{when}_s"]) if "call_s" in r else "" for when in WHEN),
                        "OVER BUDGET" if r["over_budget"] else ""] for r in rows], "<>>>>>>").splitlines()
