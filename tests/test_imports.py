"""One name per module: a checkout run imports each source file under one module name, the wheel's.

Why: ``suites/``, ``fixtures/`` and ``load/`` are the package's ``clusterproof.suites``, ``.fixtures`` and
``.load``. If a run also imported ``suites/test_x.py`` as ``suites.test_x`` (pytest's default for a path) or
``fixtures/cluster.py`` as ``fixtures.cluster``, the same code would run twice with two copies of its module
state (stash keys, registries), and a figure keyed by a checkout node id would not compare with one from an
installed run. The checkout's conftest.py collects the suites under their installed names; this holds every
run to it, at collection of the whole tree and in a real run of a shipped check, whose figure keys are the
ones an installed run writes (tests/test_wheel.py compares them).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.harness import ROOT, run_pytest
from tests.one_name import ENV

PROBE = ["-p", "tests.one_name"]
TOP_LEVEL = ("suites", "fixtures", "load")


def _names(report: dict) -> set[str]:
    return {n for names in report["ours"].values() for n in names}


def _held_to_one_name(report: dict) -> None:
    assert not report["twice"], f"imported under two names: {report['twice']}"
    stray = sorted(n for n in _names(report) if n.split(".")[0] in TOP_LEVEL)
    assert not stray, f"modules imported by their checkout path, not as clusterproof.*: {stray}"


@pytest.mark.cluster
def test_collecting_the_whole_tree_imports_each_module_once(tmp_path):
    probe = tmp_path / "probe.json"
    run = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", *PROBE,
                          "--cp-output-dir", str(tmp_path / "out"), "suites", "tests"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, ENV: str(probe)})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(probe.read_text())
    _held_to_one_name(report)
    names = _names(report)
    assert "clusterproof.suites.test_cluster_scale" in names and "clusterproof.fixtures.cluster" in names, names


@pytest.mark.cluster
def test_the_control_without_the_checkouts_conftest_imports_the_suites_by_their_path(tmp_path):
    """The negative control: pytest left to its default names the suites ``suites.test_x`` -- what the
    checks above catch."""
    probe = tmp_path / "probe.json"
    run = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "--noconftest",
                          *PROBE, "--cp-output-dir", str(tmp_path / "out"), "suites"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, ENV: str(probe)})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    with pytest.raises(AssertionError, match="imported by their checkout path, not as clusterproof.*suites.test_"):
        _held_to_one_name(json.loads(probe.read_text()))


@pytest.mark.cluster
def test_a_run_of_a_shipped_check_imports_each_module_once_and_keys_its_figures_as_installed(
        tmp_path, cluster, profile):
    probe = tmp_path / "probe.json"
    run = run_pytest([*PROBE, "suites/test_cluster_scale.py", "-k", "test_every_node_is_ready",
                      "--cp-kubeconfig", str(cluster.kubeconfig), "--cp-profile", profile.name],
                     tmp_path, env={ENV: str(probe)})
    assert run.returncode == 0, run.output[-4000:]
    _held_to_one_name(json.loads(probe.read_text()))
    keys = set(json.loads((tmp_path / "summary.json").read_text())["figures"])
    assert "suites/test_cluster_scale.py::test_every_node_is_ready[shared] :: nodes not Ready or still tainted" \
        in keys, sorted(keys)


@pytest.mark.unit
def test_a_shipped_checks_id_is_the_same_from_a_checkout_and_an_installed_package():
    from clusterproof.report.summary import check_id
    mod = "clusterproof.suites.test_cluster_scale"
    checkout = check_id("suites/test_cluster_scale.py::test_every_node_is_ready[gpu]", mod)
    installed = check_id("test_cluster_scale.py::test_every_node_is_ready[gpu]", mod)
    by_path = check_id("../venv/lib/python3.11/site-packages/clusterproof/suites/test_cluster_scale.py::"
                       "test_every_node_is_ready[gpu]", mod)
    assert checkout == installed == by_path == "suites/test_cluster_scale.py::test_every_node_is_ready[gpu]"
    assert check_id("test_team_pods.py::test_x", "test_team_pods") == "test_team_pods.py::test_x"
