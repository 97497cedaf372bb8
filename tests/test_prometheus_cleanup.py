"""No Prometheus process and no Prometheus data directory outlive their run.

The Prometheus suite is started as a user starts it and interrupted once its
embedded Prometheus runs: Ctrl-C on the embedded cluster (its directory
lives in the cluster's), SIGTERM against an existing cluster
(``--cp-kubeconfig``: its own directory under the cache). A run killed with
SIGKILL cannot clean up: its Prometheus dies with it (``PR_SET_PDEATHSIG``)
and the next run's sweep removes the directory.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import nullcontext

import psutil
import pytest

from clusterproof.cluster.kwok import NAME_PREFIX, KwokCluster
from clusterproof.core.processes import owned_process
from clusterproof.core.waiting import wait_for
from clusterproof.prometheus.server import PID_FILE, runs_root, sweep_runs
from tests.harness import ROOT, kept_from_other_sweeps

pytestmark = pytest.mark.cluster
SUITE = "suites/test_prometheus_limits.py"


def _start(tmp_path, run_id: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pytest", SUITE, "--cp-profile", "smoke", "--cp-run-id", run_id, "-q",
           "-p", "no:randomly", "--cp-set", "real_nodes=0", f"--alluredir={tmp_path / 'allure'}",
           f"--cp-summary={tmp_path / 'summary.json'}", f"--cp-output-dir={tmp_path / 'out'}", *extra]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def running_prometheus(proc: subprocess.Popen, directory) -> psutil.Process:
    def probe():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before its Prometheus ran:\n{proc.stdout.read()[-2000:]}")
        return owned_process(directory / PID_FILE, directory)
    return wait_for(probe, timeout=300, interval=0.5, what=f"the run's Prometheus running in {directory}")


def _gone(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_ctrl_c_on_the_embedded_cluster_leaves_no_prometheus(tmp_path):
    run_id = f"promint-{os.urandom(2).hex()}"
    kc = KwokCluster(f"{NAME_PREFIX}{run_id}", 1, 40)
    proc = _start(tmp_path, run_id)
    try:
        prom = running_prometheus(proc, kc.directory / "prometheus")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=240)
        assert not kc.directory.exists(), f"{kc.directory} left behind:\n{out[-2000:]}"
        wait_for(lambda: _gone(prom), timeout=30, interval=0.5, what="the embedded Prometheus gone after Ctrl-C")
    finally:
        if proc.poll() is None:
            proc.kill()
        kc.delete()


@pytest.mark.parametrize("sig", [pytest.param(signal.SIGTERM, id="sigterm"),
                                 pytest.param(signal.SIGKILL, id="sigkill")])
def test_an_interrupted_run_against_an_existing_cluster_leaves_no_prometheus(sig, cluster, tmp_path):
    run_id = f"promint-{os.urandom(2).hex()}"
    directory = runs_root() / f"cp-{run_id}"
    proc = _start(tmp_path, run_id, "--cp-kubeconfig", str(cluster.kubeconfig))
    try:
        prom = running_prometheus(proc, directory)
        with kept_from_other_sweeps(directory) if sig == signal.SIGKILL else nullcontext():
            proc.send_signal(sig)
            out, _ = proc.communicate(timeout=240)
            wait_for(lambda: _gone(prom), timeout=30, interval=0.5,
                     what=f"the run's Prometheus gone after {signal.Signals(sig).name}")
            if sig == signal.SIGKILL:
                assert directory.exists(), "SIGKILL cannot clean up: the directory should still be there"
        if sig == signal.SIGKILL:
            assert f"cp-{run_id}" in sweep_runs(), "the next run's sweep did not remove the killed run's Prometheus"
        assert not directory.exists(), f"{directory} left behind:\n{out[-2000:]}"
    finally:
        if proc.poll() is None:
            proc.kill()
        sweep_runs()
