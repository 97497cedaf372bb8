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
import time

import psutil
import pytest

from fixtures.kwok import NAME_PREFIX, KwokCluster, sweep_clusters
from fixtures.waiting import wait_for
from tests.harness import ROOT

pytestmark = pytest.mark.selftest
SUITE = "suites/test_cluster_scale.py"
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok-controller (the
# scale suite schedules no gangs: no Coscheduling components).
COMPONENTS = 5


@pytest.fixture
def running_run(tmp_path):
    """A suite run in a subprocess whose embedded cluster is up: (cluster, process, pids).

    Whatever the test does to the run, the process and cluster are gone afterwards.
    """
    run_id = f"cleanup-{os.urandom(2).hex()}"
    kc = KwokCluster(f"{NAME_PREFIX}{run_id}", 1, 40)
    cmd = [sys.executable, "-m", "pytest", SUITE, "--profile", "smoke", "--run-id", run_id, "-q",
           f"--alluredir={tmp_path / 'allure'}", f"--summary={tmp_path / 'summary.json'}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)

    def pids():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early:\n{proc.stdout.read()[-2000:]}")
        p = kc.pids()
        return p if len(p) == COMPONENTS and kc.kubeconfig.exists() else None
    try:
        yield kc, proc, wait_for(pids, timeout=180, interval=0.5,
                                 what=f"cluster {kc.name} running {COMPONENTS} components")
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
    assert kc.name in sweep_clusters()
    assert not kc.directory.exists()
    wait_for(lambda: _alive(pids), until=lambda a: not a, timeout=30, interval=0.5,
             what="every control-plane process of the killed run gone after the sweep")


def test_a_second_interrupt_during_teardown_does_not_abort_it(running_run):
    """An impatient user presses Ctrl-C again (or CI sends SIGTERM after SIGINT) while the run
    is deleting its cluster: the teardown goes on, and nothing is left."""
    kc, proc, pids = running_run
    proc.send_signal(signal.SIGINT)

    def again(rc):  # keep interrupting for as long as the run takes to end
        for sig in (signal.SIGINT, signal.SIGTERM):
            if rc is None and proc.poll() is None:
                proc.send_signal(sig)
    wait_for(proc.poll, until=lambda rc: rc is not None, timeout=120, interval=0.2, on_poll=again,
             what="the interrupted run ended")
    out, _ = proc.communicate(timeout=60)
    assert "ignored: still removing what this run created" in out, out[-2000:]
    assert not kc.directory.exists(), f"{kc.directory} left behind:\n{out[-2000:]}"
    wait_for(lambda: _alive(pids), until=lambda a: not a, timeout=30, interval=0.5,
             what="every control-plane process gone after repeated interrupts")


@pytest.fixture
def fake_cluster_dir(tmp_path, monkeypatch):
    """A cluster directory whose pid files name three processes: one of its own, one that merely
    shares a component's name, and one whose pid file is older than the process (a recycled pid)."""
    monkeypatch.setenv("CLUSTERPROOF_CACHE", str(tmp_path / "cache"))
    kc = KwokCluster(f"{NAME_PREFIX}fake-{os.urandom(2).hex()}", 1, 40)
    (kc.directory / "pids").mkdir(parents=True)
    sleeper = "import sys, time; time.sleep(300)"
    procs = {
        "own": subprocess.Popen([sys.executable, "-c", sleeper, str(kc.directory)]),
        "namesake": subprocess.Popen([sys.executable, "-c", sleeper, "etcd", "--data-dir=/elsewhere"]),
        "recycled": subprocess.Popen([sys.executable, "-c", sleeper, str(kc.directory)]),
    }
    files = {"own": "kube-apiserver", "namesake": "etcd", "recycled": "kube-scheduler"}
    for who, component in files.items():
        (kc.directory / "pids" / f"{component}.pid").write_text(str(procs[who].pid))
    old = time.time() - 3600   # written an hour before the process started: not its pid file
    os.utime(kc.directory / "pids" / "kube-scheduler.pid", (old, old))
    try:
        yield kc, procs
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_teardown_kills_only_the_clusters_own_processes(fake_cluster_dir):
    kc, procs = fake_cluster_dir
    kc.delete()
    wait_for(lambda: procs["own"].poll(), until=lambda rc: rc is not None, timeout=10, interval=0.1,
             what="the cluster's own process killed")
    assert procs["namesake"].poll() is None, "a process that only shares a component's name was killed"
    assert procs["recycled"].poll() is None, "a process younger than its pid file (recycled pid) was killed"


def test_an_interrupted_locust_run_leaves_no_locust_process(tmp_path):
    """``run_locust`` with locust's ``--processes`` workers, interrupted: master and forked workers go."""
    prefix = tmp_path / "idle"
    script = ("from pathlib import Path; from load.runner import run_locust; "
              f"run_locust('tests/locust_idle.py', 'http://127.0.0.1:9', 4, [], Path({str(prefix)!r}), "
              "timeout_s=300, processes=2)")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def locusts():
        return [p for p in psutil.process_iter(["cmdline"])
                if any(str(prefix) in a for a in p.info["cmdline"] or []) and p.pid != proc.pid]
    try:
        wait_for(locusts, until=lambda ps: len(ps) >= 3, timeout=60, interval=0.5,
                 what="locust master and two worker processes running")
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
        wait_for(locusts, until=lambda ps: not ps, timeout=5, interval=0.2,
                 what="no locust process left after the interrupt")
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in locusts():
            p.kill()
