"""Pod creation load, measured: a pod watch starts, locust applies load/burst.py, the watch gathers.

Shared by suites/test_burst_pod_creation.py (through the ``burst`` fixture
of ``clusterproof.fixtures.burst``) and the benchmarks (clusterproof/bench/burst.py,
clusterproof/bench/knee.py), so that the suite's checks and the benchmarks' figures
are the same numbers. Load (what to apply, phase by phase) is ``load/``; this
module only orders the phases and measures (ClusterLoader2: measurements start
before the phase, gather after).

Every figure is taken twice where it can be, and both are reported:

- API latency: locust's client-side times, and the apiserver's own
  histogram over the same window (the SLO is defined on the latter);
- pod startup: as this client's watch saw it (created -> Running), and by
  the objects' own timestamps (creationTimestamp -> Ready
  lastTransitionTime, 1 s resolution) -- the cluster's latency, without
  the watch's delivery lag. The lag itself is reported at both ends.

Distributed load (``burst_locust_workers`` remote workers, ``clusterproof load-worker``): the
figures are the master's aggregate. A worker lost mid-phase is reported (a log line, the
workers' table in the figures, the master's record attached), and the harness creates what
is missing of its share itself: pod names are fixed by the plan, so a create of a pod the lost
worker did make (its answer never reported, or the worker only cut off, still running) meets
409 AlreadyExists and can never make a second pod. Who created each pod is on the pod
(``clusterproof.io/created-by``); the phase's census counts them from the cluster.
"""
from __future__ import annotations

import datetime as dt
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kubernetes import client

from clusterproof.burst.plan import CREATOR_LABEL, HARNESS, PHASE_LABEL, Phase, locust_args, pod_name, rank_pod
from clusterproof.cluster.realnodes import is_component, pod_on
from clusterproof.core import measurement, progress
from clusterproof.core.attachment import CSV, JSON, Attachment
from clusterproof.core.locust import LocustResult, Master, lost_line, run_locust
from clusterproof.core.measurement import measured
from clusterproof.core.progress import phase as step
from clusterproof.core.run import RUN_LABEL
from clusterproof.core.stats import histogram_quantile, percentile
from clusterproof.core.timeparse import parse_time
from clusterproof.core.waiting import WaitTimeout, wait_for
from clusterproof.kube import apimetrics
from clusterproof.kube.client import get_if_present, list_raw
from clusterproof.kube.informer import InformerError
from clusterproof.kube.pods import create_pods, delete_selected, list_pods, try_create
from clusterproof.kube.podtimeline import PodTimeline, dump, job_times, scheduling_throughput, startup_server_s
from clusterproof.kube.tokens import create_load_identity
from clusterproof.report.plots import Plot, Series

REAL_POD_LABEL = "clusterproof.io/real-node-probe"
REAL_PODS_PER_NODE = 6


class RealNodePods(threading.Thread):
    """Pods on the embedded cluster's real nodes while a phase's load runs (``per_node`` each, spread over
    ``window_s``), created by the harness and timed by their own timestamps: a real container's start-up
    beside the kwok pods' under the same load (clusterproof.cluster.realnodes)."""

    def __init__(self, api, namespace: str, run_id: str, real, per_node: int, window_s: float, kwok=None):
        super().__init__(daemon=True, name="real-node pods")
        self.api, self.ns, self.run_id, self.real, self.kwok = api, namespace, run_id, real, kwok
        self.pids_before = self._pids()
        self.per_node, self.interval = per_node, max(0.1, window_s / max(1, per_node))
        self.names: list[str] = []
        self.error: str | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        image = self.real.images["pause"].digest_ref
        try:
            for i in range(self.per_node):
                if self.stop.is_set():
                    break
                bodies = [pod_on(f"real-probe-{n.index}-{i}", self.run_id, n.name, image) for n in self.real.nodes]
                for b in bodies:
                    b["metadata"]["labels"][REAL_POD_LABEL] = "true"
                create_pods(self.api, self.ns, bodies)
                self.names += [b["metadata"]["name"] for b in bodies]
                self.stop.wait(self.interval)   # the pacing of the probe, not a synchronisation
        except Exception as e:   # reported by the check, never lost
            self.error = f"{type(e).__name__}: {str(e)[:200]}"

    def _pids(self) -> dict[str, int]:
        """The real nodes' kubelet and containerd processes now (a restart in between voids the figures)."""
        return {k: v for k, v in self.kwok.pids().items() if is_component(k)} if self.kwok is not None else {}

    def finish(self, timeout: float) -> "RealNodeStartup":
        """Wait for every probe pod to be Ready (bounded), then delete them; their start-up times."""
        self.stop.set()
        self.join(timeout=60)
        try:
            pods = wait_for(lambda: list_pods(self.api, self.ns, REAL_POD_LABEL),
                            until=lambda ps: all(startup_server_s(ps.get(n, {})) is not None for n in self.names),
                            timeout=timeout, interval=1, what=f"{len(self.names)} real-node pods Ready")
        except WaitTimeout:
            pods = list_pods(self.api, self.ns, REAL_POD_LABEL)
        finally:
            delete_selected(self.api, self.ns, REAL_POD_LABEL, what="the real-node probe pods")
        after = self._pids()
        restarted = sorted(k for k, pid in self.pids_before.items() if after.get(k) != pid)
        void = (f"{', '.join(restarted)} exited or restarted while the real-node pods started: their figures are "
                "void; why is the control-plane guard's finding") if restarted else None
        return RealNodeStartup(self.real.names, len(self.names), self.error, void,
                               {n: startup_server_s(pods.get(n, {})) for n in self.names})


@dataclass
class RealNodeStartup:
    """The real nodes' pods of a phase (``RealNodePods``): each one's start-up by its own timestamps (None: never
    Ready), and why there are none or why they are void."""
    nodes: list[str]
    planned: int
    error: str | None
    void: str | None
    startup_s: dict[str, float | None]


@dataclass
class PhaseFigures(measurement.Typed):
    """A phase's figures: the load's (locust, client side), the apiserver's histograms over the phase, the pod
    watch's, the cluster's census of the phase's pods after it, and the distributed load's workers. A check reads
    them as attributes; ``gather()`` names each by its field (the benches' keys)."""
    phase: str
    rate_target_pods_per_s: float | None = measured("pods/s")
    pods_planned: int = measured("pods")
    pods_seen: int = measured("pods")
    pods_bound: int = measured("pods")
    pods_running: int = measured("pods")
    create_requests: int = measured("requests")
    create_failures: int = measured("requests")
    create_qps: float = measured("pods/s")
    create_latency_p50_s: float | None = measured("s")
    create_latency_p99_s: float | None = measured("s")
    responses_429: int = measured("responses")
    responses_5xx: int = measured("responses")
    locust_seconds: float = measured("s")
    pod_startup_p50_s: float | None = measured("s")
    pod_startup_p99_s: float | None = measured("s")
    pod_startup_server_p50_s: float | None = measured("s")
    pod_startup_server_p99_s: float | None = measured("s")
    watch_lag_created_p50_s: float | None = measured("s")
    watch_lag_created_p99_s: float | None = measured("s")
    watch_lag_running_p50_s: float | None = measured("s")
    watch_lag_running_p99_s: float | None = measured("s")
    created_to_bound_p99_s: float | None = measured("s")
    bound_to_running_p99_s: float | None = measured("s")
    scheduling_throughput_pods_per_s: float = measured("pods/s")
    # The apiserver's own histogram between two scrapes (None: the window's end came from another apiserver).
    create_latency_server_p50_s: float | None = measured("s")
    create_latency_server_p99_s: float | None = measured("s")
    create_requests_server: int = measured("requests")
    bind_latency_server_p50_s: float | None = measured("s")
    bind_latency_server_p99_s: float | None = measured("s")
    bind_requests_server: int = measured("requests")
    jobs: list[dict] = field(default_factory=list)
    # The phase's pods as the cluster lists them after it (``census``): missing, unplanned, by creator.
    pods_in_cluster: int = measured("pods", default=0)
    pods_missing_count: int = measured("pods", default=0)
    pods_missing: list[str] = field(default_factory=list)
    pods_unplanned: list[str] = field(default_factory=list)
    pods_by_creator: dict[str, int] = field(default_factory=dict)
    # A distributed phase's workers (``workers_figures``); empty and 0 with locust on this machine only.
    load_workers: list[dict] = field(default_factory=list)
    load_workers_lost: int = measured("workers", default=0)
    pods_completed_by_harness: int = measured("pods", default=0)
    pods_already_existed: int = measured("pods", default=0)
    harness_creates_refused: int = measured("pods", default=0)


@dataclass
class PhaseRun(measurement.Base):
    """One phase's load and what was measured (a measurement taken by ``run_phase``, which starts and ends its
    pod watch around the load: ``Base``'s start and dispose; ``gather()`` is the phase's figures)."""
    phase: Phase
    locust: LocustResult
    pods: list                     # clusterproof.kube.podtimeline.PodTimes
    incomplete: str | None         # why the wait for all pods Running ended early, if it did
    figures: PhaseFigures
    # Why the phase's figures are void, if they are: the API server restarted or the pod watch was cut
    # off during it (times seen late, creates refused, histograms reset). No check judges them then.
    interrupted: str | None = None
    # Pods on the real nodes during the phase (RealNodePods.finish), if the cluster has real nodes.
    real_nodes: RealNodeStartup | None = None

    @property
    def planned(self) -> int:
        return self.phase.pods

    def gather(self) -> list[measurement.Figure]:
        return self.figures.gather()


@dataclass(frozen=True)
class Phases:
    """The suite's two phases, measured (``clusterproof.fixtures.burst``)."""
    steady: PhaseRun
    burst: PhaseRun


def schedulable_shared_nodes(api, profile) -> int:
    nodes = list_raw(api, "/api/v1/nodes", {"labelSelector": f"{profile.pool_label}=shared"},
                     timeout=300)["items"]
    return sum(1 for n in nodes if not n.get("spec", {}).get("unschedulable"))


def scheduler_state(api) -> str:
    """What the kube-scheduler's leader lease says (a stopped scheduler stops renewing it)."""
    try:
        lease = get_if_present(api, "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kube-scheduler")
    except client.ApiException as e:
        return f"cannot read the kube-scheduler lease ({e.status})"
    if lease is None:
        return "there is no kube-scheduler leader lease in kube-system: is a scheduler running?"
    renew = lease.get("spec", {}).get("renewTime")
    if not renew:
        return "the kube-scheduler lease has never been renewed: is the scheduler running?"
    t = parse_time(renew)
    if t is None:
        return f"the kube-scheduler lease's renewTime {renew!r} is not a time"
    age = (dt.datetime.now(dt.timezone.utc) - t).total_seconds()
    duration = lease["spec"].get("leaseDurationSeconds", 15)
    verdict = ("is the scheduler running?" if age > duration
               else "the scheduler is alive (if pods stay unbound: its client QPS, the pods' events)")
    return f"kube-scheduler lease last renewed {age:.0f} s ago (duration {duration} s): {verdict}"


def create_window_rate(pods) -> float:
    """Pods per second between the first and the last pod seen created on the watch."""
    added = [p.added for p in pods]
    if len(added) < 2 or max(added) == min(added):
        return 0.0
    return (len(added) - 1) / (max(added) - min(added))


CREATE = ("POST", "", "pods", "", "resource")            # apimetrics key: verb, group, resource, sub, scope
BIND = ("POST", "", "pods", "binding", "resource")


def server_latency(key: tuple, before: str, after: str | None) -> tuple[float | None, float | None, int]:
    """p50, p99 and the count of one (verb, resource) pair by the apiserver's own histogram between two scrapes.

    The Kubernetes API-call SLO is defined on this histogram; next to locust's
    client-side figure it shows how much of a create's latency was spent in
    the generator (its event loop, its share of this machine's CPU).
    """
    # None: the window's end came from another apiserver (a restart): no figure rather than a wrong one.
    b = apimetrics.delta(apimetrics.histograms(after), apimetrics.histograms(before)).get(key) if after else None
    return (round(histogram_quantile(0.50, b), 3) if b else None, round(histogram_quantile(0.99, b), 3) if b else None,
            int(b[float("inf")]) if b else 0)


def _p(values: list[float], q: float) -> float | None:
    return round(percentile(values, q), 3) if values else None


def phase_figures(phase: Phase, result: LocustResult, pods, create_server: tuple, bind_server: tuple,
                  census: dict, workers: dict) -> PhaseFigures:
    """The phase's figures; ``*_server``: ``server_latency``'s, ``census``: ``census``'s, ``workers``:
    ``workers_figures``'."""
    create = result.stats.get("create pod")
    startup = [p.startup_s for p in pods if p.startup_s is not None]
    startup_server = [p.startup_server_s for p in pods if p.startup_server_s is not None]
    lag_created = [p.watch_lag_created_s for p in pods if p.watch_lag_created_s is not None]
    lag_running = [p.watch_lag_running_s for p in pods if p.watch_lag_running_s is not None]
    # Where startup time goes: waiting for the scheduler, then the (simulated) kubelet.
    to_bind = [p.bound - p.added for p in pods if p.bound is not None]
    to_run = [p.running - p.bound for p in pods if p.running is not None and p.bound is not None]
    return PhaseFigures(
        phase=phase.name, rate_target_pods_per_s=phase.rate or None,
        pods_planned=phase.pods, pods_seen=len(pods),
        pods_bound=sum(p.bound is not None for p in pods),
        pods_running=len(startup),
        create_requests=create.requests if create else 0,
        create_failures=create.failures if create else 0,
        create_qps=round(create_window_rate(pods), 1),
        create_latency_p50_s=create.p50_s if create else None,
        create_latency_p99_s=create.p99_s if create else None,
        responses_429=result.count_failures("429"),
        responses_5xx=result.count_failures("5"),
        locust_seconds=round(result.seconds, 2),
        pod_startup_p50_s=_p(startup, 50), pod_startup_p99_s=_p(startup, 99),
        pod_startup_server_p50_s=_p(startup_server, 50), pod_startup_server_p99_s=_p(startup_server, 99),
        watch_lag_created_p50_s=_p(lag_created, 50), watch_lag_created_p99_s=_p(lag_created, 99),
        watch_lag_running_p50_s=_p(lag_running, 50), watch_lag_running_p99_s=_p(lag_running, 99),
        created_to_bound_p99_s=_p(to_bind, 99), bound_to_running_p99_s=_p(to_run, 99),
        scheduling_throughput_pods_per_s=round(scheduling_throughput(pods), 1),
        create_latency_server_p50_s=create_server[0], create_latency_server_p99_s=create_server[1],
        create_requests_server=create_server[2],
        bind_latency_server_p50_s=bind_server[0], bind_latency_server_p99_s=bind_server[1],
        bind_requests_server=bind_server[2],
        jobs=[asdict(j) for j in job_times(pods)],
        **census, **workers)


def complete_lost_shares(api, profile, phase: Phase, namespace: str, run_id: str, result: LocustResult,
                         workers: int) -> dict:
    """What the lost workers of a distributed phase left undone, created by the harness (labelled ``harness``).

    Only a lost worker's share is completed: a pod missing from a share whose worker finished is a
    refused or lost create, for the checks to find. A 409 is a pod that exists already (the lost
    worker made it, its answer unreported): counted, never a second pod.
    """
    lost = result.lost
    if not lost:
        return {}
    selector = f"{RUN_LABEL}={run_id},{PHASE_LABEL}={phase.name}"
    existing = set(list_pods(api, namespace, selector))
    todo = [(job, i) for w in lost for job, i in phase.share(workers, int(w.get("index", -1)))
            if pod_name(job, i) not in existing]
    shared = {profile.pool_label: "shared"}
    bodies = [rank_pod(phase.name, job, i, run_id, profile.node_gpus, shared, HARNESS) for job, i in todo]

    def create(body: dict) -> str:
        made, err = try_create(api, namespace, body)
        return "created" if made is not None else ("existed" if err is not None and err.status == 409
                                                   else f"refused {err.status if err is not None else '?'}")
    for w in lost:
        progress.logger(__name__).warning(
            lost_line(w, f"pod creates ({len(phase.share(workers, int(w.get('index', -1))))} in its share)"))
    with step(f"{phase.name} phase: the harness creates the {len(bodies)} pods the lost workers left"):
        with ThreadPoolExecutor(max_workers=min(16, max(1, len(bodies)))) as pool:
            outcomes = list(pool.map(create, bodies))
    return {"lost_workers": [f"{w.get('name')} (index {w.get('index')})" for w in lost],
            "completed_by_harness": outcomes.count("created"), "already_existed": outcomes.count("existed"),
            "refused": len(outcomes) - outcomes.count("created") - outcomes.count("existed")}


def census(api, phase: Phase, namespace: str, run_id: str) -> dict:
    """The phase's pods as the cluster lists them: each planned name once (names are unique), none else,
    and who created them (``CREATOR_LABEL``) -- the split among workers, by the objects themselves."""
    pods = list_pods(api, namespace, f"{RUN_LABEL}={run_id},{PHASE_LABEL}={phase.name}")
    planned = set(phase.pod_names())
    by: dict[str, int] = {}
    for p in pods.values():
        who = (p["metadata"].get("labels") or {}).get(CREATOR_LABEL, "?")
        by[who] = by.get(who, 0) + 1
    return {"pods_in_cluster": len(pods), "pods_missing": sorted(planned - set(pods))[:20],
            "pods_missing_count": len(planned - set(pods)), "pods_unplanned": sorted(set(pods) - planned)[:20],
            "pods_by_creator": dict(sorted(by.items()))}


def run_phase(api, profile, phase: Phase, namespace: str, run_id: str, workdir: Path, real=None,
              kwok=None) -> PhaseRun:
    """Identity, watch, locust, wait (bounded twice: overall and on stalls), figures. ``real``: the cluster's
    real nodes (clusterproof.cluster.realnodes.Joined), given pods of their own during a paced phase; ``kwok``: the
    embedded cluster (its real nodes' processes, watched for restarts)."""
    ident = create_load_identity(api, namespace, run_id, workdir / "identity")
    timeline = PodTimeline(api, namespace, f"{RUN_LABEL}={run_id},{PHASE_LABEL}={phase.name}").start()
    incomplete = None
    before = apimetrics.scrape(api)
    probe = (RealNodePods(api, namespace, run_id, real, REAL_PODS_PER_NODE, phase.pods / phase.rate, kwok)
             if real is not None and phase.rate else None)
    if probe is not None:
        probe.start()
    rate = f"at {phase.rate:g} pods/s" if phase.rate else "as fast as they can"
    master = Master.of(profile, profile.burst_locust_workers, profile.burst_locust_worker_names)
    where = f" on {master.workers} remote locust workers" if master else ""
    completion: dict = {}
    try:
        with step(f"{phase.name} phase: {profile.burst_users} locust users{where} create {phase.pods} pods {rate}"):
            result = run_locust("load/burst.py", api.configuration.host, profile.burst_users,
                                locust_args(phase, profile, namespace, run_id, ident), workdir / f"locust-{phase.name}",
                                timeout_s=profile.burst_timeout_s, processes=profile.burst_locust_processes,
                                status=lambda: ", ".join(f"{v} {k}" for k, v in timeline.counts().items()),
                                master=master)
        if master is not None:
            completion = complete_lost_shares(api, profile, phase, namespace, run_id, result, master.workers)
        # Both ends of a window from the same apiserver (None: the one that answered before is gone).
        after_creates = apimetrics.scrape_same_replica(api, before)
        try:
            with step(f"{phase.name} phase: wait until all {phase.pods} pods are Running"):
                timeline.wait_running(phase.pods, timeout=profile.burst_timeout_s,
                                      stall_timeout=profile.burst_stall_timeout_s)
        except WaitTimeout as e:
            incomplete = f"{e}; {scheduler_state(api)}"
        except InformerError as e:    # the pod watch gave up: its outage is named below
            incomplete = str(e)
    finally:
        timeline.stop()
        real_pods = probe.finish(profile.burst_timeout_s) if probe is not None else None
    counted = census(api, phase, namespace, run_id)
    pods = timeline.snapshot()
    after = apimetrics.scrape_same_replica(api, before)
    # Creates end with locust; binds go on until every pod is bound.
    create_server, bind_server = server_latency(CREATE, before, after_creates), server_latency(BIND, before, after)
    cuts = timeline.interruptions()
    if after_creates is None or after is None:
        cuts.insert(0, apimetrics.restart_note(api, before))
    interrupted = (f"{'; '.join(cuts)} during the {phase.name} phase: its figures are void (creates refused, "
                   "times seen late, the apiserver's histograms reset), so no check judges them; why the API "
                   "server went away is the control-plane guard's finding") if cuts else None
    figures = phase_figures(phase, result, pods, create_server, bind_server, counted,
                            workers_figures(result, completion))
    return PhaseRun(phase, result, pods, incomplete, figures, interrupted, real_pods)


def workers_figures(result: LocustResult, completion: dict) -> dict:
    """The distributed phase's workers: who joined, what each reported, who was lost, what the harness did."""
    if not result.workers:
        return {}
    return {"load_workers": [{"name": w.get("name"), "index": w.get("index"), "address": w.get("address"),
                              "state": w.get("state"), "lost_s": w.get("lost_s"),
                              "creates_reported": (w.get("reported", {}).get("create pod", {}).get("requests", 0)
                                                   - w.get("reported", {}).get("create pod", {}).get("failures", 0))}
                             for w in result.workers],
            "load_workers_lost": len(result.lost),
            "pods_completed_by_harness": completion.get("completed_by_harness", 0),
            "pods_already_existed": completion.get("already_existed", 0),
            "harness_creates_refused": completion.get("refused", 0)}


def clear_phase(api, namespace: str, run_id: str, phase: Phase, timeout: float = 300) -> None:
    """Delete a phase's pods and wait until they are gone, so the next phase finds its nodes free."""
    with step(f"{phase.name} phase: delete its pods"):
        delete_selected(api, namespace, f"{RUN_LABEL}={run_id},{PHASE_LABEL}={phase.name}", timeout,
                        f"the {phase.name} phase's pods gone")


def oversized(phases: list[Phase], free: int, profile) -> str | None:
    """Why the phases cannot run on the schedulable shared nodes (whole-node pods), or None."""
    for phase in phases:
        if phase.pods > free:
            return (f"the {phase.name} phase ({phase.pods} whole-node pods) is larger than the {free} "
                    f"schedulable nodes labelled {profile.pool_label}=shared: lower its size")
    return None


def attachments(run: PhaseRun) -> list[Attachment]:
    """A phase's figures, locust statistics, locust workers and pod timeline, for the check's own page (its
    plot beside them: ``latency_plot``)."""
    name = run.phase.name
    out = [Attachment(f"{name} phase: figures", json.dumps(run.figures.to_dict(), indent=2), JSON),
           Attachment.file(run.locust.stats_csv, f"{name} phase: locust stats (client side)", CSV)]
    if run.locust.workers:
        lost = f", {len(run.locust.lost)} LOST" if run.locust.lost else ""
        out.append(Attachment(f"{name} phase: locust workers ({len(run.locust.workers)} joined{lost})",
                              json.dumps(run.locust.workers, indent=2), JSON))
    out.append(Attachment(f"{name} phase: pod timeline (s since the first pod was seen)", dump(run.pods)))
    return out


def latency_plot(profile, run: PhaseRun) -> Plot:
    """Per pod: startup by the objects' timestamps and by the watch, and the time to be bound."""
    pods = run.pods
    t0 = min((p.added for p in pods), default=0.0)
    rate = f" at {run.phase.rate:g} pods/s" if run.phase.rate else " (as fast as the users can create)"
    return Plot(
        title=f"{run.phase.name} phase{rate}: pod startup latency per pod",
        xlabel="pod created, seconds after the phase's first pod", ylabel="latency (s)",
        series=[Series("created -> Ready (object timestamps, 1 s resolution)",
                       [(p.added - t0, p.startup_server_s) for p in pods if p.startup_server_s is not None]),
                Series("created -> Running (as the watch saw it)",
                       [(p.added - t0, p.startup_s) for p in pods if p.startup_s is not None]),
                Series("created -> bound (as the watch saw it)",
                       [(p.added - t0, p.bound - p.added) for p in pods if p.bound is not None])],
        # The startup SLO is checked in the steady phase only: a burst is held to completeness and bind rate.
        thresholds=({f"pod startup SLO (p99 <= {profile.slo_pod_startup_p99_s:g} s)": profile.slo_pod_startup_p99_s}
                    if run.phase.rate else {}))
