"""Liveness that cannot be lost silently (issue 20, part 3).

Two kinds of case:

- ``RunLease`` against a fake API server (one Lease, a clock of its own in
  the ``Date`` header, switches for failures): the verdicts, on the server's
  clock, with the local monotonic clock driven by hand;
- a fake run (``tests/liveness_run.py``) against this session's cluster
  through ``--cp-kubeconfig``, as a user runs a suite, with a 10 s Lease (the
  profile's minimum): its Lease denied, deleted, or the process stopped
  past the duration. Each must stop with the one line and exit 7, fail the
  check under way, start no further check, and leave nothing behind.
"""
from __future__ import annotations

import datetime as dt
import email.utils
import json
import os
import signal
import threading
import time
import types
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import urllib3
from kubernetes import client

from clusterproof.core.run import metadata
from clusterproof.core.timeparse import MICRO
from clusterproof.core.waiting import wait_for
from clusterproof.fixtures import CLUSTER
from clusterproof.fixtures.cluster import LivenessGuard, LivenessLost
from clusterproof.kube import liveness
from clusterproof.kube.client import delete_if_present, raw_request
from clusterproof.kube.liveness import LEASES, LIVENESS_EXIT, RunLease, run_states, wait_expired
from tests.harness import background_pytest, ended_early, junit_verdicts, run_leftovers

LOST = "clusterproof: liveness lost"
# Far from any local clock: a verdict that read local time would call every Lease expired.
PAST = dt.datetime(2001, 3, 4, 5, 6, 7, tzinfo=dt.timezone.utc)
FUTURE = dt.datetime(2051, 3, 4, 5, 6, 7, tzinfo=dt.timezone.utc)


# --- a fake API server, as far as one run's Lease is concerned ----------------------------------

class FakeServer:
    """Answers ``raw_request`` calls for one Lease, with its own clock in every ``Date`` header.

    ``clock``: the server's time (advanced by hand, or with real time when ``ticking``);
    ``down``: every request raises it; ``refuse_create``: POSTs of Leases are denied (403).
    """

    def __init__(self, start: dt.datetime, ticking: bool = False):
        self.start, self.ticking, self.t0 = start, ticking, time.monotonic()
        self.shift = 0.0
        self.down: Exception | None = None
        self.refuse_create = False
        self.after_get = None           # called after each GET of the Lease (a stall between read and write)
        self.leases: dict[str, dict] = {}
        self.namespaces: set[str] = set()
        self.rv = 0
        self.calls: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def now(self) -> dt.datetime:
        run = time.monotonic() - self.t0 if self.ticking else 0.0
        return self.start + dt.timedelta(seconds=self.shift + run)

    def _date(self) -> dict:
        return {"Date": email.utils.format_datetime(self.now().replace(microsecond=0), usegmt=True)}

    def _error(self, status: int, message: str) -> client.ApiException:
        e = client.ApiException(status=status, reason=message)
        e.headers, e.body = self._date(), json.dumps({"message": message})
        return e

    def _ok(self, obj: dict):
        return types.SimpleNamespace(status=200, data=json.dumps(obj).encode(), headers=self._date())

    def __call__(self, api, method, path, query=None, headers=None, body=None, timeout=60):
        with self.lock:
            self.calls.append((method, path))
            if self.down is not None:
                raise self.down
            if path == "/version":
                return self._ok({"gitVersion": "v1.35.4"})
            if path == "/api/v1/namespaces":
                if body["metadata"]["name"] in self.namespaces:
                    raise self._error(409, "namespace exists")
                self.namespaces.add(body["metadata"]["name"])
                return self._ok(body)
            if path.endswith("/leases"):          # create
                if self.refuse_create:
                    raise self._error(403, "denied by the self-test")
                name = body["metadata"]["name"]
                if name in self.leases:
                    raise self._error(409, "lease exists")
                self.rv += 1
                self.leases[name] = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.rv)}}
                return self._ok(self.leases[name])
            name = path.rsplit("/", 1)[1]
            if name not in self.leases:
                raise self._error(404, "not found")
            if method == "GET":
                answer = self._ok(self.leases[name])
                if self.after_get is not None:
                    self.after_get()
                return answer
            if method == "PATCH":
                lease = self.leases[name]
                if body["metadata"]["resourceVersion"] != lease["metadata"]["resourceVersion"]:
                    raise self._error(409, "the object has been modified")
                self.rv += 1
                lease["spec"].update(body["spec"])
                lease["metadata"]["resourceVersion"] = str(self.rv)
                return self._ok(lease)
            raise AssertionError(f"unexpected {method} {path}")

    def lease(self) -> dict:
        (only,) = self.leases.values()
        return only

    def writes(self) -> list[tuple[str, str]]:
        return [c for c in self.calls if c[0] in ("POST", "PATCH") and "/leases" in c[1]]


class HandClock:
    """The local monotonic clock, moved by hand."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def by_hand():
    """A RunLease on a fake server whose clock is far in the past; both clocks move only by hand.

    Its duration is an hour, so its own threads stay asleep while the test drives ``_attempt``
    (one renewal), ``check`` (the session's read before a check) and ``_past_deadline`` (the
    watchdog)."""
    server, clock, lost = FakeServer(PAST), HandClock(), []
    lease = RunLease(None, "unit", "clusterproof", duration_s=3600, on_lost=lost.append,
                     request=server, clock=clock).acquire()
    try:
        yield types.SimpleNamespace(server=server, clock=clock, lease=lease, lost=lost)
    finally:
        lease.abandon()


def _advance(env, seconds: float) -> None:
    env.server.shift += seconds
    env.clock.t += seconds


# --- the verdicts, on the server's clock -----------------------------------------------------------

@pytest.mark.parametrize("start", [pytest.param(PAST, id="server-25-years-behind"),
                                   pytest.param(FUTURE, id="server-25-years-ahead")])
@pytest.mark.unit
def test_the_verdict_is_on_the_servers_clock_not_the_local_one(start):
    """The fake server's Date is 25 years off the local clock: the Lease is written and judged
    in server time, so it renews as usual -- and expires when the *server's* clock passes it."""
    server, clock, lost = FakeServer(start), HandClock(), []
    lease = RunLease(None, "unit", "clusterproof", duration_s=3600, on_lost=lost.append, request=server,
                     clock=clock).acquire()
    try:
        assert server.lease()["spec"]["renewTime"] == start.strftime(MICRO)
        server.shift, clock.t = 900, clock.t + 900
        lease._attempt()
        assert lease.lost is None and lease.renewals == 1, lease.lost
        assert server.lease()["spec"]["renewTime"] == (start + dt.timedelta(seconds=900)).strftime(MICRO)
        # The server's clock jumps past the duration; the local one does not move at all.
        server.shift += 3601
        writes = len(server.writes())
        lease._attempt()
        assert lease.lost is not None and lease.lost.startswith(f"{LOST} at "), lease.lost
        expired_at = start + dt.timedelta(seconds=900 + 3600)
        assert f"at {expired_at:%Y-%m-%dT%H:%M:%SZ} (API server clock)" in lease.lost, lease.lost
        assert "found expired" in lease.lost and "may have removed this run's objects" in lease.lost
        assert len(server.writes()) == writes, "an expired Lease was renewed back to life"
        assert lost == [lease.lost]
    finally:
        lease.abandon()


@pytest.mark.unit
def test_a_lease_whose_renewal_lands_after_its_expiry_is_lost(by_hand):
    """Read in time, written too late (the process stalled in between): the write's own Date decides."""
    by_hand.server.after_get = lambda: setattr(by_hand.server, "shift", by_hand.server.shift + 3601)
    by_hand.lease._attempt()
    assert by_hand.lease.lost and "found expired" in by_hand.lease.lost, by_hand.lease.lost


@pytest.mark.unit
def test_a_resumed_run_finds_its_lease_expired_before_its_next_check(by_hand):
    """The session's read before each check (``check``): nothing while the Lease is alive, the loss once
    the server's clock is past renewTime + duration -- without writing anything."""
    _advance(by_hand, 1000)
    assert by_hand.lease.check() is None
    by_hand.server.shift += 3000          # stopped: the local clock's count does not matter
    writes = len(by_hand.server.writes())
    line = by_hand.lease.check()
    assert line is not None and line.startswith(LOST) and "found expired" in line, line
    assert len(by_hand.server.writes()) == writes
    assert by_hand.lost == [line]


@pytest.mark.unit
def test_renewal_failures_shorter_than_half_the_duration_are_noted_not_lost(by_hand):
    by_hand.server.down = urllib3.exceptions.MaxRetryError(None, "/", "Connection refused")
    _advance(by_hand, 900)
    by_hand.lease._attempt()
    _advance(by_hand, 800)                # 1,700 s without a renewal: less than half of 3,600 s
    by_hand.lease._attempt()
    by_hand.lease._past_deadline()
    assert by_hand.lease.lost is None and by_hand.lease.last_error, by_hand.lease.last_error
    by_hand.server.down = None
    by_hand.lease._attempt()
    assert by_hand.lease.lost is None and by_hand.lease.last_error is None
    assert any("renewals failed for 800.0 s and recovered" in n for n in by_hand.lease.notes), by_hand.lease.notes


@pytest.mark.unit
def test_renewal_failures_longer_than_half_the_duration_lose_liveness(by_hand):
    by_hand.server.down = urllib3.exceptions.MaxRetryError(None, "/", "Connection refused")
    _advance(by_hand, 900)
    by_hand.lease._attempt()
    _advance(by_hand, 901)                # 1,801 s: past half of 3,600 s
    by_hand.lease._past_deadline()        # the watchdog, with no request of its own
    line = by_hand.lease.lost
    assert line is not None and line.startswith(f"{LOST} 1801 s after the last renewal at 2001-03-04T05:06:07Z "
                                                 "(API server clock)"), line
    assert "longer than half its duration (3600 s)" in line and "MaxRetryError" in line, line
    assert "from 2001-03-04T06:06:07Z (API server clock) on" in line, line
    assert by_hand.lost == [line]


@pytest.mark.unit
def test_a_hung_renewal_counts_as_failing_but_a_fresh_one_does_not(by_hand):
    """The watchdog, while a request is under way: just started (a resumed process) -> wait for its
    verdict; under way longer than a request may take -> failing."""
    _advance(by_hand, 1801)
    by_hand.lease._in_flight = by_hand.clock.t
    by_hand.lease._past_deadline()
    assert by_hand.lease.lost is None
    by_hand.clock.t += by_hand.lease.request_timeout + 1
    by_hand.lease._past_deadline()
    assert by_hand.lease.lost and "last error: no answer" in by_hand.lease.lost, by_hand.lease.lost


@pytest.mark.unit
def test_a_request_frozen_with_its_process_is_not_called_hung(by_hand):
    """SIGSTOP while a renewal is under way: on resume the watchdog wakes long after it asked, so the process
    was held, not the request -- the renewal gets a request's bound from the resume to give its verdict (found
    expired, on the server's clock). A request that still does not answer by then is hung (found in a gate run
    under load: the watchdog's "no answer" beat the renewal's verdict)."""
    _advance(by_hand, 1801)
    lease = by_hand.lease
    lease._in_flight = by_hand.clock.t
    due = by_hand.clock.t + 0.5
    by_hand.clock.t += 30                     # stopped for 30 s with the request under way
    lease._woke(due)
    lease._past_deadline()
    assert lease.lost is None
    by_hand.clock.t += lease.request_timeout + 1
    lease._past_deadline()
    assert lease.lost and "last error: no answer" in lease.lost, lease.lost


@pytest.mark.unit
def test_a_watchdog_woken_on_time_changes_nothing(by_hand):
    lease = by_hand.lease
    due = by_hand.clock.t
    by_hand.clock.t += lease.request_timeout / 2    # late, within a request's bound: a loaded machine
    lease._woke(due)
    assert lease._resumed_at == float("-inf")


@pytest.mark.cluster
def test_failures_end_a_renewing_lease_at_half_its_duration_from_its_own_threads():
    """Real threads, a 2 s Lease: the API goes away after a renewal; the loss comes past half the
    duration but before the Lease expires, once, from a background thread, and renewals stop."""
    server, calls = FakeServer(PAST, ticking=True), []
    lease = RunLease(None, "unit", "clusterproof", duration_s=2,
                     on_lost=lambda line: calls.append((line, threading.current_thread().name)),
                     request=server).acquire()
    try:
        wait_for(lambda: lease.renewals, timeout=10, interval=0.05, what="the first renewal")
        server.down = urllib3.exceptions.MaxRetryError(None, "/", "Connection refused")
        wait_for(lambda: calls, timeout=10, interval=0.05, what="the loss of liveness")
        after = time.monotonic() - lease._ok_at
        assert 1.0 < after < 2.0, f"lost {after:.2f} s after the last renewal (duration 2 s)"
        for t in lease._threads:
            t.join(timeout=5)
        assert not any(t.is_alive() for t in lease._threads), "renewals go on after the loss"
        assert len(calls) == 1 and calls[0][1] != threading.main_thread().name, calls
        assert calls[0][0] == lease.lost and "longer than half its duration (2 s)" in lease.lost
    finally:
        lease.abandon()


@pytest.mark.unit
def test_the_session_starts_no_check_once_the_lease_is_found_expired(by_hand):
    """The session's guard before a check (``pytest_runtest_setup``): the Lease read on the server's
    clock is expired (the renewal thread has not had its turn yet, as right after SIGCONT), so the
    check fails with the line before any of its fixtures runs; its report carries the line alone,
    and the session ends with exit 7."""
    guard = LivenessGuard(types.SimpleNamespace(stash={CLUSTER: types.SimpleNamespace(lease=by_hand.lease)}))
    by_hand.lease.on_lost = guard.lost
    alive = guard.pytest_runtest_setup(item=None)
    next(alive)                            # alive: the check's set-up goes on
    alive.close()
    by_hand.server.shift += 3601
    with pytest.raises(LivenessLost) as lost:
        next(guard.pytest_runtest_setup(item=None))
    assert str(lost.value) == by_hand.lease.lost and "found expired" in str(lost.value)
    report = types.SimpleNamespace(longrepr="a long traceback")
    wrap = guard.pytest_runtest_makereport(item=None, call=types.SimpleNamespace(excinfo=lost))
    next(wrap)
    with pytest.raises(StopIteration) as done:
        wrap.send(report)
    assert done.value.value.longrepr == by_hand.lease.lost
    session = types.SimpleNamespace(shouldfail=False, exitstatus=1)
    guard.pytest_sessionfinish(session)
    assert session.exitstatus == LIVENESS_EXIT and session.shouldfail == by_hand.lease.lost


# --- a deleted Lease -------------------------------------------------------------------------------

@pytest.mark.unit
def test_a_deleted_lease_is_not_recreated_and_liveness_is_lost(by_hand):
    """The sweeper takes a run without a Lease at once: a run that finds its Lease gone may have lost its
    objects already, so it never recreates the Lease; it stops, saying so."""
    _advance(by_hand, 600)
    by_hand.server.leases.clear()
    _advance(by_hand, 5)
    by_hand.lease._attempt()
    line = by_hand.lease.lost
    assert line and line.startswith(f"{LOST} at 2001-03-04T05:16:12Z (API server clock)"), line
    assert "was deleted" in line and "is not recreated" in line and "may have removed" in line, line
    assert not by_hand.server.leases, "a deleted Lease was recreated"


@pytest.mark.unit
def test_the_read_before_a_check_finds_a_deleted_lease_lost(by_hand):
    by_hand.server.leases.clear()
    assert by_hand.lease.check() and "was deleted" in by_hand.lease.lost, by_hand.lease.lost
    assert not by_hand.server.leases


@pytest.mark.unit
def test_a_lease_someone_else_holds_is_lost(by_hand):
    by_hand.server.lease()["spec"]["holderIdentity"] = "elsewhere/1/unit"
    by_hand.lease._attempt()
    assert by_hand.lease.lost and "is held by 'elsewhere/1/unit'" in by_hand.lease.lost, by_hand.lease.lost
    assert by_hand.server.lease()["spec"]["holderIdentity"] == "elsewhere/1/unit"


@pytest.mark.unit
def test_run_states_without_a_server_date_judge_nobody_dead(monkeypatch):
    """The sweeper's verdicts too are on the server's clock only: an answer without a Date cannot
    make any run look dead (no fallback to the local clock)."""
    old = {"metadata": {"name": "clusterproof-run-old", "namespace": "x", "labels": {"clusterproof.io/run": "old"}},
           "spec": {"renewTime": PAST.strftime(MICRO), "leaseDurationSeconds": 10}}
    answer = types.SimpleNamespace(data=json.dumps({"items": [old]}).encode(), headers={})
    monkeypatch.setattr(liveness, "raw_request", lambda *a, **k: answer)
    assert run_states(None)["old"].alive
    answer.headers = {"Date": email.utils.format_datetime(PAST + dt.timedelta(seconds=60), usegmt=True)}
    assert not run_states(None)["old"].alive


# --- a fake run against this session's cluster -----------------------------------------------------

DURATION = 10     # the profile's minimum run_lease_duration_s


@dataclass
class FakeRun:
    run_id: str
    proc: object
    dir: Path

    @property
    def lease_namespace(self) -> str:
        return "clusterproof"      # the harness's home namespace (clusterproof/kube/rbac.yaml)

    @property
    def lease_name(self) -> str:
        return f"clusterproof-run-{self.run_id}"

    @property
    def lease_path(self) -> str:
        return f"{LEASES}/namespaces/{self.lease_namespace}/leases/{self.lease_name}"

    def started(self, check: str) -> bool:
        return (self.dir / f"{check}.started").exists()

    def wait_started(self, check: str = "waits") -> None:
        def started():
            ended_early(self.proc)
            return self.started(check)
        wait_for(started, timeout=180, interval=0.2, what=f"run {self.run_id}'s check {check!r} under way")

    def release(self) -> None:
        (self.dir / "release").touch()

    def finish(self, timeout: float = 180):
        out, _ = self.proc.communicate(timeout=timeout)
        (self.dir / "output.txt").write_text(out)     # what the user saw, for whoever reads a failure
        failures, passed = junit_verdicts(self.dir / "junit.xml")
        return self.proc.returncode, out, failures, passed


@contextmanager
def fake_run(cluster, tmp_path):
    run_id = f"live-{os.urandom(2).hex()}"
    args = ["tests/liveness_run.py", "--cp-kubeconfig", str(cluster.kubeconfig), "--cp-profile", cluster.profile.name,
            "--cp-run-id", run_id, "--cp-set", f"run_lease_duration_s={DURATION}",
            f"--junitxml={tmp_path / 'junit.xml'}"]
    with background_pytest(args, tmp_path, env={"CP_LIVENESS_DIR": str(tmp_path)}) as proc:
        yield FakeRun(run_id, proc, tmp_path)


def _assert_stopped_with_the_line(cluster, run: FakeRun, rc: int, out: str, failures: dict, passed: list,
                                  *words: str) -> str:
    """Exit 7, the line once at the end, no traceback, the check under way failed with it, the later
    check never started, and nothing of the run left on the cluster. Returns the line."""
    assert rc == LIVENESS_EXIT, f"exit {rc}:\n{out[-3000:]}"
    lines = [ln.strip("! ") for ln in out.splitlines() if ln.startswith("!") and LOST in ln]
    assert len(lines) == 1, out[-3000:]
    line = lines[0]
    assert line.startswith(LOST) and all(w in line for w in words), line
    assert "Traceback" not in out and "INTERNALERROR" not in out, out[-3000:]
    # A failed call carries the line as its message; a check failed before it started (in set-up),
    # 'failed on setup with "<line>"'.
    assert list(failures) and all(line in msg for msg in failures.values()), (failures, out[-3000:])
    assert not run.started("later"), f"a check started after the loss:\n{out[-3000:]}"
    assert "test_a_later_check" not in passed
    wait_for(lambda: run_leftovers(cluster.api, run.run_id), until=lambda left: not left, timeout=60,
             what=f"nothing of run {run.run_id} left on the cluster")
    return line


@contextmanager
def deny_writes(cluster, run_id, run: FakeRun, operation: str):
    """A ValidatingAdmissionPolicy that denies ``operation`` (CREATE or UPDATE) on the fake run's Lease,
    in effect (a probe Lease beside it is refused) before the block runs; removed afterwards."""
    api, name = cluster.api, f"cp-deny-{operation.lower()}-{run.run_id}"
    probe = f"{run.lease_name}-probe"
    coll = f"{LEASES}/namespaces/{run.lease_namespace}/leases"
    policy = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
              "metadata": metadata(name, run_id),
              "spec": {"failurePolicy": "Fail",
                       "matchConstraints": {
                           "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": run.lease_namespace}},
                           "resourceRules": [{"apiGroups": ["coordination.k8s.io"], "apiVersions": ["v1"],
                                              "operations": [operation], "resources": ["leases"]}]},
                       "validations": [{"expression": f"!object.metadata.name.startsWith('{run.lease_name}')",
                                        "message": f"self-test: {operation} of {run.lease_name} is denied"}]}}
    binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": metadata(name, run_id), "spec": {"policyName": name, "validationActions": ["Deny"]}}
    probe_body = {"metadata": {"name": probe}, "spec": {"holderIdentity": "probe", "renewTime": PAST.strftime(MICRO)}}
    if operation == "UPDATE":
        raw_request(api, "POST", coll, body=probe_body).data

    def denied() -> bool:
        try:
            if operation == "UPDATE":
                raw_request(api, "PATCH", f"{coll}/{probe}", body={"spec": {"holderIdentity": os.urandom(2).hex()}},
                            headers={"Content-Type": "application/merge-patch+json", "Accept": "application/json"}).data
            else:
                raw_request(api, "POST", coll, body=probe_body).data
                delete_if_present(api, f"{coll}/{probe}")
            return False
        except client.ApiException as e:
            if e.status in (403, 422) and "is denied" in (e.body or ""):
                return True
            raise
    vap = "/apis/admissionregistration.k8s.io/v1"
    try:
        raw_request(api, "POST", f"{vap}/validatingadmissionpolicies", body=policy).data
        raw_request(api, "POST", f"{vap}/validatingadmissionpolicybindings", body=binding).data
        wait_for(denied, timeout=30, interval=0.2, what=f"{operation} of {run.lease_name} denied by the policy")
        yield
    finally:
        delete_if_present(api, f"{vap}/validatingadmissionpolicybindings/{name}")
        delete_if_present(api, f"{vap}/validatingadmissionpolicies/{name}")


@pytest.mark.cluster
def test_a_run_whose_lease_renewals_are_refused_stops_with_the_liveness_line(cluster, run_id, tmp_path):
    """Renewals denied (an admission policy on the run's Lease) while a check waits: past half the
    duration the check fails with the line, and the run stops."""
    with fake_run(cluster, tmp_path) as run:
        run.wait_started()
        with deny_writes(cluster, run_id, run, "UPDATE"):
            t0 = time.monotonic()
            rc, out, failures, passed = run.finish()
            took = time.monotonic() - t0
        line = _assert_stopped_with_the_line(cluster, run, rc, out, failures, passed,
                                             "longer than half its duration (10 s)", "denied request")
        assert "test_a_check_that_waits_for_the_self_test" in failures, failures
        # Lost within half the duration of the denial's start, plus one renewal period; not the 120 s wait.
        assert took < 60, f"the run took {took:.0f} s to stop after its renewals were denied: {line}"


@pytest.mark.cluster
def test_a_run_whose_lease_is_deleted_mid_suite_stops_with_the_liveness_line(cluster, tmp_path):
    """The negative control of the issue: a fake run's Lease deleted while a check runs. The run does not
    recreate it (a sweeper may already have taken its objects): it stops with the line."""
    with fake_run(cluster, tmp_path) as run:
        run.wait_started()
        assert delete_if_present(cluster.api, run.lease_path)
        rc, out, failures, passed = run.finish()
        _assert_stopped_with_the_line(cluster, run, rc, out, failures, passed, "was deleted", "is not recreated")
        assert "test_a_check_that_waits_for_the_self_test" in failures, failures


@pytest.mark.cluster
def test_a_run_stopped_past_its_lease_duration_starts_no_further_check(cluster, tmp_path):
    """SIGSTOP while a check waits, until the Lease is expired as a sweeper sees it; the check is released
    and the process resumed: it stops before the next check with the line, exit 7."""
    with fake_run(cluster, tmp_path) as run:
        run.wait_started()
        run.proc.send_signal(signal.SIGSTOP)
        try:
            wait_expired(cluster.api, run.run_id, timeout=60)
            run.release()
        finally:
            run.proc.send_signal(signal.SIGCONT)
        rc, out, failures, passed = run.finish()
        _assert_stopped_with_the_line(cluster, run, rc, out, failures, passed, "found expired",
                                      "may have removed this run's objects")


class _Finalized:
    """An object whose finalizer is where the loss's signal lands (as logging's handler clean-up did in CI)."""

    def __init__(self, guard: LivenessGuard):
        self.guard = guard

    def __del__(self):
        signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
        for _ in range(1000):    # bytecode boundaries inside the finalizer: the handler raises in here
            pass


@pytest.mark.cluster
def test_a_loss_raised_inside_a_finalizer_is_sent_again_and_never_printed(monkeypatch):
    """The signal may land while the main thread runs a finalizer, where Python swallows the exception as
    unraisable: the guard's hook hides it (no traceback in the run's output) and sends the loss again, so the
    check under way still stops; outside a check (teardown) nothing is sent again."""
    guard = LivenessGuard(types.SimpleNamespace(stash={}))
    printed = []
    monkeypatch.setattr("sys.unraisablehook", lambda u: printed.append(u))
    guard.pytest_sessionstart(None)
    previous = signal.signal(signal.SIGUSR1, guard._on_signal)
    try:
        guard.line = "clusterproof: liveness lost (self-test)"
        with pytest.raises(LivenessLost, match="self-test"):
            with guard._armed():
                _Finalized(guard)        # dropped at once: its __del__ runs here
                time.sleep(5)            # the loss is sent again within RESEND_S and interrupts this
        assert printed == [], [str(u.exc_value) for u in printed]
        other = types.SimpleNamespace(exc_value=ValueError("someone else's"))
        assert guard.swallowed(other) is False
        assert guard.swallowed(types.SimpleNamespace(exc_value=LivenessLost("x"))) is True and not guard.armed
    finally:
        signal.signal(signal.SIGUSR1, previous)
