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

Every self-test says what it needs, as exactly one tier marker (``TIERS``: a
module's or its own, never both, for ``-m`` selects by either), and a test
without one, or with two, fails the collection in one line. ``unit`` needs nothing but the venv -- no cluster, no
binary built from a Go module, no root, no network, no child run -- so
``./proof test --unit`` (``pytest tests -m unit``) is a contributor's loop of
seconds; a unit test that asks for the session's cluster fails the collection
too.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

# What a self-test needs, one of these each (docs/extending.md, "The self-tests' tiers").
TIERS = {
    "unit": "needs only the venv: no cluster, no binary built from a Go module, no root, no network, no child run",
    "cluster": "needs what ./proof setup builds: the session's embedded cluster, a cluster of its own, or a binary",
    "control": "starts child runs (a suite against a broken cluster, bad input) and judges their verdict",
    "host": "needs root and this machine as a node: containerd, a real kubelet, debootstrap, the host's state",
}
# Fixtures that start or reach a cluster: a unit test may ask for none of them.
CLUSTER_FIXTURES = ("cluster", "kueue_started")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for name, what in TIERS.items():
        config.addinivalue_line("markers", f"{name}: a self-test that {what}")
    sets = getattr(config.option, "cp_set", None)
    if sets is not None:
        config.option.cp_set = ["real_nodes=0", *sets]


def tiers_of(item: pytest.Item) -> list[str]:
    """The item's tier markers, its module's and its own."""
    return sorted({m.name for m in item.iter_markers() if m.name in TIERS})


def tier_problems(items: list[pytest.Item]) -> list[str]:
    """A line per self-test without exactly one tier, or of tier unit asking for a cluster."""
    out = []
    for item in items:
        tiers = tiers_of(item)
        if len(tiers) != 1:
            out.append(f"{item.nodeid}: " + (f"tiers {' and '.join(tiers)} at once" if tiers else
                                             f"no tier marker (one of {', '.join(TIERS)}: tests/conftest.py TIERS)"))
        elif tiers == ["unit"] and (used := [f for f in CLUSTER_FIXTURES if f in item.fixturenames]):
            out.append(f"{item.nodeid}: marked unit but asks for {', '.join(used)} (mark it cluster)")
    return out


DURATIONS = Path(__file__).with_name("durations.json")
UNKNOWN_MODULE_S = 300.0


def module_seconds() -> dict[str, float]:
    """Each self-test module's seconds in a serial run (``tests/durations.json``), by file name."""
    return {k: float(v) for k, v in json.loads(DURATIONS.read_text())["seconds"].items()}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    problems = tier_problems([i for i in items if here in i.path.parents])
    if problems:
        raise pytest.UsageError(f"{len(problems)} self-test(s) without a proper tier: " + "; ".join(problems[:10]))
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
