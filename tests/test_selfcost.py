"""The observer's own cost (clusterproof.core.selfcost): the harness's CPU and its load generator's, apart."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from clusterproof.core.selfcost import CpuCost, measured


@pytest.mark.cluster
def test_the_harness_own_cpu_and_its_childrens_are_measured_apart():
    with measured("busy") as cost:
        end = time.process_time() + 0.3
        while time.process_time() < end:
            pass
        subprocess.run([sys.executable, "-c", "import time\nt = time.process_time() + 0.3\n"
                        "while time.process_time() < t: pass"], check=True)
    assert 0.25 <= cost.own_s < cost.wall_s + 0.1, cost
    assert cost.children_s >= 0.25, cost
    # Negative control: an idle block costs (almost) nothing, and says no load generator.
    with measured("idle") as idle:
        time.sleep(0.3)
    assert idle.own_s < 0.1 and idle.children_s == 0, idle
    assert "load generator" not in idle.line()


@pytest.mark.unit
def test_the_line_says_cores_share_and_window():
    line = CpuCost("burst", wall_s=100, own_s=31, children_s=92, cpus=2).line()
    assert line == ("0.31 cores (16 % of 2 CPUs) over 100 s; its load generator (locust, child processes) "
                    "0.92 cores"), line
