"""Node-join storm: hundreds of nodes registering at once, as kubelets would, measured (for the join
checks of suites/test_api_overload.py, through ``clusterproof.fixtures.apf``, and clusterproof/bench/apf.py).

Why: the seed cluster learned that hundreds of nodes joining at once can
overload the API servers. Each joining node here registers itself the way a
kubelet does -- ``POST /api/v1/nodes`` as ``system:node:<name>`` in group
``system:nodes`` (impersonated by the harness), so API Priority and Fairness
classifies the joins exactly like a real kubelet's; the response headers
(``X-Kubernetes-PF-FlowSchema-UID``) show where each one went. The kwok
controller then takes each node over and heartbeats for it (as group
``system:nodes``, ``clusterproof.cluster.identities``). Two ways of joining the same
number of nodes are compared:

- ``storm``: all at once (``apf_join_concurrency`` registrations in flight);
- ``paced``: at ``apf_join_rate`` nodes/s.

Measured for each: per-flow rejections (the apiserver's counters), 5xx, the
join requests' latency and classification, a well-behaved client's latency
in another flow, the time until every joined node is Ready, and whether any
existing node turned NotReady. Joined nodes carry the run label and
``clusterproof.io/scratch=<tag>`` (label and NoSchedule taint: no workload
lands on them; an interrupted run's are swept) and are deleted after each
mode.
"""
from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kubernetes import client

from clusterproof.apf import flood as fm
from clusterproof.cluster.apiguard import server_errors
from clusterproof.cluster.node_plan import kubelet_labels, node_capacity
from clusterproof.cluster.nodes import ReadyTracker
from clusterproof.core import measurement
from clusterproof.core.measurement import measured
from clusterproof.core.progress import phase
from clusterproof.core.run import SCRATCH_LABEL, metadata
from clusterproof.core.stats import percentile
from clusterproof.core.waiting import wait_for
from clusterproof.kube import flowcontrol as apf
from clusterproof.kube.client import KWOK_ANNOTATION, delete_each, list_raw, raw_request
from clusterproof.kube.informer import Informer
from clusterproof.kube.tokens import create_load_identity

MODES = ("paced", "storm")


def join_body(profile, run_id: str, name: str, tag: str) -> dict:
    meta = metadata(name, run_id, {**kubelet_labels(name), "type": "kwok", SCRATCH_LABEL: tag})
    meta["annotations"][KWOK_ANNOTATION] = "fake"
    cap = node_capacity(profile)
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta,
            "spec": {"taints": [{"key": SCRATCH_LABEL, "value": tag, "effect": "NoSchedule"}]},
            "status": {"capacity": cap, "allocatable": cap}}


@dataclass
class Join:
    name: str
    t: float
    latency_s: float            # of the last attempt
    status: int                 # of the last attempt (201: registered)
    fs_uid: str
    pl_uid: str
    rejected: int = 0           # 429s before it got through (a kubelet retries after Retry-After)


def register(api: client.ApiClient, body: dict, attempts: int = 10) -> Join:
    """One node registers itself, as its kubelet would (impersonated ``system:node:<name>``), retrying a 429
    after its Retry-After as client-go does."""
    name = body["metadata"]["name"]
    headers = {"Accept": "application/json", "Impersonate-User": f"system:node:{name}",
               "Impersonate-Group": "system:nodes"}
    t, rejected = time.monotonic(), 0
    for _ in range(attempts):
        t1 = time.monotonic()
        try:
            resp = raw_request(api, "POST", "/api/v1/nodes", headers=headers, body=body, retry_s=0)  # timed
            resp.data
            h, status = resp.headers, resp.status
        except client.ApiException as e:
            h, status = e.headers or {}, e.status or 0
        except Exception:
            h, status = {}, 0
        if status != 429:
            break
        rejected += 1
        time.sleep(min(32.0, float(h.get("Retry-After") or 1)))   # the server's own back-off
    return Join(name, t, time.monotonic() - t1, status, h.get(apf.FS_UID_HEADER, ""), h.get(apf.PL_UID_HEADER, ""),
                rejected)


@dataclass
class JoinFigures(measurement.Typed):
    """A join's figures: the joins' answers and latency, the time to all Ready (and schedulable), what the
    apiserver rejected and failed meanwhile, the well-behaved client's latency, the existing nodes that flapped."""
    mode: str
    nodes: int = measured("nodes")
    registered: int = measured("nodes")
    join_429: int = measured("responses")
    join_given_up: int = measured("nodes")
    join_5xx: int = measured("responses")
    join_no_response: int = measured("requests")
    join_latency_p50_s: float | None = measured("s")
    join_latency_p99_s: float | None = measured("s")
    seconds_to_register_all: float = measured("s")
    seconds_to_all_ready: float | None = measured("s")
    seconds_to_all_schedulable: float | None = measured("s")
    rejected_by_flow: dict[str, int] = field(default_factory=dict)
    apiserver_5xx: dict[str, int] = field(default_factory=dict)
    well_behaved_client: fm.Latency | None = None
    existing_nodes_not_ready: list[str] = field(default_factory=list)
    join_classification: dict[str, int] = field(default_factory=dict)


@dataclass
class JoinRun(measurement.Base):
    """One mode's join, measured by ``join`` (which starts and ends its node informer around the load:
    ``Base``'s start and dispose); ``figures()`` is what the checks read, ``gather()`` the same as figures."""
    mode: str
    nodes: int
    joins: list[Join]
    seconds_to_register: float
    seconds_to_ready: float | None          # first registration -> every joined node Ready=True
    seconds_to_schedulable: float | None    # ... and free of the not-ready taint
    tracker: str
    rejected: dict[tuple[str, str, str], float]
    server_errors: dict[tuple, float]
    probe: fm.Latency                       # the well-behaved client's figures during the join
    flapped: list[str]                      # existing nodes NotReady (or flapping) since the join started
    classified: dict[str, int] = field(default_factory=dict)   # "flowschemas/x -> prioritylevelconfigurations/y": n

    def figures(self) -> JoinFigures:
        lat = [j.latency_s for j in self.joins if j.status]
        return JoinFigures(
            mode=self.mode, nodes=self.nodes,
            registered=sum(j.status == 201 for j in self.joins),
            join_429=sum(j.rejected for j in self.joins),
            join_given_up=sum(j.status == 429 for j in self.joins),
            join_5xx=sum(j.status >= 500 for j in self.joins),
            join_no_response=sum(j.status == 0 for j in self.joins),
            join_latency_p50_s=round(percentile(lat, 50), 3) if lat else None,
            join_latency_p99_s=round(percentile(lat, 99), 3) if lat else None,
            seconds_to_register_all=round(self.seconds_to_register, 2),
            seconds_to_all_ready=None if self.seconds_to_ready is None else round(self.seconds_to_ready, 2),
            seconds_to_all_schedulable=(None if self.seconds_to_schedulable is None
                                        else round(self.seconds_to_schedulable, 2)),
            rejected_by_flow={f"{fs} -> {pl} ({r})": int(v) for (fs, pl, r), v in self.rejected.items()},
            apiserver_5xx={"/".join(k): int(v) for k, v in self.server_errors.items()},
            well_behaved_client=self.probe, existing_nodes_not_ready=self.flapped,
            join_classification=self.classified)

    def gather(self) -> list[measurement.Figure]:
        return self.figures().gather()


def join(api: client.ApiClient, profile, run_id: str, mode: str, prober: fm.WellBehaved, timeout: float) -> JoinRun:
    """Register ``apf_join_nodes`` nodes in ``mode``, follow them to Ready, measure, then delete them."""
    import datetime as dt
    tag = f"{run_id[-4:]}-{mode}-{os.urandom(2).hex()}"
    n = profile.apf_join_nodes
    bodies = [join_body(profile, run_id, f"{profile.node_name_prefix}-join-{tag}-{i:05d}", tag) for i in range(n)]
    tracker = ReadyTracker(n)
    informer = Informer(api, "/api/v1/nodes", {"labelSelector": f"{SCRATCH_LABEL}={tag}"}, tracker.apply, chunk_s=5)
    informer.start(30)
    before, wall = apf.scrape(api), dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    t0 = time.monotonic()
    try:
        workers = profile.apf_join_concurrency if mode == "storm" else max(4, int(profile.apf_join_rate))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            if mode == "storm":
                joins = list(pool.map(lambda b: register(api, b), bodies))
            else:
                futures = []
                for i, b in enumerate(bodies):
                    # Pacing the submissions (the load's schedule, not a synchronisation).
                    time.sleep(max(0.0, t0 + i / profile.apf_join_rate - time.monotonic()))
                    futures.append(pool.submit(register, api, b))
                joins = [f.result() for f in futures]
        registered = time.monotonic() - t0
        try:
            # Ready=True is the kubelets' (kwok's) part; lifting the not-ready taint is kube-controller-
            # manager's, rate-limited, and reported if it happened meanwhile.
            wait_for(lambda: (informer.check(), tracker.all_condition_at)[1], timeout=timeout, interval=0.5,
                     what=f"all {n} joined nodes Ready ({mode})", describe=lambda _: str(tracker))
        except AssertionError:
            pass                       # the check reports how far they got
        t_sched = time.monotonic() - t0 if tracker.done() else None
        t_ready = (tracker.all_condition_at - t0) if tracker.all_condition_at else None
        after = apf.scrape(api)
        t1 = time.monotonic()
        probe = fm.latency_figures(fm.window(prober.snapshot(), t0, t1))
        existing = [x for x in fm.not_ready_since(api, wall) if f"-join-{tag}-" not in x]
    finally:
        informer.stop()
        remove_joined(api, tag)
    uids = apf.read_config(api).by_uid()
    classified: dict[str, int] = {}
    for j in joins:
        key = f"{uids.get(j.fs_uid, j.fs_uid or 'none')} -> {uids.get(j.pl_uid, j.pl_uid or 'none')}"
        classified[key] = classified.get(key, 0) + 1
    return JoinRun(mode, n, joins, registered, t_ready, t_sched, str(tracker),
                   apf.delta(apf.rejected(after), apf.rejected(before)), server_errors(before, after), probe,
                   existing, classified)


def remove_joined(api: client.ApiClient, tag: str, timeout: float = 300) -> None:
    """Delete the joined nodes (one request each: ``kube.delete_each``) and wait until they are gone."""
    sel = f"{SCRATCH_LABEL}={tag}"
    delete_each(api, [f"/api/v1/nodes/{n['metadata']['name']}"
                      for n in list_raw(api, "/api/v1/nodes", {"labelSelector": sel})["items"]])
    wait_for(lambda: len(list_raw(api, "/api/v1/nodes", {"labelSelector": sel})["items"]), until=lambda c: c == 0,
             timeout=timeout, interval=1, what=f"joined nodes {sel} gone")


def join_both(api: client.ApiClient, profile, run_id: str, work, say, namespaces) -> dict[str, JoinRun]:
    """Both join modes, paced first, each with the well-behaved client running; nodes deleted after each
    (the suite's fixture and clusterproof/bench/apf.py). ``namespaces``: the cluster's namespace source."""
    ns = namespaces.take("join")
    try:
        ident = create_load_identity(api, ns, run_id, work / "identity")
        prober = fm.WellBehaved(fm.token_client(api, ident.token_file), ns, run_id, profile.apf_probe_rate)
        prober.start()
        out = {}
        try:
            for mode in MODES:
                say(f"api overload: {profile.apf_join_nodes} nodes join ({mode}"
                    + (f", {profile.apf_join_rate:g} nodes/s)" if mode == "paced" else ", all at once)"))
                with phase(f"api overload: {profile.apf_join_nodes} nodes join, {mode}"):
                    out[mode] = join(api, profile, run_id, mode, prober, profile.apf_join_timeout_s)
        finally:
            prober.stop()
        return out
    finally:
        namespaces.give_back(ns)


def comparison(runs: dict[str, JoinRun]) -> str:
    """The two modes side by side (an attachment)."""
    figs = {m: r.figures().to_dict() for m, r in runs.items()}
    return json.dumps(figs, indent=2, default=str)
