"""A run proves it is alive the way Kubernetes components do: by renewing a Lease.

Why: the sweeper must never take what belongs to a run that is still going,
wherever that run is (another CI machine, another container with the same
host name and its own pid space). Host names and pids cannot tell; a
``coordination.k8s.io`` Lease that the run renews every
``run_lease_duration_s / 4`` can. A run whose Lease has not been renewed for
its duration is dead; its objects are leftovers.

The Lease lives in the harness's home namespace (``clusterproof``, from
``clusterproof/kube/rbac.yaml``; the embedded cluster is provisioned with it too).

Liveness that cannot be lost silently. A run whose Lease expired carries on
at its peril: another run's sweeper may already have removed its objects,
and the checks that then fail would read as cluster defects. So the Lease is
*lost* -- ``RunLease.lost`` holds one line saying when and why, and
``on_lost`` is called once (the session plugin stops the run, exit
``LIVENESS_EXIT``) -- when:

- renewals have failed for longer than half the duration (an unreachable
  API server, a denied write): the run stops while the Lease is still valid
  to every sweeper;
- the Lease is found expired: the server's time minus its renewTime exceeds
  the duration (the process was stopped, SIGSTOP, or starved). A renewal
  reads the Lease and judges it *before* writing, so an expired Lease is
  never renewed back to life; the session's check before every test does
  the same read;
- the Lease was deleted (it is never recreated, below), or someone else
  now holds it.

A deleted Lease is never recreated. The sweeper (``clusterproof.kube.sweep``) takes
the objects of a run without a Lease at once -- a run makes its Lease first
and deletes it last, so a record or claim without one belongs to a run that
is over -- so a run that finds its Lease gone may already have lost its
objects: it stops, saying so.

Clocks. Every verdict about the Lease compares times of the API server's
clock: the ``Date`` header of a response against the renewTime the run wrote,
which is itself the ``Date`` of the read just before the write. No local
wall-clock time is read and no local offset is applied, so a skewed or
stepped local clock (NTP, a VM resumed) can neither keep a dead Lease alive
nor make a live one look dead. The local *monotonic* clock only bounds how
long renewals have been failing -- while the server cannot be reached it
gives no time at all -- and it never decides that the Lease expired.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

from kubernetes import client

from clusterproof.core import exitcodes, progress
from clusterproof.core.run import RUN_LABEL, metadata
from clusterproof.core.timeparse import MICRO, format_time, http_date, parse_time
from clusterproof.core.waiting import wait_for
from clusterproof.kube.client import get_if_present, raw_request
from clusterproof.kube.ownership import REPLACED, delete_owned

LEASES = "/apis/coordination.k8s.io/v1"
LEASE_PREFIX = "clusterproof-run-"
# Slack for the 1 s resolution of the Date header on both sides of a comparison.
CLOCK_SLACK_S = 2.0
# The exit status of a run that lost its Lease (7, clusterproof.core.exitcodes): stopped mid-run,
# nothing after the loss was checked, and objects may have been swept.
LIVENESS_EXIT = exitcodes.LEASE_LOST
LOST = "clusterproof: liveness lost"
MERGE_PATCH = {"Content-Type": "application/merge-patch+json", "Accept": "application/json"}


def server_time(headers) -> dt.datetime | None:
    """The API server's time from a response's (or an ApiException's) headers; None without a Date."""
    return http_date(headers.get("Date")) if headers is not None else None


def shown(t: dt.datetime | None) -> str:
    return format_time(t) if t is not None else "?"


class NoServerTime(Exception):
    """An answer without a Date header: nothing can be judged on the server's clock."""


class RunLease:
    """This run's Lease: created at start, renewed in the background, deleted at the end.

    ``on_lost(line)`` is called once, from a background thread (or from
    the caller of ``check``), when liveness is lost. ``request`` and ``clock``
    are ``raw_request`` and ``time.monotonic`` except in self-tests.
    """

    def __init__(self, api: client.ApiClient, run_id: str, namespace: str, duration_s: int = 60, *,
                 on_lost: Callable[[str], None] | None = None,
                 request=raw_request, clock: Callable[[], float] = time.monotonic):
        self.api, self.run_id, self.duration_s, self.namespace = api, run_id, duration_s, namespace
        self.name = f"{LEASE_PREFIX}{run_id}"
        self.holder = f"{socket.gethostname()[:40]}/{os.getpid()}/{run_id}"
        self.on_lost = on_lost
        self._request, self._clock = request, clock
        self.renewals = 0
        self.last_error: str | None = None
        self.lost: str | None = None
        self.notes: list[str] = []      # what happened to the Lease short of a loss (said by the session)
        # Each request is bounded so that one hung connection cannot outlast the loss deadline by much
        # (the watchdog declares the loss on time regardless).
        self.request_timeout = max(1.0, duration_s / 8)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # Server clock: when the run took the Lease, the renewTime of its last acknowledged write,
        # and when the Lease was last seen present and ours.
        self._started: dt.datetime | None = None
        self._renewed: dt.datetime | None = None
        self._seen: dt.datetime | None = None
        # Local monotonic clock: when the last successful renewal started; when the renewals that
        # have failed since began; when the attempt now under way began.
        self._ok_at = clock()
        self._failing_since: float | None = None
        self._in_flight: float | None = None
        # When the watchdog last woke far later than it asked: this process was stopped or starved, so a
        # request under way then gets its bound again from that moment (it did not hang: it was frozen).
        self._resumed_at = float("-inf")

    @property
    def path(self) -> str:
        return f"{LEASES}/namespaces/{self.namespace}/leases/{self.name}"

    @property
    def where(self) -> str:
        return f"{self.namespace}/{self.name}"

    # --- requests -----------------------------------------------------------------------------

    def _call(self, method: str, path: str, body=None, headers=None) -> tuple[dt.datetime, dict]:
        """One request: the server's time of the answer and its JSON body."""
        resp = self._request(self.api, method, path, headers=headers, body=body, timeout=self.request_timeout)
        data = resp.data
        when = server_time(resp.headers)
        if when is None:
            raise NoServerTime(f"the API server's answer to {method} {path} has no Date header")
        return when, (json.loads(data) if data else {})

    def _lease_body(self, renew: dt.datetime) -> dict:
        acquired = self._started or renew
        return {"metadata": metadata(self.name, self.run_id),
                "spec": {"holderIdentity": self.holder, "leaseDurationSeconds": self.duration_s,
                         "acquireTime": acquired.strftime(MICRO), "renewTime": renew.strftime(MICRO)}}

    def _create(self, renew: dt.datetime) -> dt.datetime:
        """POST the Lease with ``renew`` as its renewTime; the server's time of the answer."""
        when, _ = self._call("POST", f"{LEASES}/namespaces/{self.namespace}/leases", body=self._lease_body(renew))
        return when

    # --- life cycle ---------------------------------------------------------------------------

    def acquire(self) -> "RunLease":
        started = self._clock()
        now, _ = self._call("GET", "/version")     # renewTime is a server time, read just before the write
        self._started = now
        self._seen = self._create(now)
        self._renewed, self._ok_at = now, started
        self._threads = [threading.Thread(target=self._renew_loop, daemon=True, name="run-lease"),
                         threading.Thread(target=self._watchdog, daemon=True, name="run-lease-watchdog")]
        for t in self._threads:
            t.start()
        return self

    def abandon(self) -> None:
        """Stop renewing, keep the Lease (what a killed run leaves; for self-tests)."""
        self._stop.set()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=10)

    def release(self) -> None:
        """Stop renewing and delete the Lease, only if it is still this run's.

        Why the read and the preconditions: a run that lost its Lease because another process holds
        it (the same run id started twice) must not end that one's liveness too. The holder is read,
        and the DELETE carries the read's uid and resourceVersion; 409 or another holder: left in place.
        """
        self.abandon()
        lease = get_if_present(self.api, self.path)
        if lease is None:
            return
        holder = (lease.get("spec") or {}).get("holderIdentity")
        meta = lease["metadata"]
        if holder != self.holder or delete_owned(self.api, self.path, meta["uid"],
                                                 meta["resourceVersion"]) == REPLACED:
            progress.say(f"the run Lease {self.where} is held by {holder!r} now, not by this run ({self.holder}): "
                         "left in place")

    # --- renewal ------------------------------------------------------------------------------

    def renew(self) -> None:
        """One renewal: read the Lease, judge it on the server's clock, and only then write renewTime.

        The write carries the read's resourceVersion (a conditional write: a Lease someone changed
        in between is read again next time) and the read's Date as renewTime. The write's own Date
        is judged against the renewTime it replaced: a process stopped between read and write
        renewed an expired Lease, and that is a loss too.
        """
        try:
            now, lease = self._call("GET", self.path)
        except client.ApiException as e:
            if e.status == 404:
                self._lose(self._deleted_line(server_time(e.headers)))
                return
            raise
        before = self._judge(now, lease)
        if before is None:
            return
        when, _ = self._call("PATCH", self.path, headers=MERGE_PATCH, body={
            "metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
            "spec": {"renewTime": now.strftime(MICRO), "holderIdentity": self.holder}})
        if (when - before).total_seconds() > self.duration_s:
            self._lose(self._expired_line(before, when))
            return
        self._renewed, self._seen = now, when

    def _judge(self, now: dt.datetime, lease: dict) -> dt.datetime | None:
        """Is the Lease that was read at server time ``now`` still this run's and alive? Its renewTime if so."""
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        if holder != self.holder:
            self._lose(f"{LOST} at {shown(now)} (API server clock): the run Lease {self.where} is held by "
                       f"{holder!r}, not by this run ({self.holder}); other runs' sweepers may have removed "
                       f"this run's objects since it was last seen as this run's at {shown(self._seen)} "
                       "-- the run stops")
            return None
        renewed = parse_time(spec.get("renewTime"))
        if renewed is None or (now - renewed).total_seconds() > self.duration_s:
            self._lose(self._expired_line(renewed, now))
            return None
        return renewed

    def _expired_line(self, renewed: dt.datetime | None, now: dt.datetime) -> str:
        if renewed is None:
            return (f"{LOST} at {shown(now)} (API server clock): the run Lease {self.where} has no renewTime "
                    "-- the run stops")
        end = renewed + dt.timedelta(seconds=self.duration_s)
        return (f"{LOST} at {shown(end)} (API server clock): the run Lease {self.where}, last renewed at "
                f"{shown(renewed)}, was found expired at {shown(now)} ({(now - renewed).total_seconds():.0f} s "
                f"after that renewal, duration {self.duration_s} s: was the process stopped or starved?); "
                f"other runs' sweepers may have removed this run's objects since {shown(end)} -- the run stops")

    def _deleted_line(self, now: dt.datetime | None) -> str:
        return (f"{LOST} at {shown(now)} (API server clock): the run Lease {self.where} was deleted (last seen "
                f"at {shown(self._seen)}) and is not recreated: a sweeper takes the objects of a run without a "
                "Lease at once, so other runs' sweepers may have removed this run's objects since -- the run stops")

    def _attempt(self) -> None:
        """One renewal with its bookkeeping: success, or a failure that counts toward the deadline.

        The order of the updates matters: the watchdog reads them without a lock, so a success
        moves the deadline before it clears the failure, and a failure is recorded before the
        attempt stops counting as under way.
        """
        started = self._in_flight = self._clock()
        try:
            self.renew()
        except Exception as e:   # an unreachable or refusing API server: judged by the deadline
            self.last_error = f"{type(e).__name__}: {_short(e)}"
            if self._failing_since is None:
                self._failing_since = started
            self._in_flight = None
            self._past_deadline()
            return
        if self.lost is None:
            if self._failing_since is not None:
                self.notes.append(f"run Lease {self.where}: renewals failed for "
                                  f"{started - self._failing_since:.1f} s and recovered (last error: "
                                  f"{self.last_error})")
            self._ok_at = started
            self._failing_since = self.last_error = None
            self.renewals += 1
        self._in_flight = None

    def _past_deadline(self) -> None:
        """Lose liveness if renewals have been failing (or one has hung) for over half the duration."""
        now = self._clock()
        # A request under way counts as failing once it has taken longer than a request may: one
        # that started a moment ago (a process just resumed from SIGSTOP) is left to give its verdict.
        hung = self._in_flight is not None and now - max(self._in_flight, self._resumed_at) > self.request_timeout
        failing = self._failing_since is not None or hung
        elapsed = now - self._ok_at
        if not failing or elapsed <= self.duration_s / 2:
            return
        end = self._renewed + dt.timedelta(seconds=self.duration_s)
        self._lose(f"{LOST} {elapsed:.0f} s after the last renewal at {shown(self._renewed)} (API server clock): "
                   f"renewals of the run Lease {self.where} have failed for longer than half its duration "
                   f"({self.duration_s} s) (last error: {self.last_error or 'no answer'}); other runs' sweepers "
                   f"may remove this run's objects from {shown(end)} (API server clock) on -- the run stops")

    def _renew_loop(self) -> None:
        every, retry = self.duration_s / 4, max(0.5, self.duration_s / 16)
        while True:
            wait = retry if self.last_error else self._ok_at + every - self._clock()
            if self._stop.wait(max(0.0, wait)) or self.lost:
                return
            self._attempt()

    def _watchdog(self) -> None:
        """Declares the loss at the deadline even while a renewal hangs in a request.

        It never judges a Lease expired (only the server's clock does): past the deadline with no
        failure and no request under way (a process that was stopped and resumed), it waits for
        the renewal thread's verdict.
        """
        poll = min(0.5, self.duration_s / 8)
        while True:
            wait = max(poll, self._ok_at + self.duration_s / 2 - self._clock())
            due = self._clock() + wait
            if self._stop.wait(wait) or self.lost:
                return
            self._woke(due)
            self._past_deadline()

    def _woke(self, due: float) -> None:
        """The watchdog woke at ``due`` or later. Later by more than a request's bound: the process, not a request,
        was held (SIGSTOP, starved) -- a request under way across that gets its bound again from now, so the
        renewal it belongs to gives its verdict (found expired, as the server's clock says) instead of the
        watchdog calling it hung."""
        now = self._clock()
        if now - due > self.request_timeout:
            self._resumed_at = now

    def check(self) -> str | None:
        """Before a check: read the Lease and judge it on the server's clock; the loss line or None.

        Why besides the renewals: a process stopped (SIGSTOP) past its duration and resumed must not
        start another check before its renewal thread has had a turn. Errors are left to the
        renewal thread (its deadline judges them); a deleted Lease is a loss at once.
        Read-only: only the renewal thread writes the Lease.
        """
        if self.lost is None:
            try:
                now, lease = self._call("GET", self.path)
                self._judge(now, lease)
            except client.ApiException as e:
                if e.status == 404:
                    self._lose(self._deleted_line(server_time(e.headers)))
            except Exception:
                pass
        return self.lost

    def _lose(self, line: str) -> None:
        with self._lock:
            if self.lost is not None:
                return
            self.lost = line
        self._stop.set()        # an expired Lease is never renewed back to life
        if self.on_lost is not None:
            try:
                self.on_lost(line)
            except Exception as e:   # the line stays in .lost for the session's checks
                print(f"[clusterproof] could not signal the loss of liveness ({e}): {line}",
                      file=sys.stderr, flush=True)


def _short(e: Exception) -> str:
    if isinstance(e, client.ApiException):
        try:
            return f"{e.status} {json.loads(e.body)['message']}"[:300]
        except (TypeError, ValueError, KeyError):
            return f"{e.status} {e.reason}"
    return str(e)[:300]


@dataclass(frozen=True)
class RunState:
    run_id: str
    alive: bool
    why: str          # "lease renewed 12 s ago (duration 60 s)" ...


def run_states(api: client.ApiClient, namespace: str = "") -> dict[str, RunState]:
    """Every run that has a Lease (cluster-wide, or in ``namespace``): alive or expired.

    A Lease is expired when the server's current time is past its renewTime
    plus its duration (plus a little slack for the 1 s Date resolution). An
    answer without a Date cannot be judged: every run counts as alive.
    """
    path = f"{LEASES}/namespaces/{namespace}/leases" if namespace else f"{LEASES}/leases"
    resp = raw_request(api, "GET", path, {"labelSelector": RUN_LABEL})
    listing = json.loads(resp.data)
    now = server_time(resp.headers)
    out = {}
    for lease in listing.get("items", []):
        meta, spec = lease["metadata"], lease.get("spec") or {}
        if not meta["name"].startswith(LEASE_PREFIX):
            continue
        run = meta["labels"].get(RUN_LABEL, meta["name"][len(LEASE_PREFIX):])
        if now is None:
            out[run] = RunState(run, True, "the API server sent no Date header: liveness cannot be judged")
            continue
        renewed = parse_time(spec.get("renewTime")) or parse_time(meta.get("creationTimestamp"))
        duration = int(spec.get("leaseDurationSeconds") or 60)
        age = (now - renewed).total_seconds() if renewed else float("inf")
        alive = age <= duration + CLOCK_SLACK_S
        out[run] = RunState(run, alive, f"lease {meta['namespace']}/{meta['name']} renewed {age:.0f} s ago "
                                        f"(duration {duration} s)")
    return out


def wait_expired(api: client.ApiClient, run_id: str, timeout: float, namespace: str = "") -> None:
    """Until ``run_id``'s Lease is expired (self-tests of the sweeper)."""
    wait_for(lambda: run_states(api, namespace).get(run_id), until=lambda s: s is None or not s.alive,
             timeout=timeout, interval=1, what=f"lease of run {run_id} expired")
