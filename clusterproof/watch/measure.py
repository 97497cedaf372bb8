"""The watch-bandwidth measurement: watchers started from a LIST, churn at a set rate, counts on both sides.

Shared by suites/test_watch_bandwidth.py (the ``watch_bandwidth`` fixture of
``clusterproof.fixtures.watch``) and clusterproof/bench/watch_bandwidth.py, so the
checks and the benchmark read the same numbers. For each size of the Service (``watch_sizes``):

1. the per-node Service (``clusterproof.watch.pernode_service``) grows to the size and
   settles (its slices and Endpoints show exactly its pods);
2. one LIST per API gives the resourceVersion every watcher starts from
   (as kube-proxy does); ``watch_watchers`` watchers per API and encoding
   open (``clusterproof.watch.watchers``: one asyncio loop);
3. mark + scrape the apiserver's ``/metrics``; churn ``watch_churn`` steps at
   ``watch_churn_rate``; wait until slices and Endpoints settle and every
   watcher has caught up with the final LIST; mark + scrape again;
4. figures per group (``clusterproof.watch.analysis``) and the agreement of the
   harness's byte count with ``apiserver_watch_events_sizes``.

Read-only mode (``watch_service: <namespace>/<name>``): the same, on an
existing Service, with a ``watch_window_s`` window instead of churn --
nothing is created or changed.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from clusterproof.cluster.realnode_config import REAL_NODE_LABEL
from clusterproof.core import measurement
from clusterproof.core.errors import HarnessError
from clusterproof.core.progress import heartbeat, phase
from clusterproof.core.run import SCRATCH_LABEL
from clusterproof.core.stats import percentile
from clusterproof.core.waiting import wait_for
from clusterproof.kube import apimetrics
from clusterproof.kube.client import get_if_present, list_all, list_raw, server_url
from clusterproof.kube.pod_spec import tolerating
from clusterproof.kube.pods import delete_run_pods
from clusterproof.watch import analysis as wa
from clusterproof.watch.pernode_service import KUBE_PROXY_SELECTOR, SERVICE_NAME_LABEL, PerNodeService, churn_plan
from clusterproof.watch.watchers import Spec, WatchPool, older
from clusterproof.watch.wire import ENCODINGS, PROTOBUF, endpoints_of, metric_size

SLICES, ENDPOINTS = "endpointslices", "endpoints"
APIS = (SLICES, ENDPOINTS)
METRIC_LABELS = {SLICES: ("discovery.k8s.io", "v1", "endpointslices"), ENDPOINTS: ("", "v1", "endpoints")}
SIZES_METRIC, WATCHERS_METRIC = "apiserver_watch_events_sizes", "apiserver_longrunning_requests"


@dataclass(frozen=True)
class Target:
    namespace: str
    name: str
    created: bool              # the run's own Service (churned) or an existing one (read-only)


@dataclass
class SizeRun:
    """One size of the Service: what was done, and what every group of watchers got."""
    size: int
    mode: str                                  # "churn" or "read-only"
    churn_steps: int = 0
    churn_changes: int = 0
    churn_seconds: float = 0.0
    window_s: float = 0.0
    settle_s: float = 0.0
    groups: dict[str, wa.GroupFigures] = field(default_factory=dict)
    agreements: dict[str, wa.Agreement] = field(default_factory=dict)
    endpoints_annotations: dict = field(default_factory=dict)
    endpoints_addresses: int = 0
    slice_sizes: list[int] = field(default_factory=list)
    replica_changed: bool = False

    def group(self, api: str, encoding: str) -> wa.GroupFigures:
        return self.groups[f"{api}/{encoding}"]


@dataclass
class WatchRun(measurement.Base):
    """The watch-bandwidth measurement at every size (``run_all`` starts and stops its watchers around each
    size's churn: ``Base``'s start and dispose); ``gather()`` is what each group of watchers received."""
    target: Target
    nodes: int                                 # nodes of the cluster (the projection's watchers)
    pool_nodes: int
    sizes: list[SizeRun] = field(default_factory=list)
    pods_created: int = 0                      # growing the Service (churn pods not counted)
    create_s: float = 0.0                      # the creates alone
    grow_s: float = 0.0                        # creates until slices and Endpoints show every pod
    deleted: int = 0
    delete_s: float = 0.0
    error: str | None = None                   # why the measurement stopped early

    def gather(self) -> list[measurement.Figure]:
        """Per size and group of watchers (an API, an encoding): bytes per watcher and per endpoint change, the
        fullest and largest event, the watchers lost; per API, how far the harness's count is from the apiserver's."""
        f, out = measurement.figure, []
        for s in self.sizes:
            at = f"{s.size or sum(s.slice_sizes)} endpoints"
            for g in s.groups.values():
                on = f"{g.name}, {at}"
                out += [f(f"bytes per watcher, {on}", g.bytes_per_watcher, "B"),
                        f(f"bytes per endpoint change per watcher, {on}", g.bytes_per_change, "B"),
                        f(f"most endpoints in one event, {on}", g.max_endpoints, "endpoints"),
                        f(f"largest event, {on}", g.largest_event, "B"),
                        f(f"watchers closed early, {on}", len(g.dropped), "watchers")]
            out += [f(f"{api} watch bytes, harness vs apiserver, {at}", a.relative_difference, "relative difference")
                    for api, a in s.agreements.items()]
        return out


# --- the apiserver's side ---------------------------------------------------------------------

def watch_metrics(text: str) -> dict[str, tuple[float, float, float]]:
    """Per API: (events, bytes) from ``apiserver_watch_events_sizes`` and the WATCH requests in flight."""
    out = {api: [0.0, 0.0, 0.0] for api in APIS}
    by_labels = {v: k for k, v in METRIC_LABELS.items()}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            lb = s.labels
            api = by_labels.get((lb.get("group", ""), lb.get("version", ""), lb.get("resource", "")))
            if api is None:
                continue
            if s.name == SIZES_METRIC + "_count":
                out[api][0] += s.value
            elif s.name == SIZES_METRIC + "_sum":
                out[api][1] += s.value
            elif s.name == WATCHERS_METRIC and lb.get("verb") == "WATCH" and not lb.get("subresource"):
                out[api][2] += s.value
    return {k: tuple(v) for k, v in out.items()}


def scrape(api: client.ApiClient) -> str:
    return apimetrics.scrape(api, (SIZES_METRIC, WATCHERS_METRIC))


# --- watchers -------------------------------------------------------------------------------------

def watch_paths(target: Target, slice_resource: str) -> dict[str, tuple[str, dict]]:
    """Per API: the path and query of its watchers.

    Slices as kube-proxy watches them (cluster-wide, its label selector); in
    read-only mode only the named Service's (a shared cluster's other
    Services are not ours to measure). Endpoints: the Service's object.
    ``slice_resource=endpoints`` is the negative control: the kube-proxy-like
    watchers are fed the Endpoints object.
    """
    endpoints = (f"/api/v1/namespaces/{target.namespace}/endpoints", {"fieldSelector": f"metadata.name={target.name}"})
    if slice_resource == ENDPOINTS:
        slices = endpoints
    elif target.created:
        slices = ("/apis/discovery.k8s.io/v1/endpointslices", {"labelSelector": KUBE_PROXY_SELECTOR})
    else:
        slices = (f"/apis/discovery.k8s.io/v1/namespaces/{target.namespace}/endpointslices",
                  {"labelSelector": f"{KUBE_PROXY_SELECTOR},{SERVICE_NAME_LABEL}={target.name}"})
    return {SLICES: slices, ENDPOINTS: endpoints}


def listing(api: client.ApiClient, path: str, query: dict) -> tuple[str, dict[str, str], dict[str, tuple]]:
    """(resourceVersion, key -> resourceVersion, key -> endpoints) of one LIST."""
    data = list_raw(api, path, query)
    items = data.get("items", [])
    key = lambda o: f"{o['metadata'].get('namespace', '')}/{o['metadata']['name']}"  # noqa: E731
    return (data["metadata"]["resourceVersion"], {key(o): o["metadata"]["resourceVersion"] for o in items},
            {key(o): endpoints_of(o)[0] for o in items})


# --- one size -----------------------------------------------------------------------------------

def measure(api: client.ApiClient, profile, target: Target, svc: PerNodeService | None, size: int,
            say: Callable[[str], None]) -> SizeRun:
    """Watchers from a LIST, churn (or a read-only window), everyone caught up; then the figures."""
    run = SizeRun(size, "churn" if svc else "read-only")
    paths = watch_paths(target, profile.watch_slice_resource)
    lists = {a: listing(api, *paths[a]) for a in APIS}
    specs = [Spec(a, enc, paths[a][0], {**paths[a][1], "resourceVersion": lists[a][0]})
             for _ in range(profile.watch_watchers) for a in APIS for enc in ENCODINGS]
    budget_s = (profile.watch_churn / profile.watch_churn_rate + 2 * profile.watch_settle_timeout_s
                + profile.watch_window_s)
    pool = WatchPool(api, timeout_s=int(budget_s) + 300)
    try:
        watchers = pool.start(specs, view=lambda s: lists[s.api][1])
        before, metrics_before = pool.mark(), scrape(api)
        if svc is not None:
            churn(profile, svc, size, run)
        else:
            say(f"watching {target.namespace}/{target.name} read-only for {profile.watch_window_s} s")
            with heartbeat(f"the end of the read-only window on {target.namespace}/{target.name}",
                           timeout=profile.watch_window_s, status=lambda: f"{len(watchers)} watchers"):
                time.sleep(profile.watch_window_s)   # the measurement window itself
        finals = {a: listing(api, *paths[a]) for a in APIS}
        for a in APIS:
            wait_caught_up(pool, [w for w in watchers if w.spec.api == a], finals[a], profile.watch_settle_timeout_s,
                           f"every {a} watcher caught up with the final LIST at {size} endpoints")
        cut = [w for w in watchers if w.ended]
        # Streams cut, and the apiserver that answered before is gone: it restarted under the measurement.
        if cut and apimetrics.scrape_same_replica(api, metrics_before,
                                                  prefixes=(SIZES_METRIC, WATCHERS_METRIC)) is None:
            raise WatchInterrupted(
                f"{apimetrics.restart_note(api, metrics_before)} during the watch-bandwidth measurement at {size} "
                f"endpoints: {len(cut)} of {len(watchers)} watch streams were cut (e.g. {cut[0].ended}); its "
                "figures are void, so no check judges them")
        after, metrics_after = pool.mark(), scrape(api)
        run.window_s = after.at - before.at
    finally:
        pool.stop()
    for a in APIS:
        initial = {k: v for k, v in lists[a][2].items() if k.startswith(f"{target.namespace}/")}
        for enc in ENCODINGS:
            g = group_figures(profile, target, [w for w in watchers if w.spec.api == a and w.spec.encoding == enc],
                              initial, svc.touched if svc else None, before, after, finals[a][0])
            run.groups[g.name] = g
    run.agreements = agreements(profile, run, metrics_before, metrics_after)
    ep = get_if_present(api, f"/api/v1/namespaces/{target.namespace}/endpoints/{target.name}") or {}
    run.endpoints_annotations = dict(ep.get("metadata", {}).get("annotations") or {})
    run.endpoints_addresses = len(endpoints_of(ep)[0])
    run.slice_sizes = sorted((len(endpoints_of(s)[0]) for s in list_all(
        api, f"/apis/discovery.k8s.io/v1/namespaces/{target.namespace}/endpointslices",
        {"labelSelector": f"{SERVICE_NAME_LABEL}={target.name}"})), reverse=True)
    return run


class WatchInterrupted(RuntimeError):
    """The API server restarted during a measurement: every stream was cut, its figures are void (one line)."""


def wait_caught_up(pool, watchers: list, final: tuple, timeout: float, what: str) -> None:
    """Wait until every watcher whose stream still runs has seen the final LIST (``listing``'s tuple).

    A watcher whose stream ended (``Watcher.ended``) can never catch up: it
    is not waited for -- its drop is a finding of its own (``dropped``), or,
    if the API server restarted, the end of the measurement -- so a cut
    stream costs no settle timeout and no misleading "not caught up".
    """
    wait_for(lambda: pool.caught_up(final[1], final[0], [w for w in watchers if not w.ended]),
             until=lambda behind: not behind, timeout=timeout, interval=0.5, what=what)


def churn(profile, svc: PerNodeService, size: int, run: SizeRun) -> None:
    """``watch_churn`` steps at ``watch_churn_rate``, then wait until slices and Endpoints show the result."""
    t0 = time.monotonic()
    plan = churn_plan(profile.watch_churn, list(profile.watch_churn_kinds), size, len(svc.nodes))
    for i, step in enumerate(plan):
        # Pacing the load (not synchronisation): step i is due at i / rate.
        time.sleep(max(0.0, t0 + i / profile.watch_churn_rate - time.monotonic()))
        run.churn_changes += svc.apply(step, size)
    run.churn_steps, run.churn_seconds = len(plan), time.monotonic() - t0
    t1 = time.monotonic()
    wait_for(svc.differences, until=lambda d: not d, timeout=profile.watch_settle_timeout_s, interval=0.5,
             what=f"the Service's slices and Endpoints reflecting the churn at {size} endpoints")
    run.settle_s = time.monotonic() - t1


def group_figures(profile, target: Target, mine: list, initial: dict, touched: set | None,
                  before, after, final_rv: str) -> wa.GroupFigures:
    """One group's figures: its events up to the final LIST analysed (every watcher the same span,
    also if the Service kept changing), its window counted as the apiserver counts it."""
    a, enc = mine[0].spec.api, mine[0].spec.encoding
    own = [[e for _, e in w.events if e.namespace in ("", target.namespace)
            and (e.type == "BOOKMARK" or not older(final_rv, e.resource_version))] for w in mine]
    g = wa.analyze(a, enc, own, initial, touched, profile.watch_max_endpoints_per_slice)
    window = [[e for _, e in w.events[before.events[w.index]:after.events[w.index]]] for w in mine]
    g.metric_bytes = sum(metric_size(e.size, enc) for evs in window for e in evs)
    g.metric_events = sum(len(evs) for evs in window)
    g.metric_bytes_one_watcher = sum(metric_size(e.size, enc) for e in window[0] if e.type != "BOOKMARK")
    wires = [after.wire[w.index] - before.wire[w.index] for w in mine
             if after.wire[w.index] is not None and before.wire[w.index] is not None]
    g.wire_bytes_per_watcher = max(wires) if wires else None
    spread = wa.delivery_spread([w.events for w in mine])
    g.spread_p99_s = round(percentile(spread, 99), 4) if spread else None
    g.dropped = [f"watcher {w.index}: {w.ended}" for w in mine if w.ended]
    g.warnings = sorted({x for w in mine for x in w.warnings})
    g.warned = sum(1 for w in mine if any("deprecated" in x for x in w.warnings))
    return g


def agreements(profile, run: SizeRun, metrics_before: str, metrics_after: str) -> dict[str, wa.Agreement]:
    """Each API's count against the apiserver's metric of that API (of the other: the negative control)."""
    counted = {a: [g for g in run.groups.values() if g.api == a] for a in APIS}
    server_before, server_after = watch_metrics(metrics_before), watch_metrics(metrics_after)
    run.replica_changed = apimetrics.replica(metrics_before) != apimetrics.replica(metrics_after)
    out = {}
    for a in APIS:
        compared = a if profile.watch_metric_resource == "own" else next(x for x in APIS if x != a)
        b, e = server_before[compared], server_after[compared]
        out[a] = wa.agreement(compared, counted[a], (e[0] - b[0], e[1] - b[1], (b[2] + e[2]) / 2))
    return out


# --- the whole measurement ------------------------------------------------------------------------

def pool_nodes(api: client.ApiClient, profile) -> list[str]:
    """The nodes the per-node Service spreads over: the pool's (or every node), never a scratch or real node."""
    return sorted(n["metadata"]["name"] for n in _pool(api, profile))


def _pool(api: client.ApiClient, profile) -> list[dict]:
    query = {"labelSelector": f"{profile.pool_label}={profile.watch_pool}"} if profile.watch_pool else None
    # Neither scratch nodes nor the embedded cluster's real nodes (clusterproof.cluster.realnodes: real containers from
    # images built here; the per-node pods name an image only kwok never pulls).
    return [n for n in list_all(api, "/api/v1/nodes", query)
            if SCRATCH_LABEL not in (labels := n["metadata"].get("labels") or {})
            and labels.get(REAL_NODE_LABEL) != "real"]


def node_tolerations(nodes: list[dict]) -> dict[str, list[dict]]:
    """What each per-node pod tolerates: its own node's taints, each exactly (through the scheduler, a node's
    NoSchedule taints keep off a pod that does not tolerate them; its NoExecute ones evict it).

    Why not a blanket ``Exists`` (as a node-exporter DaemonSet has): a cluster whose admission refuses
    pods that tolerate other teams' taints refuses that too -- and may refuse even these in a namespace that
    is not a team's, which is why ``watch_pool`` names a pool the harness may use on such a cluster."""
    return {n["metadata"]["name"]: tolerating(n["spec"].get("taints")) for n in nodes}


def run_all(api: client.ApiClient, profile, target: Target, run_id: str, say: Callable[[str], None],
            at_largest: Callable[[PerNodeService], None] | None = None, owned: bool = False) -> WatchRun:
    """Every size of ``watch_sizes`` (churn) or the existing Service once (read-only); pods deleted at the end.

    ``at_largest``: called with the Service at its largest size before it is
    deleted (the benchmark's watcher-capacity sweep). ``owned``: the harness's own embedded cluster, where
    the per-node pods are bound by name (``PerNodeService.by_name``).
    """
    nodes = sum(1 for _ in list_all(api, "/api/v1/nodes"))
    if not target.created:
        run = WatchRun(target, nodes, nodes)
        with phase(f"watch bandwidth: {target.namespace}/{target.name}, read-only for {profile.watch_window_s:g} s"):
            run.sizes.append(measure(api, profile, target, None, 0, say))
        return run
    pool = _pool(api, profile)
    members = sorted(n["metadata"]["name"] for n in pool)
    run = WatchRun(target, nodes, len(members))
    svc = PerNodeService(api, target.namespace, run_id, members, target.name, profile.watch_create_concurrency,
                         tolerations=node_tolerations(pool), by_name=owned)
    svc.create()
    try:
        for size in profile.watch_sizes:
            say(f"watch bandwidth: growing the per-node Service to {size} endpoints on {len(members)} nodes")
            t, grown = time.monotonic(), size - svc.size
            with phase(f"watch bandwidth: grow the per-node Service to {size} endpoints"):
                svc.grow(size)
                run.pods_created, run.create_s = run.pods_created + grown, run.create_s + time.monotonic() - t
                wait_for(svc.differences, until=lambda d: not d, timeout=profile.watch_settle_timeout_s, interval=1,
                         what=f"the per-node Service's slices and Endpoints showing its {size} pods")
            run.grow_s += time.monotonic() - t
            with phase(f"watch bandwidth: measure {len(APIS) * len(ENCODINGS) * profile.watch_watchers} watch "
                       f"streams through churn at {size} endpoints"):
                s = measure(api, profile, target, svc, size, say)
            run.sizes.append(s)
            g = s.group(SLICES, PROTOBUF)
            say(f"  {size} endpoints: {s.churn_changes} changes in {s.churn_seconds:.1f} s; slices/protobuf "
                f"{g.bytes_per_change or 0:.0f} B per change per watcher, Endpoints/protobuf "
                f"{s.group(ENDPOINTS, PROTOBUF).bytes_per_change or 0:.0f} B")
        if at_largest is not None:
            at_largest(svc)
    finally:
        t = time.monotonic()
        with phase("watch bandwidth: delete the per-node Service and its pods"):
            run.deleted = svc.remove_all()
            delete_run_pods(api, target.namespace, run_id, timeout=max(300, run.deleted / 10))   # and wait: gone
        run.delete_s = time.monotonic() - t
    return run


# --- the target: the run's own per-node Service, or an existing one --------------------------------

def own_target(namespace: str) -> Target:
    """The run's own per-node Service, in a namespace of the run's (``cluster.namespaces.take``)."""
    return Target(namespace, "per-node", True)


def existing_target(profile) -> Target:
    ns, name = profile.watch_service.split("/", 1)
    return Target(ns, name, False)


def check_input(cluster, profile, target: Target | None) -> None:
    """Bad input for this cluster (``target``: an existing Service, or None for the run's own): raise
    ``HarnessError``, one line. Checked here, not when the profile loads: a small cluster for other
    suites must not trip on it."""
    api = cluster.api
    if profile.watch_kcm_max_endpoints_per_slice and cluster.kwok is None:
        raise HarnessError("watch_kcm_max_endpoints_per_slice configures the embedded cluster's "
                           "kube-controller-manager; an existing cluster keeps its own setting (drop --cp-kubeconfig "
                           "or the key)")
    if target is not None:
        if get_if_present(api, f"/api/v1/namespaces/{target.namespace}/services/{target.name}") is None:
            raise HarnessError(f"watch_service {profile.watch_service}: no such Service on "
                               f"{server_url(api)}; name an existing <namespace>/<service>")
        return
    members = len(pool_nodes(api, profile))
    if not members:
        raise HarnessError(f"watch_pool {profile.watch_pool!r}: no node on {server_url(api)} "
                           f"is labelled {profile.pool_label}={profile.watch_pool}")
    if profile.watch_sizes[-1] > members * profile.node_max_pods:
        raise HarnessError(f"watch_sizes asks for {profile.watch_sizes[-1]} endpoints, more than the {members} "
                           f"nodes of {profile.watch_pool or 'the cluster'} hold at "
                           f"node_max_pods={profile.node_max_pods}; lower watch_sizes")
