"""Nothing the harness creates outlives its run.

Ctrl-C (and SIGTERM, as CI sends on timeout) in the middle of a run must tear
the embedded cluster down; a run killed with SIGKILL cannot clean up, so the
next run's sweeper must remove its cluster and processes.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from fixtures.kwok import NAME_PREFIX, KwokCluster, sweep_clusters
from fixtures.waiting import wait_for
from fixtures.run import OWNER_PID, metadata
from tests.harness import ROOT, run_pytest

pytestmark = pytest.mark.selftest
SUITE = "suites/test_cluster_scale.py"


@pytest.fixture
def running_run(tmp_path):
    """A suite run in a subprocess whose embedded cluster is up: (cluster, process, pids).

    Whatever the test does to the run, the process and cluster are gone afterwards.
    """
    run_id = f"cleanup-{os.urandom(2).hex()}"
    kc = KwokCluster(f"{NAME_PREFIX}{run_id}", 1, 40)
    cmd = [sys.executable, "-m", "pytest", SUITE, "--profile", "smoke", "--run-id", run_id, "-q",
           f"--alluredir={tmp_path / 'allure'}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)

    def pids():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early:\n{proc.stdout.read()[-2000:]}")
        p = kc.pids()
        return p if len(p) == 5 and kc.kubeconfig.exists() else None
    try:
        yield kc, proc, wait_for(pids, timeout=180, interval=0.5,
                                 what=f"cluster {kc.name} running 5 components")
    finally:
        if proc.poll() is None:
            proc.kill()
        kc.delete()


def _alive(pids: dict[str, int]) -> list[str]:
    return [c for c, pid in pids.items()
            if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize("sig", [pytest.param(signal.SIGINT, id="ctrl-c"),
                                 pytest.param(signal.SIGTERM, id="sigterm")])
def test_interrupted_run_leaves_no_cluster_and_no_process(sig, running_run):
    kc, proc, pids = running_run
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=180)
    assert not kc.directory.exists(), f"{kc.directory} left behind:\n{out[-2000:]}"
    wait_for(lambda: _alive(pids), until=lambda a: not a, timeout=30, interval=0.5,
             what="every control-plane process gone after the interrupt")


def test_killed_run_is_swept_by_the_next_run(running_run):
    kc, proc, pids = running_run
    proc.kill()  # SIGKILL: no teardown can run
    proc.wait(timeout=30)
    assert kc.directory.exists() and _alive(pids), "SIGKILL should have left the cluster running"
    assert kc.name in sweep_clusters(max_age_hours=6)
    assert not kc.directory.exists()
    wait_for(lambda: _alive(pids), until=lambda a: not a, timeout=30, interval=0.5,
             what="every control-plane process of the killed run gone after the sweep")


def test_existing_cluster_run_sweeps_namespaces_of_dead_runs(cluster, tmp_path):
    """A namespace left by a killed run (owner pid dead on this host) is removed by
    the next run against that cluster; a live run's namespace is left alone."""
    dead = metadata(f"cp-dead-{os.urandom(2).hex()}", "dead-run")
    dead["annotations"][OWNER_PID] = "999999999"
    live = metadata(f"cp-live-{os.urandom(2).hex()}", "live-run")  # owner: this process
    for meta in (dead, live):
        cluster.core.create_namespace({"metadata": meta})
    try:
        run = run_pytest([SUITE, "--kubeconfig", str(cluster.kubeconfig),
                          "-k", "registered and shared"], tmp_path)
        assert f"swept 1 namespace(s) left by earlier runs: {dead['name']}" in run.output, run.output[-2000:]
        ns = {n.metadata.name: n.status.phase for n in cluster.core.list_namespace().items}
        assert ns.get(dead["name"], "Terminating") == "Terminating"
        assert ns.get(live["name"]) == "Active"
    finally:
        for meta in (dead, live):
            try:
                cluster.core.delete_namespace(meta["name"])
            except Exception:
                pass

