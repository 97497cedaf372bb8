"""One suite must not poison the next: the control plane is supervised and checked around modules.

A run (as a user types it, on its own embedded cluster) executes a module that
kills kube-scheduler and then a module that needs a scheduler. The killer
module fails in its teardown, naming kube-scheduler and its last log line;
the supervisor has restarted the scheduler, so the next module passes; the
report carries the restart.
"""
from __future__ import annotations

import json

import pytest

from tests.harness import run_pytest

pytestmark = pytest.mark.selftest


def test_a_module_that_kills_a_component_fails_and_the_next_one_runs(tmp_path):
    run = run_pytest(["tests/poison/poisoner.py", "tests/poison/bystander.py", "--profile", "smoke",
                      "-p", "no:randomly"], tmp_path, timeout=600)
    assert run.returncode == 1, run.output[-3000:]
    [(name, msg)] = run.failures.items()
    assert name == "test_kills_the_scheduler", run.output[-3000:]
    assert "this module broke the control plane: kube-scheduler exited at" in msg, msg
    assert "restarted; its last log line:" in msg, msg
    assert "test_a_pod_is_bound" in run.passed, run.output[-3000:]
    found = []
    for f in (tmp_path / "allure").glob("*-container.json"):
        for fx in json.loads(f.read_text()).get("afters", []):
            found += [a["name"] for a in fx.get("attachments", [])]
    assert "control-plane components restarted during this module" in found, found
