"""The self-tests' own session cluster has no real node (profile key real_nodes).

Why: many self-tests point a pytest run at the session cluster with
``--cp-kubeconfig``; a cluster with a node that is not a kwok node is real
hardware to the harness (``clusterproof.kube.client.is_simulated``: a forgeable label
must never make a real cluster look simulated), so those runs would take the
real-cluster path. The real-node self-tests start clusters of their own
(tests/test_real_node_controls.py); ``pytest suites`` (the second half of
``make test``) runs the real-node checks on the smoke profile's real node.
An explicit ``--cp-set real_nodes=N`` still wins (it comes later).

The pytest runs self-tests start (negative controls fail on purpose) do not
append to the CI's job summary ($GITHUB_STEP_SUMMARY): only this session's own
verdict goes there, at its end (``clusterproof.report.ci``).

On parallel workers (``./proof test``: pytest-xdist, a module at a time per
worker) the longest modules go first, so that no hour-long tail is left to one
worker: ``durations.json`` holds each module's seconds from a serial run (a
module not in it counts as long, so a new one is never the tail). The order
within a module is kept.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    sets = getattr(config.option, "cp_set", None)
    if sets is not None:
        config.option.cp_set = ["real_nodes=0", *sets]


DURATIONS = Path(__file__).with_name("durations.json")
UNKNOWN_MODULE_S = 300.0


def module_seconds() -> dict[str, float]:
    """Each self-test module's seconds in a serial run (``tests/durations.json``), by file name."""
    return {k: float(v) for k, v in json.loads(DURATIONS.read_text())["seconds"].items()}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):     # an xdist worker (there, -n reads as None)
        return
    seconds = module_seconds()
    items.sort(key=lambda item: -seconds.get(item.path.name, UNKNOWN_MODULE_S))   # stable: modules stay whole


@pytest.fixture(scope="session", autouse=True)
def _no_job_summary_from_child_runs():
    saved = os.environ.pop("GITHUB_STEP_SUMMARY", None)
    yield
    if saved is not None:   # back before the session ends: its own summary is written then
        os.environ["GITHUB_STEP_SUMMARY"] = saved
