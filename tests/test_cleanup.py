"""Nothing the harness creates outlives its run.

Ctrl-C (and SIGTERM, as CI sends on timeout) in the middle of a run must tear
the embedded cluster down; a run killed with SIGKILL cannot clean up, so the
next run's sweeper must remove its cluster and processes.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import yaml

from clusterproof.cluster import watchdog
from clusterproof.cluster.kwok import NAME_PREFIX, OWNER_FILE, KwokCluster, kwokctl, sweep_clusters
from clusterproof.core.errors import HarnessError
from clusterproof.core.processes import clear_pid_files, owner_alive, this_host
from clusterproof.core.waiting import wait_for
from clusterproof.preflight import run as preflight
from clusterproof.prometheus.server import runs_root, sweep_runs
from clusterproof.provision import toolchain
from tests.harness import ROOT, kept_from_other_sweeps, private_cache

pytestmark = pytest.mark.cluster
SUITE = "suites/test_cluster_scale.py"
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok-controller (the
# scale suite schedules no gangs: no Coscheduling components).
COMPONENTS = 5
WATCHDOG_BOUND_S = 60     # a bound, not a figure (the test prints what it took)


@pytest.fixture
def running_run(tmp_path):
    """A suite run in a subprocess whose embedded cluster is up: (cluster, process, pids).

    Whatever the test does to the run, the process and cluster are gone afterwards.
    """
    yield from _running_run(tmp_path)


@pytest.fixture
def running_run_own_cache(tmp_path):
    """``running_run`` with a cache of its own (``private_cache``): no run of another parallel worker
    sweeps its cluster, so whatever removes it after a SIGKILL is the cluster's own watchdog."""
    yield from _running_run(tmp_path, private_cache(tmp_path))


def _running_run(tmp_path: Path, cache: Path | None = None):
    run_id = f"cleanup-{os.urandom(2).hex()}"
    kc = KwokCluster(f"{NAME_PREFIX}{run_id}", 1, 40, **({"root": cache / "kwok"} if cache else {}))
    cmd = [sys.executable, "-m", "pytest", SUITE, "--cp-profile", "smoke", "--cp-run-id", run_id, "-q",
           "--cp-set", "real_nodes=0", f"--alluredir={tmp_path / 'allure'}",
           f"--cp-summary={tmp_path / 'summary.json'}", f"--cp-output-dir={tmp_path / 'out'}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **({"CLUSTERPROOF_CACHE": str(cache)} if cache else {})})

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


def _naming(directory: Path) -> list[str]:
    """Processes with ``directory`` on their command line (a component, or the kwokctl that starts them)."""
    return [f"{p.info['name']} ({p.pid})" for p in psutil.process_iter(["cmdline", "name", "status"])
            if p.info["status"] != psutil.STATUS_ZOMBIE and any(str(directory) in a for a in p.info["cmdline"] or [])]


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
    """The run and its watchdog SIGKILLed (``kept_from_other_sweeps`` stops the watchdog): the cluster stays
    up -- the negative control of the watchdog test below -- until the next run's sweep removes it."""
    kc, proc, pids = running_run
    with kept_from_other_sweeps(kc.directory):
        assert watchdog.running(kc.directory) is None, "the cluster's watchdog still runs"
        proc.kill()  # SIGKILL: no teardown can run
        proc.wait(timeout=30)
        assert kc.directory.exists() and _alive(pids), "SIGKILL should have left the cluster running"
    assert kc.name in sweep_clusters()
    assert not kc.directory.exists()
    wait_for(lambda: _alive(pids), until=lambda a: not a, timeout=30, interval=0.5,
             what="every control-plane process of the killed run gone after the sweep")


def test_a_killed_runs_cluster_is_deleted_by_its_watchdog_within_seconds(running_run_own_cache):
    """SIGKILL: no teardown runs, and no later run is needed -- the cluster's watchdog (its own session, not a
    child of the run) sees the run die and deletes the control plane as the sweeper would, and says so in
    its log."""
    kc, proc, pids = running_run_own_cache
    dog = watchdog.running(kc.directory)
    assert dog is not None and dog["owner"] == proc.pid, f"no watchdog watching run pid {proc.pid}: {dog}"
    p = psutil.Process(dog["pid"])
    assert p.ppid() != proc.pid and os.getsid(p.pid) not in (os.getsid(proc.pid), os.getsid(0)), \
        "the watchdog is the run's child or in its session: a kill of the run's group would take it too"
    proc.kill()
    proc.wait(timeout=30)
    t0 = time.monotonic()
    wait_for(lambda: [*_alive(pids), *_naming(kc.directory), *(["directory"] if kc.directory.exists() else []),
                      *(["watchdog"] if psutil.pid_exists(dog["pid"]) else [])],
             until=lambda left: not left, timeout=WATCHDOG_BOUND_S, interval=0.2,
             what=f"the killed run's control plane, kwokctl, directory {kc.directory} and watchdog gone")
    print(f"SIGKILL -> control plane and directory gone in {time.monotonic() - t0:.1f} s")
    log = (toolchain.cache_root() / "logs" / watchdog.LOG).read_text().splitlines()
    said = [ln.split(f"{kc.name}: ", 1)[1] for ln in log if f"watchdog[{dog['pid']}] {kc.name}: " in ln]
    assert len(said) >= 2 and said[-2] == f"run pid {proc.pid} ended without removing it: sweeping" \
        and said[-1].startswith(f"deleted {kc.name} ("), f"the watchdog's log says: {said}"


OWNER = ("import sys, time; from pathlib import Path; from clusterproof.cluster.kwok import KwokCluster; "
         "KwokCluster(sys.argv[1], 1, 40, root=Path(sys.argv[2])).prepare(); print('ready', flush=True); "
         "time.sleep(600)")


def _owner_run(kc: KwokCluster) -> subprocess.Popen:
    """A stand-in run that claims ``kc``'s directory as a run does (``prepare``: its watchdog starts)."""
    proc = subprocess.Popen([sys.executable, "-c", OWNER, kc.name, str(kc.root)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == "ready", "the stand-in run did not claim the cluster"
    return proc


@pytest.mark.parametrize("case", ["killed", "kept", "removed-by-its-run"])
def test_the_watchdog_deletes_only_what_the_sweeper_would(case, fake_cluster_dir):
    """The watchdog of a killed run kills only the cluster's own processes (the stale-pid-file directory above);
    it leaves a cluster kept with --cp-keep-cluster; it exits without a word more once its run has removed the
    cluster itself."""
    kc, procs = fake_cluster_dir
    run = _owner_run(kc)
    dog = watchdog.running(kc.directory)
    try:
        assert dog is not None, "no watchdog started with the claim"
        if case == "removed-by-its-run":
            shutil.move(kc.directory, kc.directory.with_name(kc.name + "-aside"))   # as rmtree, but kept to look
        if case == "kept":
            (kc.directory / "keep").touch()
        run.kill()
        run.wait(timeout=30)
        wait_for(lambda: psutil.pid_exists(dog["pid"]), until=lambda alive: not alive, timeout=WATCHDOG_BOUND_S,
                 interval=0.2, what=f"the watchdog (pid {dog['pid']}) done")
        if case == "killed":
            _own_killed_and_no_other(kc, procs)
        else:
            assert all(p.poll() is None for p in procs.values()), "a process of a kept or removed cluster was killed"
            assert kc.directory.exists() == (case == "kept")
    finally:
        if run.poll() is None:
            run.kill()
        aside = kc.directory.with_name(kc.name + "-aside")
        if aside.exists():
            shutil.move(aside, kc.directory)
        (kc.directory / "keep").unlink(missing_ok=True)
    log = (toolchain.cache_root() / "logs" / watchdog.LOG).read_text()
    last = [ln for ln in log.splitlines() if f"watchdog[{dog['pid']}] {kc.name}: " in ln][-1]
    expected = {"killed": f"deleted {kc.name}", "kept": "kept on purpose (--cp-keep-cluster): left running",
                "removed-by-its-run": "removed by its run: done"}[case]
    assert expected in last, f"the watchdog's last line: {last}"


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


def _dead_owner() -> dict:
    """An owner record of this host whose process has ended (a run killed with SIGKILL)."""
    p = subprocess.Popen(["true"])
    started = psutil.Process(p.pid).create_time() if psutil.pid_exists(p.pid) else time.time()
    p.wait()
    return {"host": this_host(), "pid": p.pid, "started": started}


@pytest.fixture
def fake_cluster_dir(tmp_path, monkeypatch):
    """A cluster directory that the real kwokctl can delete (a ``kwok.yaml`` declaring its components,
    binary runtime), whose pid files name four live processes: one of its own, one that merely shares a
    component's name, one whose pid file is older than the process (a recycled pid), and an unrelated
    ``sleep`` (the stale file of a run killed long ago, its pid since given to someone else).

    kwokctl v0.8.0 SIGKILLs every pid its component pid files hold: without the harness's own checks
    all but the first would die (``test_kwokctl_alone_kills_whatever_a_stale_pid_file_names``)."""
    real_bin = toolchain.ensure(toolchain.KWOK).directory.parent
    monkeypatch.setenv("CLUSTERPROOF_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "bin").symlink_to(real_bin)   # kwokctl itself, so delete() runs it
    kc = KwokCluster(f"{NAME_PREFIX}fake-{os.urandom(2).hex()}", 1, 40)
    (kc.directory / "pids").mkdir(parents=True)
    sleeper = "import sys, time; time.sleep(300)"
    procs = {
        "own": subprocess.Popen([sys.executable, "-c", sleeper, str(kc.directory)]),
        "namesake": subprocess.Popen([sys.executable, "-c", sleeper, "etcd", "--data-dir=/elsewhere"]),
        "recycled": subprocess.Popen([sys.executable, "-c", sleeper, str(kc.directory)]),
        "stranger": subprocess.Popen(["sleep", "300"]),
    }
    files = {"own": "kube-apiserver", "namesake": "etcd", "recycled": "kube-scheduler",
             "stranger": "kube-controller-manager"}
    for who, component in files.items():
        (kc.directory / "pids" / f"{component}.pid").write_text(str(procs[who].pid))
    old = time.time() - 3600   # written an hour before the process started: not its pid file
    os.utime(kc.directory / "pids" / "kube-scheduler.pid", (old, old))
    (kc.directory / "kwok.yaml").write_text(yaml.safe_dump({
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokctlConfiguration",
        "options": {"runtime": "binary"},
        "components": [{"name": c, "binary": f"/nonexistent/{c}", "workDir": str(kc.directory)}
                       for c in files.values()]}))
    try:
        yield kc, procs
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def _own_killed_and_no_other(kc, procs) -> None:
    wait_for(lambda: procs["own"].poll(), until=lambda rc: rc is not None, timeout=10, interval=0.1,
             what="the cluster's own process killed")
    assert procs["namesake"].poll() is None, "a process that only shares a component's name was killed"
    assert procs["recycled"].poll() is None, "a process younger than its pid file (recycled pid) was killed"
    assert procs["stranger"].poll() is None, "an unrelated process named by a stale pid file was killed"
    assert not kc.directory.exists(), f"{kc.directory} left behind"


def test_teardown_kills_only_the_clusters_own_processes(fake_cluster_dir):
    kc, procs = fake_cluster_dir
    kc.delete()
    _own_killed_and_no_other(kc, procs)


@pytest.mark.parametrize("path", ["sweep", "sweep-all"])
def test_a_stale_pid_file_never_gets_an_unrelated_process_killed(path, fake_cluster_dir):
    """The cluster of a run killed long ago, deleted by the next run's sweeper or by ``make
    clean-clusters`` (``python -m clusterproof.cluster.kwok --sweep-all``): kwokctl runs, and only the cluster's
    own process dies."""
    kc, procs = fake_cluster_dir
    (kc.directory / OWNER_FILE).write_text(json.dumps(_dead_owner()))
    if path == "sweep":
        assert kc.name in sweep_clusters()
    else:
        out = subprocess.run([sys.executable, "-m", "clusterproof.cluster.kwok", "--sweep-all"], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and f"deleted {kc.name}" in out.stdout, out.stdout + out.stderr
    _own_killed_and_no_other(kc, procs)


def test_kwokctl_alone_kills_whatever_a_stale_pid_file_names(fake_cluster_dir):
    """The negative control: the same directory given to kwokctl without the harness's checks --
    every process its pid files name is SIGKILLed, the unrelated ``sleep`` too. (This is why the
    tests above can fail.)"""
    kc, procs = fake_cluster_dir
    kwokctl("delete", "cluster", "--name", kc.name, "--kubeconfig", str(kc.user_kubeconfig), timeout=120)
    wait_for(lambda: [who for who, p in procs.items() if p.poll() is None], until=lambda alive: not alive,
             timeout=10, interval=0.1, what="kwokctl alone killed every process a pid file names")


def test_the_supervisor_clears_only_pid_files_that_are_not_the_clusters_own(fake_cluster_dir):
    """Before ``kwokctl start cluster`` (which skips a component whose pid file names any live pid):
    the own process's file stays, a paused component's stays, every other goes; nobody is signalled."""
    kc, procs = fake_cluster_dir
    removed = clear_pid_files(kc.directory, keep_owned=True, keep={"etcd"})
    assert sorted(removed) == ["kube-controller-manager", "kube-scheduler"]
    assert sorted(f.stem for f in (kc.directory / "pids").glob("*.pid")) == ["etcd", "kube-apiserver"]
    assert all(p.poll() is None for p in procs.values())


@pytest.mark.parametrize("what", ["embedded-cluster", "prometheus-directory", "preflight-workdir"])
def test_an_owner_recorded_on_another_host_is_never_judged_dead_here(what, fake_cluster_dir, monkeypatch):
    """A cache shared by machines (an NFS home): a directory whose run was recorded on another host
    is never swept from this one -- its pids mean nothing here -- and the sweep says so."""
    kc, procs = fake_cluster_dir
    owner = {**_dead_owner(), "host": "elsewhere.example"}
    said = []
    if what == "embedded-cluster":
        (kc.directory / OWNER_FILE).write_text(json.dumps(owner))
        (kc.directory / "keep").touch()   # even --sweep-all, which deletes kept clusters, leaves it
        assert kc.name not in sweep_clusters(say=said.append)
        out = subprocess.run([sys.executable, "-m", "clusterproof.cluster.kwok", "--sweep-all"], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
        said.append(out.stdout)
        with pytest.raises(HarnessError, match="elsewhere.example"):
            kc.delete()
        assert kc.directory.exists() and all(p.poll() is None for p in procs.values())
    elif what == "prometheus-directory":
        d = runs_root() / "cp-elsewhere"
        d.mkdir(parents=True)
        (d / OWNER_FILE).write_text(json.dumps(owner))
        (d / "apiserver.token").write_text("x")
        assert "cp-elsewhere" not in sweep_runs(say=said.append) and d.exists()
    else:
        monkeypatch.setattr(tempfile, "tempdir", str(kc.directory.parent))
        d = Path(tempfile.mkdtemp(prefix=f"{preflight.WORKDIR_PREFIX}elsewhere-"))
        (d / "owner.json").write_text(json.dumps(owner))
        assert not preflight.sweep_workdirs(say=said.append) and d.exists()
    assert said and all("recorded on host elsewhere.example" in line for line in said), said
    # The same record from this host, its process gone: swept (so the check above can fail).
    assert not owner_alive({**owner, "host": this_host()})


def test_an_interrupted_locust_run_leaves_no_locust_process(tmp_path):
    """``run_locust`` with locust's ``--processes`` workers, interrupted: master and forked workers go."""
    prefix = tmp_path / "idle"
    script = ("from pathlib import Path; from clusterproof.core.locust import run_locust; "
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
