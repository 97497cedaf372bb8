"""Self-tests of what ``./proof run`` builds before a run (clusterproof.prepare): only what that run uses.

The embedded cluster uses every toolchain component; a run against an existing
cluster (--cp-kubeconfig) only the mock NVML library (the preflight checker runs
here) and Prometheus (the embedded one that scrapes the cluster); with
--cp-prometheus-url only the library. Decided from the run's own arguments, in
either spelling of each option; nothing is built here (--dry-run, an empty cache).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from clusterproof import prepare
from clusterproof.provision import toolchain

pytestmark = pytest.mark.selftest
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("args,names,history", [
    ([], {c.name for c in toolchain.COMPONENTS}, True),
    (["--kubeconfig", "K"], {"mocknvml", "prometheus"}, True),
    (["--cp-kubeconfig=K", "-k", "x", "--cp-prometheus-url=http://p:9090"], {"mocknvml"}, False),
    (["--context", "prod", "--prometheus-url", "http://p:9090"], {"mocknvml"}, False),   # the old aliases too
], ids=["embedded", "old-kubeconfig-alias", "kubeconfig-and-prometheus-url", "old-context-alias-alone"])
def test_a_run_builds_only_what_it_uses(args, names, history):
    p = prepare.plan(prepare.run_args(["--cp-profile", "smoke", *args]))
    assert {c.name for c in p["components"]} == names and p["history"] is history
    assert p["real_nodes"] is (not args)   # smoke has a real node: only the embedded cluster's


def test_the_control_plane_follows_the_profiles_version():
    p = prepare.plan(prepare.run_args(["--cp-set", "kubernetes_version=v1.34.4"]))
    assert toolchain.kubernetes("v1.34.4") in p["components"]


def test_a_dry_run_on_an_empty_cache_names_what_a_kubeconfig_run_would_build(tmp_path):
    env = {**os.environ, "CLUSTERPROOF_CACHE": str(tmp_path)}
    run = subprocess.run([sys.executable, "-m", "clusterproof.prepare", "--dry-run", "--cp-kubeconfig", "K"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "mocknvml v0.13.4-1: would be built" in run.stdout and "prometheus v0.316.0: would be built" in run.stdout
    assert "kwok" not in run.stdout and "etcd" not in run.stdout and "kubernetes" not in run.stdout
    assert list(tmp_path.iterdir()) == []


def test_bad_input_is_one_line():
    run = subprocess.run([sys.executable, "-m", "clusterproof.prepare", "--cp-profile", "nope"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 4 and len(run.stderr.splitlines()) == 1 and "unknown profile" in run.stderr
    bad = subprocess.run([sys.executable, "-m", "clusterproof.provision.toolchain", "--only", "nope"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 4 and len(bad.stderr.splitlines()) == 1 and "no toolchain component" in bad.stderr
