"""Negative controls and bad input for suites/test_burst_pod_creation.py.

The suite runs as a user would run it (a pytest subprocess, ``--cp-kubeconfig``
to the session's embedded cluster). Its healthy run is the gate's own
(``./proof test`` runs it on smoke alone after the self-tests, its latency
SLOs judged). Here the kube-scheduler is stopped (pods are never bound: the
suite must end within its stall bound and say that the scheduler is not
running), and then throttled to 1 API call/s (pods start, but far outside
the startup SLO). After every run no pod of that run may be left. Bad profile values end the
run before any test with one line.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from clusterproof.cluster.health import leader_problems
from clusterproof.core.run import RUN_LABEL, new_run_id
from clusterproof.core.timeparse import epoch
from clusterproof.core.waiting import wait_for
from clusterproof.kube.client import list_raw
from tests.harness import run_pytest, shipped_slo

pytestmark = pytest.mark.control
SUITE = "suites/test_burst_pod_creation.py"
JOBS = ("burst-0", "burst-1")  # the smoke profile's two jobs


def _pid_alive(pid: int) -> bool:
    """Running and not a zombie (a scheduler this test started is its child until reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class SchedulerProcess:
    """Stop and restart the embedded cluster's kube-scheduler with the same command line.

    kwokctl has no per-component restart, so this kills the process recorded
    in the cluster's pid file and starts the recorded argv again, in the
    recorded environment (kwokctl's componentsPatches put GOGC and GOMEMLIMIT
    there: profile key component_go_env), optionally with another --config,
    logging to the same file and updating the pid file.
    """

    def __init__(self, kwok):
        self.pid_file = kwok.directory / "pids" / "kube-scheduler.pid"
        self.log = kwok.directory / "logs" / "kube-scheduler.log"
        self.directory = kwok.directory
        self.child: subprocess.Popen | None = None
        self.argv = Path(f"/proc/{self.pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        self.env = dict(v.split("=", 1) for v in
                        Path(f"/proc/{self.pid}/environ").read_bytes().decode().split("\0") if "=" in v)

    @property
    def pid(self) -> int:
        return int(self.pid_file.read_text().strip())

    def stop(self) -> None:
        pid = self.pid
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not _pid_alive(pid), timeout=30, interval=0.2, what=f"kube-scheduler {pid} gone")
        if self.child is not None and self.child.pid == pid:
            self.child.wait(timeout=10)

    def start(self, config: Path | None = None) -> None:
        argv = [a.decode() for a in self.argv]
        if config is not None:
            argv = [f"--config={config}" if a.startswith("--config=") else a for a in argv]
        with open(self.log, "ab") as log:
            self.child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.directory,
                                          env=self.env, start_new_session=True)
        self.pid_file.write_text(str(self.child.pid))

    def throttled_config(self, qps: float, burst: int) -> Path:
        current = next(a.decode().split("=", 1)[1] for a in self.argv if a.startswith(b"--config="))
        doc = yaml.safe_load(Path(current).read_text())
        doc.setdefault("clientConnection", {}).update({"qps": qps, "burst": burst})
        path = self.directory / "clusterproof-scheduler-throttled.yaml"
        path.write_text(yaml.safe_dump(doc))
        return path


def _wait_scheduler_leads(cluster, since: float) -> None:
    """The (re)started scheduler holds the leader lease (after the killed one's expires)."""
    def renewed():
        spec = list_raw(cluster.api, "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/"
                        "kube-scheduler").get("spec", {})
        return (epoch(spec.get("renewTime")) or 0.0) >= since
    wait_for(renewed, timeout=90, interval=1, what="restarted kube-scheduler holds its leader lease")


@pytest.fixture
def scheduler(cluster, supervisor):
    """kube-scheduler, taken out of supervision while the test stops or reconfigures it."""
    if cluster.kwok is None:
        pytest.skip("needs the embedded cluster: it stops and restarts kube-scheduler")
    s = SchedulerProcess(cluster.kwok)
    supervisor.pause("kube-scheduler")
    try:
        yield s
    finally:
        # Whatever the test did, the cluster gets its own scheduler back.
        if not _pid_alive(s.pid) or Path(f"/proc/{s.pid}/cmdline").read_bytes() != b"\0".join(s.argv) + b"\0":
            if _pid_alive(s.pid):
                s.stop()
            t = time.time() - 1
            s.start()
            _wait_scheduler_leads(cluster, t)
        supervisor.resume("kube-scheduler")


def _run(cluster, profile, tmp_path, *sets, shipped=()):
    """The burst suite against ``cluster``; ``shipped``: the latency SLOs it is judged on (others not:
    tests/harness.py, LATENCY_SLOS)."""
    run_id = new_run_id().replace("-", "")[-12:] + "b"
    run = run_pytest([SUITE, "--cp-kubeconfig", str(cluster.kubeconfig), "--cp-profile", profile.name,
                      "--cp-run-id", run_id, *[f"--cp-set={s}" for s in sets],
                      *[shipped_slo(profile, key) for key in shipped]], tmp_path, timeout=600)
    return run, run_id


def _assert_nothing_left(cluster, run_id):
    pods = list_raw(cluster.api, "/api/v1/pods", {"labelSelector": f"{RUN_LABEL}={run_id}"})["items"]
    assert not pods, f"{len(pods)} pods of run {run_id} left behind: {[p['metadata']['name'] for p in pods][:5]}"


def test_burst_suite_fails_at_once_when_the_scheduler_is_gone(cluster, profile, scheduler, tmp_path):
    """kube-scheduler stopped (and its leader lease run out): every check says so at once, naming
    it, instead of each waiting for binds that cannot come."""
    scheduler.stop()
    wait_for(lambda: leader_problems(cluster.api, required=True), until=lambda p: any("kube-scheduler" in x for x in p),
             timeout=60, interval=1, what="kube-scheduler's leader lease expired")
    t0 = time.monotonic()
    run, run_id = _run(cluster, profile, tmp_path)
    elapsed = time.monotonic() - t0
    assert run.returncode == 1, run.output[-3000:]
    # Bounded by the control-plane check (45 s to recover), not by burst_timeout_s (600 s).
    assert elapsed < 150, f"the suite took {elapsed:.0f} s to notice that the scheduler is gone"
    assert len(run.failures) == 4 + len(JOBS), run.output[-3000:]
    for msg in run.failures.values():
        assert "the control plane was already broken when this module started" in msg, msg
        assert "kube-scheduler's leader lease was last renewed" in msg, msg
    _assert_nothing_left(cluster, run_id)


def test_burst_suite_catches_a_throttled_scheduler(cluster, profile, scheduler, tmp_path):
    config = scheduler.throttled_config(qps=1, burst=1)
    scheduler.stop()
    t = time.time() - 1
    scheduler.start(config)
    _wait_scheduler_leads(cluster, t)
    run, run_id = _run(cluster, profile, tmp_path, shipped=("slo_pod_startup_p99_s",))
    assert run.returncode == 1, run.output[-3000:]
    msg = run.failures.get("test_steady_pod_startup_meets_the_slo", "")
    assert f"pod startup SLO (p99 <= {profile.slo_pod_startup_p99_s:g} s) broken" in msg, run.output[-3000:]
    for job in JOBS:  # slow, not broken: every job is bound completely, but late
        msg = run.failures.get(f"test_every_job_is_bound_completely_in_time[{job}]", "")
        assert f"job {job} was bound completely" in msg and "at the required" in msg, run.output[-3000:]
    assert "test_steady_pod_creates_meet_the_mutating_call_slo" in run.passed, run.output[-3000:]
    _assert_nothing_left(cluster, run_id)


class EtcdStalls(threading.Thread):
    """etcd stopped (SIGSTOP) for ``stop_s`` of every ``period_s``: a disk whose fsyncs stall."""

    def __init__(self, pid: int, stop_s: float = 2.0, period_s: float = 3.0):
        super().__init__(daemon=True)
        self.pid, self.stop_s, self.period_s, self.done = pid, stop_s, period_s, threading.Event()

    def run(self) -> None:
        try:
            while not self.done.is_set():
                os.kill(self.pid, signal.SIGSTOP)
                self.done.wait(self.stop_s)
                os.kill(self.pid, signal.SIGCONT)
                self.done.wait(self.period_s - self.stop_s)
        finally:
            os.kill(self.pid, signal.SIGCONT)


def test_burst_suite_catches_a_stalling_etcd(cluster, profile, api_guard, tmp_path):
    """The mutating-call SLO is asserted on the apiserver's own histogram: an etcd that stalls makes
    every write slow inside the apiserver, and the check names the figure."""
    if cluster.kwok is None:
        pytest.skip("needs the embedded cluster: it stalls its etcd")
    # Declared to the API health guard: a 5xx while etcd stalls on purpose is this control's doing.
    with api_guard.excuse("etcd stalled on purpose (burst negative control)"):
        stalls = EtcdStalls(cluster.kwok.pids()["etcd"])
        stalls.start()
        try:
            run, run_id = _run(cluster, profile, tmp_path, shipped=("slo_mutating_p99_s",))
        finally:
            stalls.done.set()
            stalls.join(timeout=10)
    assert run.returncode == 1, run.output[-3000:]
    msg = run.failures.get("test_steady_pod_creates_meet_the_mutating_call_slo", "")
    assert f"mutating API call SLO (p99 <= {profile.slo_mutating_p99_s:g} s) broken" in msg, run.output[-3000:]
    assert "the apiserver's own histogram says p99" in msg, msg
    _assert_nothing_left(cluster, run_id)


BAD = [
    pytest.param(["burst_job_size=500"], "is larger than the 38 nodes of the shared pool",
                 id="burst-larger-than-cluster"),
    pytest.param(["burst_jobs=0"], "burst_jobs must be >= 1, got 0", id="no-jobs"),
    pytest.param(["slo_pod_startup_p99_s=0"], "slo_pod_startup_p99_s must be > 0", id="impossible-slo"),
    pytest.param(["burst_users=1", "burst_locust_processes=2"], "every locust worker needs a user",
                 id="more-workers-than-users"),
    pytest.param(["burst_locust_workers=2", "burst_locust_processes=2"], "remote workers or local processes, not both",
                 id="remote-and-local-workers"),
    pytest.param(["burst_locust_workers=2", "burst_locust_worker_names=a"],
                 "burst_locust_worker_names lists 1 names but burst_locust_workers is 2", id="worker-names-short"),
]


@pytest.mark.parametrize("sets,expected", BAD)
def test_bad_burst_profile_gives_one_readable_line(sets, expected, tmp_path):
    run = run_pytest([SUITE, "--cp-profile", "smoke", *[f"--cp-set={s}" for s in sets]], tmp_path, timeout=120)
    assert run.returncode == 4 and expected in run.output and "Traceback" not in run.output, run.output[-2000:]


def _ahead() -> None:
    """Locust's master counts a worker lost after 3 missed heartbeats, 1 s apart (locust/runners.py
    HEARTBEAT_LIVENESS, not configurable): on a loaded CI machine a starved worker was lost after 11 s and its
    share of the burst never made. This test checks the split, not the machine's load, so its processes run
    ahead of the rest where this user may raise a priority (root), as they are on their own machines."""
    try:
        os.nice(-5)
    except PermissionError:
        pass


def test_locust_master_and_separate_workers_split_the_burst(cluster, profile, namespace, run_id, tmp_path):
    """The multi-machine path, on loopback: a ``--master`` and two ``--worker`` processes over TCP.

    The distributed commands of docs/suites/burst_pod_creation.md, run as separate processes (not
    ``--processes``): every pod is created exactly once across the workers and
    the master's final statistics count all of them.
    """
    from clusterproof.core.locust import LOCUST, ROOT, read_stats
    from clusterproof.core.ports import free_port
    from clusterproof.kube.tokens import create_load_identity

    jobs, size, workers = 2, 10, 2
    ident = create_load_identity(cluster.api, namespace, run_id, tmp_path / "id")
    common = ["-f", str(ROOT / "load/burst.py"), "--kube-token-file", str(ident.token_file)]
    if ident.ca_file:
        common += ["--kube-ca-file", ident.ca_file]
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    master = subprocess.Popen(
        [str(LOCUST), *common, "--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port),
         "--headless", "--expect-workers", str(workers), "-u", "8", "-r", "8", "--run-time", "120s",
         "--host", cluster.api.configuration.host, "--csv", str(tmp_path / "burst"), "--only-summary",
         "--burst-namespace", namespace, "--burst-run-id", run_id, "--burst-jobs", str(jobs),
         "--burst-job-size", str(size), "--burst-job-prefix", "burst",
         "--burst-node-selector", f"{profile.pool_label}=shared"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=_ahead)
    procs = [subprocess.Popen([str(LOCUST), *common, "--worker", "--master-host", "127.0.0.1",
                               "--master-port", str(port)],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              preexec_fn=_ahead)
             for _ in range(workers)]
    try:
        out, _ = master.communicate(timeout=180)
    finally:
        for p in [master, *procs]:
            if p.poll() is None:
                p.kill()
            p.wait()
    pods = list_raw(cluster.api, f"/api/v1/namespaces/{namespace}/pods",
                    {"labelSelector": f"{RUN_LABEL}={run_id}"})["items"]
    names = sorted(p["metadata"]["name"] for p in pods)
    assert len(names) == jobs * size, f"{len(names)} pods created, expected {jobs * size}: {out[-2000:]}"
    stats, failures = read_stats(tmp_path / "burst")
    create = stats.get("create pod")
    assert create and create.requests == jobs * size and create.failures == 0 and not failures, (
        f"master's statistics: {create}, failures {failures}; {out[-2000:]}")
