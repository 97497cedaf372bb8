"""clusterproof.report.summary.gang_mechanisms: Coscheduling, native and Kueue side by side in the summary."""
from __future__ import annotations

import pytest

from clusterproof.report.summary import GANG_PARAMS, KUEUE, gang_mechanisms, terminal_lines

pytestmark = pytest.mark.unit
GANG = "suites/test_gang_scheduling.py::"
CHECKS = {
    GANG + "test_gang_is_bound_all_together_or_not_at_all[coscheduling]": {"outcome": "passed"},
    GANG + "test_competing_gangs_do_not_deadlock[coscheduling]": {"outcome": "failed", "title": "t", "message": "m"},
    GANG + "test_gang_is_bound_all_together_or_not_at_all[native]": {"outcome": "passed"},
    GANG + "test_gang_probe": {"outcome": "passed"},                    # no mechanism: not counted
    "suites/test_kueue_admission.py::test_a_jobset_is_admitted_whole_or_not_at_all_under_its_quota":
        {"outcome": "passed"},
    "suites/test_kueue_admission.py::test_topology": {"outcome": "skipped"},
    "suites/test_taint_isolation.py::test_x[coscheduling]": {"outcome": "failed", "title": "x"},   # another suite
}


def test_each_gang_check_counts_for_its_mechanism():
    assert gang_mechanisms(CHECKS) == {GANG_PARAMS["coscheduling"]: {"passed": 1, "failed": 1},
                                       GANG_PARAMS["native"]: {"passed": 1},
                                       KUEUE: {"passed": 1, "skipped": 1}}


def test_the_terminal_summary_shows_them_side_by_side():
    run = {"id": "r", "profile": "smoke", "nodes": 100, "kubernetes": "v1.35.4", "simulated": True,
           "backend": "kwok"}
    lines = "\n".join(terminal_lines({"run": run, "checks": CHECKS, "figures": {}}))
    assert "gang mechanisms side by side:" in lines
    row = next(ln for ln in lines.splitlines() if ln.strip().startswith("Coscheduling"))
    assert row.split()[-2:] == ["1", "1"], row


def test_a_run_without_two_mechanisms_shows_no_table():
    only = {k: v for k, v in CHECKS.items() if "kueue" in k}
    run = {"id": "r", "profile": "smoke", "nodes": 100, "kubernetes": "v1.35.4", "simulated": True, "backend": "k"}
    assert "gang mechanisms" not in "\n".join(terminal_lines({"run": run, "checks": only, "figures": {}}))
