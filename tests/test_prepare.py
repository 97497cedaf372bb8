"""Self-tests of what ``./proof run`` builds before a run (clusterproof.prepare): only what that run uses.

The embedded cluster's start uses kwok, etcd, the control plane and the mock NVML
library, the real nodes' kubelet when the profile has real nodes, and what its
checks start with it (the Coscheduling scheduler, Kueue and JobSet); a check may
use Prometheus and its history later. A run against an existing cluster
(--cp-kubeconfig) uses only the mock NVML library (the preflight checker runs
here) and Prometheus (the embedded one that scrapes the cluster); with
--cp-prometheus-url only the library. Decided from the run's own arguments, in
either spelling of each option, and from what the checks it selects use (a
collection of the run); nothing is built here (--dry-run, an empty cache).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from clusterproof import prepare
from clusterproof.provision import toolchain

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("args,names,history", [
    ([], {c.name for c in toolchain.COMPONENTS}, True),
    (["--kubeconfig", "K"], {"mocknvml", "prometheus"}, True),
    (["--cp-kubeconfig=K", "-k", "x", "--cp-prometheus-url=http://p:9090"], {"mocknvml"}, False),
    (["--context", "prod", "--prometheus-url", "http://p:9090"], {"mocknvml"}, False),   # the old aliases too
], ids=["embedded", "old-kubeconfig-alias", "kubeconfig-and-prometheus-url", "old-context-alias-alone"])
@pytest.mark.unit
def test_a_run_builds_only_what_it_uses(args, names, history):
    p = prepare.plan(prepare.run_args(["--cp-profile", "smoke", *args]))
    assert {c.name for c in p["components"]} == names and p["history"] is history
    assert p["real_nodes"] is (not args)   # smoke has a real node: only the embedded cluster's


@pytest.mark.parametrize("uses,start,later,history", [
    ([], ["kwok", "etcd", "kubernetes", "mocknvml", "kubelet"], [], False),
    (["prometheus", "gangs"], ["kwok", "etcd", "kubernetes", "mocknvml", "kubelet", "scheduler-plugins"],
     ["prometheus"], True),
    (["kueue"], ["kwok", "etcd", "kubernetes", "mocknvml", "kubelet", "kueue", "jobset"], [], False),
], ids=["control-plane-only", "prometheus-then-gangs", "kueue"])
@pytest.mark.unit
def test_what_the_checks_use_is_built_in_the_order_the_run_needs_it(uses, start, later, history):
    """What the cluster's start runs first (the real node's kubelet too: smoke has one), then what a check uses
    later; Prometheus's history only if a check uses Prometheus."""
    p = prepare.plan(prepare.run_args(["--cp-profile", "smoke"]), uses)
    assert [c.name for c in p["start"]] == start and [c.name for c in p["later"]] == later
    assert p["history"] is history and p["checks_use"] == uses


@pytest.mark.unit
def test_the_prepare_steps_own_options_are_not_passed_to_the_collection():
    assert prepare.pytest_args(["--dry-run", "--jobs", "2", "--cp-profile", "smoke", "suites", "-k", "gang"]) == \
        ["--cp-profile", "smoke", "suites", "-k", "gang"]


@pytest.mark.unit
def test_the_control_plane_follows_the_profiles_version():
    p = prepare.plan(prepare.run_args(["--cp-set", "kubernetes_version=v1.36.3"]))
    assert toolchain.kubernetes("v1.36.3") in p["components"] and toolchain.kubelet("v1.36.3") in p["components"]


@pytest.mark.cluster
def test_a_dry_run_on_an_empty_cache_names_what_a_kubeconfig_run_would_build(tmp_path):
    env = {**os.environ, "CLUSTERPROOF_CACHE": str(tmp_path)}
    run = subprocess.run([sys.executable, "-m", "clusterproof.prepare", "--dry-run", "--cp-kubeconfig", "K"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "mocknvml v0.13.4-1: would be built" in run.stdout and "prometheus v0.316.0: would be built" in run.stdout
    assert "kwok" not in run.stdout and "etcd" not in run.stdout and "kubernetes" not in run.stdout
    assert list(tmp_path.iterdir()) == []


def _dry_run(tmp_path, *args: str) -> str:
    env = {**os.environ, "CLUSTERPROOF_CACHE": str(tmp_path)}
    run = subprocess.run([sys.executable, "-m", "clusterproof.prepare", "--dry-run", "--cp-profile", "smoke", *args],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert list(tmp_path.iterdir()) == []
    return run.stdout


@pytest.mark.cluster
def test_a_run_of_one_suite_builds_only_what_its_checks_use(tmp_path):
    """The Kueue suite alone: Kueue and JobSet, no Prometheus and no history (the run was collected)."""
    out = _dry_run(tmp_path, "suites/test_kueue_admission.py")
    assert "the selected checks use: kueue\n" in out
    assert "kueue v0.17.0: would be built" in out and "jobset v0.11.1: would be built" in out
    assert "prometheus v" not in out and "Prometheus history: not used" in out


@pytest.mark.cluster
def test_a_run_whose_collection_fails_builds_everything_it_could_use(tmp_path):
    """An option pytest refuses: the collection says nothing, so everything is built; the run itself then says
    what is wrong."""
    out = _dry_run(tmp_path, "suites", "--no-such-option")
    assert "the selected checks use" not in out
    assert "prometheus v0.316.0: would be built" in out and "kueue v0.17.0: would be built" in out


@pytest.mark.cluster
def test_bad_input_is_one_line():
    run = subprocess.run([sys.executable, "-m", "clusterproof.prepare", "--cp-profile", "nope"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 4 and len(run.stderr.splitlines()) == 1 and "unknown profile" in run.stderr
    bad = subprocess.run([sys.executable, "-m", "clusterproof.provision.toolchain", "--only", "nope"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 4 and len(bad.stderr.splitlines()) == 1 and "no toolchain component" in bad.stderr
