"""The control plane's health: kept up like a node keeps its static pods, checked around every module.

Here: the ``Supervisor``, the health checks, and ``ModuleGuard`` (what the
module fixture ``control_plane_guard`` of ``clusterproof.fixtures.cluster``
asks before and after each module).

Why: one suite must not poison the next. A 4,000-pod native gang once kept
kube-scheduler so busy that it lost its leader lease and exited; nothing
restarted it, and the next suite waited 600 s per check for binds that
never came, without a word about the scheduler. So:

- on the embedded cluster a ``Supervisor`` (a thread) watches every
  component's process (pid file + ``processes.owned_process``) and restarts
  one that exits, through kwokctl (``kwokctl start cluster`` starts exactly
  the components that are not running), as a kubelet restarts a static pod;
  each restart, with the component's last log line, is a finding;
- before and after every test module (``control_plane_guard``) the harness
  checks that every component runs, that kube-scheduler and
  kube-controller-manager hold their leader leases and that ``/readyz``
  answers ok, and reads the API servers' answers (``clusterproof.cluster.apiguard``:
  any 5xx fails the module, 429s are reported per flow schema). A module
  that starts on a broken control plane fails at once, saying what is
  broken; a module during which a component died or that
  leaves the control plane broken fails in its teardown, naming the
  component and its last log line. Problems get ``RECOVERY_S`` to clear
  first (a restarted kube-scheduler waits for its predecessor's lease).
"""
from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from dataclasses import dataclass, field

from kubernetes import client

from clusterproof.cluster import apiwork
from clusterproof.cluster.apiguard import ApiGuard
from clusterproof.cluster.kwok import KwokCluster
from clusterproof.cluster.lost_deletions import LostDeletions
from clusterproof.core.attachment import Attach, Attachment
from clusterproof.core.waiting import WaitTimeout, wait_for
from clusterproof.kube.client import get_if_present, raw_request
from clusterproof.kube.liveness import parse_time
from clusterproof.kube.pods import wait_namespaces_gone

log = logging.getLogger("clusterproof.cluster")

LEADER_LEASES = ("kube-scheduler", "kube-controller-manager")
# A leader renews every ~2 s (retryPeriod) within a 15 s lease: older than this, it has lost it.
LEASE_SLACK_S = 5.0
# How long a control plane may take to recover before it counts as broken: a restarted
# kube-scheduler waits for its predecessor's 15 s lease to expire before it leads.
RECOVERY_S = 45.0


@dataclass
class Restart:
    component: str
    at: float                        # wall time it was found dead
    last_log_line: str
    restarted: bool
    error: str | None = None

    def __str__(self) -> str:
        when = dt.datetime.fromtimestamp(self.at, dt.timezone.utc).strftime("%H:%M:%S")
        how = "restarted" if self.restarted else f"NOT restarted ({self.error})"
        return f"{self.component} exited at {when} UTC, {how}; its last log line: {self.last_log_line}"


@dataclass
class Supervisor:
    """Restarts the embedded cluster's components when they exit; records every restart."""
    kwok: KwokCluster
    interval_s: float = 2.0
    expected: list[str] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)
    paused: set[str] = field(default_factory=set)   # stopped on purpose (a negative control): not restarted
    ever_paused: list[str] = field(default_factory=list)   # every pause, in order (the guard excuses them)
    lost: LostDeletions = field(init=False)   # node deletions kwok never saw (clusterproof.cluster.lost_deletions)

    def __post_init__(self):
        self.lost = LostDeletions(self.kwok.directory / "logs" / "kwok-controller.log")
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._restarting = threading.Lock()   # one restart at a time: the thread's or check()'s
        self._thread: threading.Thread | None = None

    def pause(self, component: str) -> None:
        """A self-test stops ``component`` on purpose: leave it down until ``resume``."""
        with self._lock:
            self.paused.add(component)
            self.ever_paused.append(component)

    def resume(self, component: str) -> None:
        with self._lock:
            self.paused.discard(component)

    def start(self) -> "Supervisor":
        self.expected = sorted(self.kwok.pids())
        self._thread = threading.Thread(target=self._loop, daemon=True, name="control-plane supervisor")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def down(self) -> list[str]:
        """Components that should run and do not (paused ones excepted)."""
        running = self.kwok.pids()
        with self._lock:
            paused = set(self.paused)
        return [c for c in self.expected if c not in running and c not in paused]

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check()
            except Exception as e:   # a supervisor that dies silently supervises nothing: say it, go on
                with self._lock:
                    self.restarts.append(Restart("supervisor", time.time(), "-", False,
                                                 error=f"its check failed: {type(e).__name__}: {e}"[:300]))

    def check(self) -> None:
        """Restart what is down, now (the thread does this every ``interval_s``; the module guard
        calls it too, so a component killed at the very end of a module is not missed)."""
        with self._restarting:
            dead = self.down()
            if dead and not self._stop.is_set():
                self._restart(dead)

    def _restart(self, dead: list[str]) -> None:
        found = [Restart(name, time.time(), self.kwok.last_words(name), False)
                 for name in dead]
        with self._lock:
            paused = set(self.paused)          # down on purpose: its pid file stays
        proc = self.kwok.start_stopped(keep=paused)
        still = set(self.down())
        for r in found:
            r.restarted = r.component not in still
            if not r.restarted:
                r.error = f"kwokctl start cluster exited {proc.returncode}"
        with self._lock:
            self.restarts.extend(found)

    def since(self, index: int) -> list[Restart]:
        with self._lock:
            return self.restarts[index:]


def leader_problems(api: client.ApiClient, required: bool) -> list[str]:
    """Leader leases in kube-system that are not renewed within their duration (and, if
    ``required`` -- the embedded cluster, where they must exist -- that are missing)."""
    out = []
    now = dt.datetime.now(dt.timezone.utc)
    for name in LEADER_LEASES:
        lease = get_if_present(api, f"/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{name}")
        if lease is None:
            if required:
                out.append(f"{name} holds no leader lease (kube-system/{name} missing)")
            continue
        spec = lease.get("spec") or {}
        renewed = parse_time(spec.get("renewTime"))
        duration = float(spec.get("leaseDurationSeconds") or 15)
        age = (now - renewed).total_seconds() if renewed else float("inf")
        if age > duration + LEASE_SLACK_S:
            out.append(f"{name}'s leader lease was last renewed {age:.0f} s ago (duration {duration:g} s; "
                       f"holder {spec.get('holderIdentity', '?')})")
    return out


def readyz_problem(api: client.ApiClient) -> str | None:
    try:
        raw_request(api, "GET", "/readyz", headers={"Accept": "text/plain"}, timeout=20,
                    retry_s=0).data  # "ready now?": the guard's own wait does the retrying
        return None
    except client.ApiException as e:
        body = e.body.decode(errors="replace") if isinstance(e.body, bytes) else str(e.body or "")
        failed = [ln for ln in body.splitlines() if "failed" in ln]
        return f"/readyz answered {e.status}: {'; '.join(failed[:3]) or e.reason}"
    except Exception as e:
        return f"/readyz did not answer ({type(e).__name__})"


def problems(cluster, supervisor: Supervisor | None) -> list[str]:
    """What is wrong with the control plane now (empty: healthy)."""
    out = []
    if supervisor is not None:
        for name in supervisor.down():
            out.append(f"{name} is not running (its last log line: "
                       f"{cluster.kwok.last_words(name)})")
    try:
        why = readyz_problem(cluster.api)
        if why:
            out.append(why)
        out += leader_problems(cluster.api, required=cluster.kwok is not None)
    except Exception as e:
        out.append(f"the API server does not answer ({type(e).__name__}: {str(e)[:160]})")
    return out


def settle(cluster, supervisor: Supervisor | None, timeout: float = RECOVERY_S) -> list[str]:
    """Problems that outlast ``timeout`` (a restarted scheduler needs the old lease to expire first)."""
    try:
        wait_for(lambda: problems(cluster, supervisor), until=lambda p: not p, timeout=timeout, interval=2,
                 what="control plane healthy")
        return []
    except AssertionError:
        return problems(cluster, supervisor)


class ModuleGuard:
    """One test module's watch over the control plane (the ``control_plane_guard`` fixture): was it healthy
    when the module started, and did the module break it? Each answer is the failure's one line, or None; the
    findings go to ``attach`` as they are made."""

    def __init__(self, cluster, supervisor: Supervisor | None, api_guard: ApiGuard, attach: Attach):
        self.cluster, self.sup, self.guard, self.attach = cluster, supervisor, api_guard, attach

    def start(self, run_id: str) -> str | None:
        """Settle, stop kwok's lease workers for nodes deleted without its knowing, then note where the module
        starts (restarts, processes, the apiservers' counters)."""
        before = settle(self.cluster, self.sup)
        if before:
            return ("the control plane was already broken when this module started (an earlier module or the "
                    f"environment broke it): {'; '.join(before)}")
        sup = self.sup
        if sup:
            try:
                parked = sup.lost.repair(self.cluster.api, run_id)
            except Exception as e:   # a mitigation of the simulator's, not a check: said, never the module's red
                parked = []
                log.warning(f"could not look for node deletions kwok missed (they may cost kwok's lease workers "
                            f"until the next module's look): {type(e).__name__}: {e}")
            if parked:
                line = (f"kwok (the simulator) missed the deletion of {len(parked)} nodes and kept writing their "
                        f"Leases; each now has a Lease the harness holds, which stops it "
                        f"(e.g. {', '.join(parked[:3])}; {len(sup.lost.parked)} so far; "
                        "clusterproof/cluster/lost_deletions.py)")
                log.info(line)
                self.attach(Attachment("simulator: node deletions kwok missed", line + "\n\n" + "\n".join(parked)))
        self.mark = len(sup.restarts) if sup else 0
        self.pids, self.paused_mark = (self.cluster.kwok.pids(), len(sup.ever_paused)) if sup else ({}, 0)
        self.api_mark = self.guard.mark()
        self.work_mark = apiwork.Snapshot.take(self.cluster.calls, self.api_mark.text, self.pids)
        return None

    def end(self, run_id: str, suite: str = "") -> str | None:
        """After the module: what it broke (components that died, problems that outlast ``RECOVERY_S``,
        namespaces not gone, 5xx answers); the findings are attached to the report, and what the module
        cost the control plane is ``self.work`` (``clusterproof.cluster.apiwork``)."""
        cluster, sup = self.cluster, self.sup
        if sup:
            sup.check()
        # The namespaces this module deleted: the controller's work on them belongs to this module.
        try:
            wait_namespaces_gone(cluster.api, run_id)
            stuck = []
        except WaitTimeout as e:
            stuck = [str(e)]
        left = settle(cluster, sup) + stuck
        api = self.guard.since(self.api_mark)
        self.attach(Attachment("API health during this module (5xx, 429s per flow schema)",
                               api.report() if api else "the apiserver's counters could not be read twice from one "
                                                        "replica"))
        self.work = apiwork.ModuleWork.between(suite, self.work_mark, apiwork.Snapshot.take(
            cluster.calls, api.metrics if api else None, cluster.kwok.pids() if sup else {}))
        self.attach(Attachment("API work during this module (requests, watch events, CPU seconds)",
                               self.work.report()))
        restarted = sup.since(self.mark) if sup else []
        if sup:
            # A component whose process changed during the module died in it, even if it came back
            # before the supervisor looked (a restart the supervisor made is already in ``restarted``).
            seen = {r.component for r in restarted} | set(sup.ever_paused[self.paused_mark:])
            now = cluster.kwok.pids()
            restarted += [Restart(c, time.time(), cluster.kwok.last_words(c),
                                  c in now, None if c in now else "not running")
                          for c, pid in self.pids.items() if now.get(c) != pid and c not in seen]
        if restarted:
            self.attach(Attachment("control-plane components restarted during this module",
                                   "\n".join(map(str, restarted))))
        if restarted or left:
            return "this module broke the control plane: " + "; ".join([str(r) for r in restarted] + left)
        if api and api.errors:
            return (f"the API servers answered 5xx during this module: {api.error_line()}"
                    + (f" ({api.note})" if api.note else ""))
        return None
