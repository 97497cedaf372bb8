"""Negative controls, bad input and cleanup for suites/test_api_overload.py.

The suite runs as a user would run it (a pytest subprocess, ``--cp-kubeconfig``
to this session's embedded cluster; the controls shorten the flood with
``CONTROL`` settings):

- healthy: the gate's own run (``./proof test`` runs the suite on smoke alone after the self-tests,
  with the profile's flood); here, a run whose only fault is a client that gives up still sheds the
  flood, with its plots and figures attached;
- the flood's FlowSchema pointed at the ``exempt`` level: the protection
  checks fail, each naming the flow that was not protected (and the flood
  is not shed);
- the flood's level given deep queues instead of Reject (and the flood
  identity impersonated, so that path runs too): the shed check fails
  naming the level;
- a profile whose expectations do not match the cluster: the read-only
  check fails naming the FlowSchema / level;
- every component on kwokctl's shared admin certificate (its own embedded
  cluster): the classification check names the flow schemas that
  dispatched nothing;
- a client that gives up after one 429: objects are lost, named;
- an etcd that stalls from the moment the flood ends: the recovery check
  fails;
- bad input (unknown flow schema / level, a system:masters flood identity,
  seats or queues out of range): one line, exit 4, before any test;
- an interrupted run and a killed one leave no FlowSchema, PriorityLevel or
  namespace behind (the killed one's are swept by the next run);
- a run stopped past its Lease mid-flood, whose turn another run took and
  whose flow it made again, stops with exit 7 and removes nothing of the
  other run's.
"""
from __future__ import annotations

import os
import signal
import threading

import psutil
import pytest

from clusterproof.apf.overload import FLOW_NAME, install_flow, remove_dead_flow
from clusterproof.core.waiting import wait_for
from clusterproof.kube.access import HOME
from clusterproof.kube.claims import TURN, Claims
from clusterproof.kube.client import get_if_present
from clusterproof.kube.flowcontrol import FLOW_SCHEMAS, PRIORITY_LEVELS
from clusterproof.kube.liveness import LIVENESS_EXIT, RunLease, wait_expired
from tests.harness import (
    KILLED_RUN_LEASE,
    allure_figures,
    allure_results,
    background_pytest,
    ended_early,
    interrupt,
    kill_run,
    run_leftovers,
    run_pytest,
)
from tests.test_burst_controls import EtcdStalls

pytestmark = pytest.mark.control
SUITE = "suites/test_api_overload.py"
# A shorter flood for the controls (the checks and thresholds are the profile's).
CONTROL = ("apf_flood_s=15", "apf_baseline_s=5", "apf_flood_pods=80")
SHED = "test_overload_is_shed_with_429_and_retry_after"
HEARTBEATS = "test_node_heartbeats_keep_renewing_during_the_flood"
SCHEDULING = "test_controllers_keep_scheduling_during_the_flood"
WELL_BEHAVED = "test_a_well_behaved_client_is_not_throttled_during_the_flood"
LOSE_NOTHING = "test_clients_that_honour_retry_after_lose_nothing"
RECOVERY = "test_apf_queues_drain_and_latency_recovers_after_the_flood"
EXPECTATIONS = "test_apf_objects_meet_the_profile_expectations"
CLASSIFIED = "test_system_components_are_classified_into_their_own_flow_schemas"


def _args(cluster, profile, run_id, *sets, select=None):
    return [SUITE, "--cp-kubeconfig", str(cluster.kubeconfig), "--cp-profile", profile.name, "--cp-run-id", run_id,
            *(["-k", select] if select else []), *[f"--cp-set={s}" for s in (*CONTROL, *sets)]]


def _run(cluster, profile, tmp_path, *sets, select=None, timeout=900):
    run_id = f"apfctl-{os.urandom(2).hex()}"
    return run_id, run_pytest(_args(cluster, profile, run_id, *sets, select=select), tmp_path, timeout=timeout)


def _assert_nothing_left(cluster, run_id):
    """No namespace, pod, FlowSchema, PriorityLevel or RBAC object of the run (namespaces go in the background)."""
    wait_for(lambda: run_leftovers(cluster.api, run_id), until=lambda left: not left, timeout=180, interval=1,
             what=f"nothing of run {run_id} left")


def test_flood_in_the_exempt_level_fails_the_protection_checks(cluster, profile, tmp_path):
    rid, run = _run(cluster, profile, tmp_path, "apf_flood_priority_level=exempt",
                    select="shed or heartbeats or scheduling or well_behaved")
    assert run.returncode == 1, run.output[-3000:]
    assert set(run.failures) >= {SHED, HEARTBEATS, SCHEDULING, WELL_BEHAVED}, run.output[-3000:]
    flows = {HEARTBEATS: f"node heartbeats ({profile.apf_node_flow_schema} -> node-high)",
             SCHEDULING: "kube-scheduler and kube-controller-manager (kube-scheduler, kube-controller-manager)",
             WELL_BEHAVED: "the well-behaved client (service-accounts -> workload-low)"}
    for test, flow in flows.items():
        msg = run.failures[test]
        assert f"{flow} was not protected from the flood: the flood's FlowSchema {FLOW_NAME} sends" in msg, msg
        assert "to PriorityLevel exempt, which is exempt (never queued or rejected)" in msg, msg
    assert "the flood was not shed" in run.failures[SHED] and "PriorityLevel exempt (Exempt" in run.failures[SHED]
    _assert_nothing_left(cluster, rid)


def test_deep_queues_that_never_reject_fail_the_shed_check(cluster, profile, tmp_path):
    """Queue instead of Reject, 64 queues of 1,000: the flood waits instead of being shed. The flood
    identity is an impersonated user here, so the impersonation path is exercised too."""
    rid, run = _run(cluster, profile, tmp_path, "apf_flood_queues=64", "apf_flood_hand_size=6",
                    "apf_flood_queue_length=1000", "apf_flood_user=clusterproof-ci-flooder",
                    "apf_flood_group=clusterproof-ci", select="shed or lose")
    assert run.returncode == 1, run.output[-3000:]
    assert set(run.failures) == {SHED}, run.output[-3000:]
    msg = run.failures[SHED]
    assert "the flood was not shed" in msg and f"got no 429 in PriorityLevel {FLOW_NAME} (Limited" in msg, msg
    assert LOSE_NOTHING in run.passed
    _assert_nothing_left(cluster, rid)


def test_profile_that_does_not_match_the_cluster_fails_naming_the_object(cluster, profile, tmp_path):
    rid, run = _run(cluster, profile, tmp_path, "apf_node_flow_schema=system-nodes", "apf_max_queue_depth=5000",
                    select="expectations")
    assert run.returncode == 1, run.output[-3000:]
    msg = run.failures.get(EXPECTATIONS, "")
    assert ("node heartbeat (update its Lease in kube-node-lease) matches FlowSchema system-node-high (PriorityLevel "
            "node-high), not system-nodes as the profile expects (apf_node_flow_schema)") in msg, msg
    assert "PriorityLevelConfiguration workload-high queues up to 6400 requests (128 queues x 50)" in msg, msg
    _assert_nothing_left(cluster, rid)


def test_components_on_the_shared_admin_certificate_fail_the_classification_check(tmp_path):
    """kwokctl's default: every component is system:masters, exempt from APF. Its own embedded cluster."""
    run = run_pytest([SUITE, "--cp-profile", "smoke", "--cp-set=component_identities=false", "-k", "classified"],
                     tmp_path, timeout=600)
    assert run.returncode == 1, run.output[-3000:]
    msg = run.failures.get(CLASSIFIED, "")
    for fs, who in (("system-node-high", "kwok-controller, user kwok:simulated-kubelets"),
                    ("kube-scheduler", "kube-scheduler, user system:kube-scheduler")):
        assert f"FlowSchema {fs} ({who}) dispatched no request since the apiserver started" in msg, msg
    assert "a component authenticating as system:masters is never queued or rejected" in msg, msg


def test_a_client_that_gives_up_loses_objects(cluster, profile, tmp_path):
    """Only the losing check fails: the shed check beside it passes, its plots and figures attached."""
    rid, run = _run(cluster, profile, tmp_path, "apf_flood_max_attempts=1", select="shed or lose")
    assert run.returncode == 1, run.output[-3000:]
    assert set(run.failures) == {LOSE_NOTHING} and SHED in run.passed, run.output[-3000:]
    msg = run.failures[LOSE_NOTHING]
    assert "the flood lost objects: honouring clients:" in msg and "gave up after 1 attempt(s): honouring-" in msg, msg
    res = allure_results(tmp_path)
    atts = {a["name"] for a in res[SHED].get("attachments", [])}
    assert any(a.startswith("429 responses per second by flow schema") for a in atts), atts
    assert any(a.startswith("well-behaved client: latency") for a in atts), atts
    assert "429 responses to the flood" in allure_figures(tmp_path, res[SHED])
    _assert_nothing_left(cluster, rid)


class StallAfterFlood(threading.Thread):
    """Once the run's flood (its locust process) has come and gone, stall etcd until told to stop."""

    def __init__(self, etcd_pid: int, run_id: str):
        super().__init__(daemon=True)
        self.etcd, self.run_id, self.done, self.stalls = etcd_pid, run_id, threading.Event(), None

    def _flooding(self) -> bool:
        for p in psutil.process_iter(["cmdline"]):
            cmd = " ".join(p.info["cmdline"] or [])
            if "load/flood.py" in cmd and self.run_id in cmd:
                return True
        return False

    def run(self) -> None:
        while not self.done.is_set() and not self._flooding():
            self.done.wait(0.5)
        while not self.done.is_set() and self._flooding():
            self.done.wait(0.2)
        if not self.done.is_set():
            self.stalls = EtcdStalls(self.etcd)
            self.stalls.start()

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=30)
        if self.stalls is not None:
            self.stalls.done.set()
            self.stalls.join(timeout=10)


def test_an_etcd_that_stalls_after_the_flood_fails_the_recovery_check(cluster, profile, api_guard, tmp_path):
    if cluster.kwok is None:
        pytest.skip("needs the embedded cluster: it stalls its etcd")
    run_id = f"apfctl-{os.urandom(2).hex()}"
    stall = StallAfterFlood(cluster.kwok.pids()["etcd"], run_id)
    with api_guard.excuse("etcd stalled on purpose after the flood (recovery negative control)"):
        stall.start()
        try:
            run = run_pytest(_args(cluster, profile, run_id, select="recovers"), tmp_path, timeout=900)
        finally:
            stall.stop()
    assert stall.stalls is not None, "the flood was never seen running"
    assert run.returncode == 1, run.output[-3000:]
    msg = run.failures.get(RECOVERY, "")
    assert f"no recovery within {profile.apf_recovery_s:g} s after the flood" in msg, msg
    assert "the well-behaved client's baseline p99" in msg, msg
    _assert_nothing_left(cluster, run_id)


# --- bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("setting,expected", [
    pytest.param("apf_flood_group=system:masters", "the flood identity is in system:masters", id="masters-flood"),
    pytest.param("apf_flood_shares=0", "apf_flood_shares must be >= 1, got 0", id="no-seats"),
    pytest.param("apf_flood_queues=1000", "apf_flood_queues must be <= 512, got 1000", id="too-many-queues"),
    pytest.param("apf_flood_queue_length=0", "apf_flood_queue_length must be >= 1, got 0", id="empty-queues"),
])
def test_bad_apf_profile_values_end_the_run_with_one_line(setting, expected, tmp_path):
    """Caught when the profile loads: exit 4 before any cluster is started."""
    run = run_pytest([SUITE, "--cp-profile", "smoke", f"--cp-set={setting}"], tmp_path, timeout=120)
    assert run.returncode == 4 and expected in run.output and "Traceback" not in run.output, run.output[-2000:]


def test_hand_larger_than_the_queues_is_one_line(tmp_path):
    run = run_pytest([SUITE, "--cp-profile", "smoke", "--cp-set=apf_flood_queues=4", "--cp-set=apf_flood_hand_size=8"],
                     tmp_path, timeout=120)
    assert run.returncode == 4 and "apf_flood_hand_size (8) must not exceed apf_flood_queues (4)" in run.output, \
        run.output[-2000:]


@pytest.mark.parametrize("setting,expected", [
    pytest.param("apf_node_flow_schema=nope", "apf_node_flow_schema names FlowSchema 'nope', which the cluster does "
                 "not have; it has exempt, probes, ", id="unknown-flow-schema"),
    pytest.param("apf_flood_priority_level=nope", "apf_flood_priority_level names PriorityLevelConfiguration "
                 "'nope', which the cluster does not have", id="unknown-priority-level"),
])
def test_unknown_apf_objects_end_the_run_with_one_line(cluster, profile, setting, expected, tmp_path):
    rid, run = _run(cluster, profile, tmp_path, setting, timeout=300)
    assert run.returncode == 4, run.output[-3000:]
    assert expected in run.output and "Traceback" not in run.output, run.output[-3000:]
    assert not run.passed, run.output[-3000:]
    _assert_nothing_left(cluster, rid)


# --- nothing is left behind --------------------------------------------------------------------

def _flow_exists(cluster, rid: str) -> bool:
    return get_if_present(cluster.api, f"/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas/{FLOW_NAME}") is not None


def _start(cluster, profile, rid, tmp_path, *sets, select="shed"):
    """The run in its own process group (pytest and its locust are killed together)."""
    return background_pytest(_args(cluster, profile, rid, *sets, select=select), tmp_path, new_session=True)


def _wait_flooding(cluster, proc, rid):
    def flooding():
        ended_early(proc)
        return _flow_exists(cluster, rid)
    wait_for(flooding, timeout=180, interval=0.5, what=f"run {rid} installed its FlowSchema")


def test_interrupted_flood_leaves_no_flow_schema_or_level(cluster, profile, tmp_path, api_guard):
    rid = f"apfctl-{os.urandom(2).hex()}"
    with _start(cluster, profile, rid, tmp_path, "apf_flood_s=60") as proc:
        _wait_flooding(cluster, proc, rid)
        interrupt(proc, api_guard)
    _assert_nothing_left(cluster, rid)


def test_killed_flood_run_is_swept_by_the_next_run(cluster, profile, api_guard, tmp_path):
    """SIGKILL mid-flood (no teardown runs): the run's FlowSchema, level and namespaces stay until its
    Lease expires; the next run's sweeper removes them."""
    dead = f"apfctl-{os.urandom(2).hex()}"
    with _start(cluster, profile, dead, tmp_path / "dead", "apf_flood_s=120", KILLED_RUN_LEASE) as proc:
        _wait_flooding(cluster, proc, dead)
        kill_run(proc, api_guard, new_session=True)   # pytest and its locust: nothing can clean up
    assert _flow_exists(cluster, dead), "SIGKILL should have left the FlowSchema behind"
    wait_expired(cluster.api, dead, timeout=60)
    rid, run = _run(cluster, profile, tmp_path / "next", select="expectations")
    assert run.returncode == 0, run.output[-3000:]
    for what in (f"flowschemas/{FLOW_NAME}", f"prioritylevelconfigurations/{FLOW_NAME}"):
        assert f"sweep: removed: {what} (run {dead}: lease" in run.output, run.output[-3000:]
    _assert_nothing_left(cluster, dead)
    _assert_nothing_left(cluster, rid)


# --- one run at a time on the flood's named flow -----------------------------------------------------

def test_a_second_run_waits_for_the_floods_turn_then_skips_naming_the_run_that_holds_it(cluster, profile,
                                                                                        tmp_path):
    """The flow's names are fixed (rbac-destructive.yaml names them): a live run holds the turn (a Lease
    in the home namespace), so a second run waits ``claim_wait_s`` and skips the flood, saying which run
    has it -- it never installs a second flow or touches the first."""
    holder = f"apfturn-{os.urandom(2).hex()}"
    lease = RunLease(cluster.api, holder, HOME, duration_s=30).acquire()
    turn = Claims(cluster.api, HOME, holder, TURN)
    assert turn.try_take(FLOW_NAME, {holder: True}) is None
    try:
        rid, run = _run(cluster, profile, tmp_path, "claim_wait_s=5", select="shed")
        assert run.returncode == 0 and not run.passed and not run.failures, run.output[-3000:]
        assert f"FlowSchema {FLOW_NAME} is another run's turn (run {holder}, alive) and stayed so for 5 s" \
            in run.output, run.output[-3000:]
        assert not _flow_exists(cluster, rid)
        assert turn.held_by().get(FLOW_NAME) == holder
    finally:
        turn.release(FLOW_NAME)
        lease.release()
    _assert_nothing_left(cluster, rid)


STOP_EXCUSE = ("a harness run stopped (SIGSTOP) past its Lease mid-flood by this self-test: resumed, it stops at "
               "once (exit 7), and kube-apiserver counts the requests its flood abandoned as 504 (client abort) or "
               "500 (context canceled, kubernetes/kubernetes#139256)")


def test_a_run_stopped_past_its_lease_leaves_the_flow_of_the_run_that_took_its_turn(cluster, profile, api_guard,
                                                                                    tmp_path):
    """The stale run of issue 35, end to end: a flood run is stopped (SIGSTOP, its locust too) until its
    Lease has expired; another run takes the turn -- the stopped run's flow removed uid for uid from its
    owner record -- and makes the flow again. Resumed, the run stops with exit 7, and its teardown (the
    ``finally`` of the flood) leaves the other run's FlowSchema, level and turn, saying why in one line."""
    stale, live = f"apfctl-{os.urandom(2).hex()}", f"apfturn-{os.urandom(2).hex()}"
    api, lease, flow = cluster.api, None, None
    turn = Claims(api, HOME, live, TURN)
    try:
        with _start(cluster, profile, stale, tmp_path, "apf_flood_s=60", KILLED_RUN_LEASE) as proc:
            _wait_flooding(cluster, proc, stale)
            with api_guard.excuse(STOP_EXCUSE):
                os.killpg(proc.pid, signal.SIGSTOP)
                try:
                    wait_expired(api, stale, timeout=60)
                    lease = RunLease(api, live, HOME, duration_s=60).acquire()
                    assert turn.try_take(FLOW_NAME, turn.alive(), lambda dead: remove_dead_flow(api, dead)) is None
                    flow = install_flow(api, profile, live, None, "default")
                finally:
                    os.killpg(proc.pid, signal.SIGCONT)
                out, _ = proc.communicate(timeout=300)
        assert proc.returncode == LIVENESS_EXIT, out[-3000:]
        for path, uid in flow.created:
            assert (get_if_present(api, path) or {}).get("metadata", {}).get("uid") == uid, \
                f"the stale run removed {path} of the run that took its turn"
        assert f"the flood's flow is left in place (prioritylevelconfigurations, flowschemas {FLOW_NAME}): the " \
               f"claim {HOME}/{TURN}{FLOW_NAME} is run {live}'s now" in out, out[-3000:]
        assert f"claim {HOME}/{TURN}{FLOW_NAME} is run {live}'s now, not this run's: left in place" in out, out[-3000:]
        assert "Traceback" not in out, out[-3000:]
        assert turn.held_by().get(FLOW_NAME) == live
        _assert_nothing_left(cluster, stale)
    finally:
        if flow is not None:
            flow.remove(api)
        turn.release(FLOW_NAME)
        if lease is not None:
            lease.release()
    assert all(get_if_present(api, f"{c}/{FLOW_NAME}") is None for c in (FLOW_SCHEMAS, PRIORITY_LEVELS))
    _assert_nothing_left(cluster, live)
