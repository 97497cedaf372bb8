"""One suite must not poison the next: the control plane is supervised and checked around modules.

A run (as a user types it, on its own embedded cluster) executes a module that
kills kube-scheduler and then a module that needs a scheduler. The killer
module fails in its teardown, naming kube-scheduler and its last log line;
the supervisor has restarted the scheduler, so the next module passes; the
report carries the restart.
"""
from __future__ import annotations

import json

import pytest

from tests.harness import run_pytest


@pytest.mark.cluster
def test_a_module_that_kills_a_component_fails_and_the_next_one_runs(tmp_path):
    run = run_pytest(["tests/poison/poisoner.py", "tests/poison/bystander.py", "--cp-profile", "smoke",
                      "-p", "no:randomly"], tmp_path, timeout=600)
    assert run.returncode == 1, run.output[-3000:]
    [(name, msg)] = run.failures.items()
    assert name == "test_kills_the_scheduler", run.output[-3000:]
    assert "this module broke the control plane: kube-scheduler exited at" in msg, msg
    assert "restarted; its last log line:" in msg, msg
    assert "test_a_pod_is_bound" in run.passed, run.output[-3000:]
    found = []
    for f in (tmp_path / "allure").glob("*-container.json"):
        for fx in json.loads(f.read_text()).get("afters", []):
            found += [a["name"] for a in fx.get("attachments", [])]
    assert "control-plane components restarted during this module" in found, found


@pytest.mark.unit
def test_a_bring_up_whose_controller_manager_never_starts_says_why_and_keeps_the_logs(tmp_path, monkeypatch):
    """CI once lost a worker's whole session to "kube-controller-manager created the default ServiceAccount:
    not reached within 120 s; last seen: None", with the cluster and its logs deleted. Now the line names the
    component's state and last words, and a failed bring-up keeps the control plane's logs (not the audit
    log) in the run's directory."""
    from clusterproof.cluster import backends
    from clusterproof.cluster.kwok import NAME_PREFIX, KwokCluster
    from clusterproof.core.waiting import WaitTimeout

    monkeypatch.setenv("CLUSTERPROOF_CACHE", str(tmp_path / "cache"))
    kc = KwokCluster(f"{NAME_PREFIX}fake-logs", 1, 40)
    logs = kc.directory / "logs"
    logs.mkdir(parents=True)
    (logs / "kube-controller-manager.log").write_text("I0101 started\nE0101 failed to listen on 0.0.0.0:40001: "
                                                      "bind: address already in use\n\n")
    (logs / "kube-apiserver.log").write_text("I0101 serving\n")
    (logs / "audit.log").write_text("{}\n")
    monkeypatch.setattr(backends, "get_if_present", lambda api, path: None)
    with pytest.raises(WaitTimeout) as e:
        backends.wait_controllers_started(None, kc, timeout=0.2)
    assert str(e.value) == ("kube-controller-manager created the default ServiceAccount: not reached within 0.2 s; "
                            "kube-controller-manager is not running, its last log line: E0101 failed to listen on "
                            "0.0.0.0:40001: bind: address already in use"), str(e.value)
    kept = kc.keep_logs(tmp_path / "run" / "cluster-logs")
    assert kept == tmp_path / "run" / "cluster-logs" / kc.name
    assert sorted(p.name for p in kept.iterdir()) == ["kube-apiserver.log", "kube-controller-manager.log"]


KWOK_GAVE_UP = ('{"level":"ERROR","msg":"Failed to list nodes","err":"nodes is forbidden: User '
                '\\"kwok:simulated-kubelets\\" cannot list resource \\"nodes\\""}\n'
                '{"level":"ERROR","msg":"Failed to start","err":"timed out waiting for the condition"}\n')
KWOK_WATCHING = '{"level":"INFO","msg":"Watch all nodes"}\n'


def _gave_up_kwok(tmp_path, monkeypatch, comes_back: bool):
    """A cluster whose kwok-controller exited after its start-up wait (no process, those last words);
    ``kc.start_stopped`` is counted, and with ``comes_back`` the started one logs that it watches nodes."""
    from clusterproof.cluster.kwok import NAME_PREFIX, KwokCluster
    monkeypatch.setenv("CLUSTERPROOF_CACHE", str(tmp_path / "cache"))
    kc = KwokCluster(f"{NAME_PREFIX}fake-kwok", 1, 40)
    log = kc.directory / "logs" / "kwok-controller.log"
    log.parent.mkdir(parents=True)
    log.write_text(KWOK_GAVE_UP)
    started = []

    def start_stopped(keep=frozenset()):
        started.append(keep)
        if comes_back:
            with log.open("a") as f:
                f.write(KWOK_WATCHING)
    monkeypatch.setattr(kc, "pids", lambda: {})
    monkeypatch.setattr(kc, "start_stopped", start_stopped)
    return kc, started


@pytest.mark.unit
def test_a_kwok_controller_that_gave_up_waiting_for_the_api_server_is_started_again(tmp_path, monkeypatch):
    """kwok v0.8.0 waits about 15 s for a node list, then exits, and kwokctl leaves it down: on a loaded
    machine a bring-up then created its nodes for no one and waited out its timeout with 0 Ready. The
    bring-up starts it again (saying so, with its last words) and goes on once it watches nodes."""
    from clusterproof.cluster import backends

    kc, started = _gave_up_kwok(tmp_path, monkeypatch, comes_back=True)
    said = []
    backends.wait_kwok_watching(kc, said.append, timeout=5)
    assert len(started) == 1
    assert said == ["kwok-controller exited before it could list nodes (it waits about 15 s for the API server and "
                    "its RBAC; its last log line: " + KWOK_GAVE_UP.splitlines()[-1] + "); started again"], said


@pytest.mark.cluster
def test_a_kwok_controller_that_keeps_exiting_ends_the_bring_up_naming_it(tmp_path, monkeypatch):
    from clusterproof.cluster import backends
    from clusterproof.core.waiting import WaitTimeout

    kc, started = _gave_up_kwok(tmp_path, monkeypatch, comes_back=False)
    with pytest.raises(WaitTimeout) as e:
        backends.wait_kwok_watching(kc, lambda m: None, timeout=1)
    assert len(started) == backends.KWOK_RESTARTS
    assert str(e.value).startswith("kwok-controller watching nodes: not reached within 1 s (2 restarts); "
                                   "kwok-controller is not running, its last log line: "), str(e.value)
