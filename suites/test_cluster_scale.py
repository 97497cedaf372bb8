"""The cluster is the size and shape the profile declares, and the API server
kept its latency SLO while it got there.

Every node of every pool must be registered and Ready, with the pool's GPU
capacity, labels and taints (a team node without its team taint would let
any pod onto a team's GPUs). Latency comes from the apiserver's own
histograms, over the bring-up window on the embedded cluster and since the
harness connected on an existing one (the report says which).
With more than one kube-apiserver, /metrics describes the replica that
answered: the window's two scrapes must come from the same one, and the
report says the figure is that replica's.
Negative control: tests/test_cluster_scale_controls.py breaks a cluster and
proves these tests fail, naming the node at fault.
"""
from __future__ import annotations

import allure
import pytest
from kubernetes.utils import parse_quantity

from clusterproof.cluster.node_plan import node_plan
from clusterproof.cluster.nodes import node_name
from clusterproof.core.texttable import text_table
from clusterproof.fixtures import PROFILE
from clusterproof.kube import apimetrics
from clusterproof.kube.client import list_raw
from clusterproof.kube.nodes import LIFECYCLE_TAINTS, is_ready

SHOW = 10  # offenders named in a failure message; the rest are counted


def pytest_generate_tests(metafunc):
    if "pool" in metafunc.fixturenames:
        plan = node_plan(metafunc.config.stash[PROFILE])
        metafunc.parametrize("pool", [pytest.param(p, id=p.name) for p in plan])


@pytest.fixture(scope="module")
def nodes_by_pool(cluster, profile) -> dict[str, list[dict]]:
    """Every node carrying the pool label, grouped by pool (one raw LIST)."""
    items = list_raw(cluster.api, "/api/v1/nodes", {"labelSelector": profile.pool_label},
                     timeout=300)["items"]
    out: dict[str, list[dict]] = {}
    for n in items:
        out.setdefault(n["metadata"]["labels"][profile.pool_label], []).append(n)
    allure.attach(text_table(["pool", "nodes"], [[k, len(v)] for k, v in sorted(out.items())], "<>"),
                  "nodes per pool", allure.attachment_type.TEXT)
    return out


def _names(nodes: list[str]) -> str:
    more = f" and {len(nodes) - SHOW} more" if len(nodes) > SHOW else ""
    return ", ".join(sorted(nodes)[:SHOW]) + more


@pytest.mark.smoke
def test_every_planned_node_is_registered(pool, nodes_by_pool, profile, figures):
    """The pool (one check per pool) has exactly the number of nodes the profile plans. Red: nodes are missing (named)
    or not named by the profile's prefix."""
    present = {n["metadata"]["name"] for n in nodes_by_pool.get(pool.name, [])}
    figures.add("nodes registered", len(present), "nodes", pool.count, "==")
    if len(present) < pool.count:
        expected = {node_name(profile, pool, i) for i in range(pool.count)}
        missing = sorted(expected - present)
        detail = (f"missing: {_names(missing)}" if present <= expected and missing
                  else "nodes are not named by the profile's node_name_prefix")
        pytest.fail(f"pool {pool.name}: {len(present)} of {pool.count} planned nodes are "
                    f"registered; {detail}")
    assert len(present) == pool.count, (
        f"pool {pool.name}: {len(present)} nodes carry {profile.pool_label}={pool.name}, "
        f"but the profile plans {pool.count}")


@pytest.mark.smoke
def test_every_node_is_ready(pool, nodes_by_pool, figures):
    """Every node of the pool is Ready and free of the node lifecycle taints. Red: the named nodes are not Ready or
    still tainted."""
    not_ready = [n["metadata"]["name"] for n in nodes_by_pool.get(pool.name, []) if not is_ready(n)]
    figures.add("nodes Ready and schedulable", len(nodes_by_pool.get(pool.name, [])) - len(not_ready), "nodes")
    figures.add("nodes not Ready or still tainted", len(not_ready), "nodes", 0)
    assert not not_ready, (
        f"pool {pool.name}: {len(not_ready)} node(s) not Ready or still carrying "
        f"{'/'.join(t.rsplit('/', 1)[1] for t in LIFECYCLE_TAINTS)} taints: {_names(not_ready)}")


def _shape_errors(node: dict, pool) -> list[str]:
    errs = []
    status = node.get("status", {})
    for field in ("capacity", "allocatable"):
        have = status.get(field) or {}
        for res, want in pool.capacity.items():
            got = have.get(res)
            if got is None or parse_quantity(got) != parse_quantity(want):
                errs.append(f"{field} {res}={got} (want {want})")
    return errs


@pytest.mark.smoke
def test_every_node_has_its_pool_capacity(pool, nodes_by_pool, figures):
    """Every node of the pool reports the pool's capacity and allocatable (CPU, memory, pods, GPUs, ephemeral storage).
    Red: the named nodes are misshaped."""
    bad = {}
    for n in nodes_by_pool.get(pool.name, []):
        errs = _shape_errors(n, pool)
        if errs:
            bad[n["metadata"]["name"]] = errs
    figures.add("nodes without their pool's capacity", len(bad), "nodes", 0)
    assert not bad, f"pool {pool.name}: {len(bad)} node(s) misshaped: " + "; ".join(
        f"{name}: {', '.join(errs)}" for name, errs in sorted(bad.items())[:SHOW])


@pytest.mark.smoke
def test_every_node_has_its_pool_labels_and_taints(pool, nodes_by_pool, profile, figures):
    """Every node of the pool carries the pool's labels and exactly its team and preflight taints. Red: a node with a
    missing or extra taint (named) -- a team node without its taint lets any pod onto the team's GPUs."""
    managed = {profile.team_taint_key, profile.preflight_taint_key}
    want_taints = {(t.key, t.value, t.effect) for t in pool.taints}
    bad = {}
    for n in nodes_by_pool.get(pool.name, []):
        errs = []
        labels = n["metadata"].get("labels") or {}
        errs += [f"label {k}={labels.get(k)} (want {v})" for k, v in pool.labels.items()
                 if labels.get(k) != v]
        have = {(t["key"], t.get("value", ""), t["effect"])
                for t in n.get("spec", {}).get("taints") or [] if t["key"] in managed}
        errs += [f"missing taint {k}={v}:{e}" for k, v, e in sorted(want_taints - have)]
        errs += [f"unexpected taint {k}={v}:{e}" for k, v, e in sorted(have - want_taints)]
        if errs:
            bad[n["metadata"]["name"]] = errs
    figures.add("nodes with wrong labels or taints", len(bad), "nodes", 0)
    assert not bad, f"pool {pool.name}: {len(bad)} node(s) with wrong labels/taints: " + "; ".join(
        f"{name}: {', '.join(errs)}" for name, errs in sorted(bad.items())[:SHOW])


@pytest.fixture(scope="module")
def api_latency_window(cluster):
    """Bucket deltas over bring-up (embedded), else since the harness connected.

    On an existing cluster a read-only suite may see no mutating call in its
    window, so a small probe load (writes in a run-owned namespace) runs first;
    every client's calls in the window count, not only the probe's. Both
    scrapes must come from the same kube-apiserver replica (None otherwise).
    """
    replicas = apimetrics.apiserver_replicas(cluster.api)
    if cluster.bringup is not None:
        window, before, after = ("node bring-up", cluster.bringup.metrics_before,
                                 cluster.bringup.metrics_after)
    else:
        cluster.probe_api_calls()
        window, before = "this run (existing cluster)", cluster.metrics_at_connect
        after = apimetrics.scrape_same_replica(cluster.api, before)
    if replicas > 1:
        window += f", one of {replicas} kube-apiserver replicas (its own /metrics)"
    if after is None:
        return window, None
    return window, apimetrics.delta(apimetrics.histograms(after), apimetrics.histograms(before))


def _check_slo(window_hist, verbs, scopes, threshold, what, figures):
    window, hist = window_hist
    assert hist is not None, (f"no {what} latency for {window}: the /metrics scrapes at both ends of the window "
                              "came from different kube-apiserver replicas, whose counters cannot be subtracted "
                              "(10 fresh connections never reached the first one again)")
    lat = apimetrics.latencies(hist, verbs, scopes)
    allure.attach("\n".join(map(str, lat)) or "(no calls)", f"{what} latency, {window}",
                  allure.attachment_type.TEXT)
    figures.add(f"{what} calls in the window", sum(x.count for x in lat), "calls")
    figures.add(f"{what} latency, worst p99 of a verb and resource", max((x.p99_s for x in lat), default=None), "s",
                threshold, headline=True)
    assert lat, f"no {what} calls were recorded by the apiserver during {window}"
    slow = [x for x in lat if x.p99_s > threshold]
    assert not slow, (f"{what} latency SLO (p99 <= {threshold:g} s) broken during {window}: "
                      + "; ".join(map(str, slow)))


@pytest.mark.smoke
def test_mutating_api_calls_meet_the_latency_slo(api_latency_window, profile, cluster, figures):
    """Single-object mutating API calls meet the latency SLO (worst p99 of a verb and resource <=
    ``slo_mutating_p99_s``) over the window, by the apiserver's own histograms. Red: the slow calls are named.

    The window's load is the nodes' bring-up on the embedded cluster: its figures are recorded here
    (how long the nodes took to come up, and at what rate)."""
    if cluster.bringup is not None:
        figures.extend(cluster.bringup.gather())
    _check_slo(api_latency_window, apimetrics.MUTATING_VERBS, apimetrics.SINGLE_OBJECT,
               profile.slo_mutating_p99_s, "single-object mutating", figures)


@pytest.mark.smoke
def test_list_calls_meet_the_latency_slo(api_latency_window, profile, figures):
    """LIST calls meet the latency SLO (worst p99 of a verb and resource <= ``slo_list_p99_s``) over the same window,
    by the apiserver's own histograms. Red: the slow resources are named."""
    _check_slo(api_latency_window, ("LIST",), None, profile.slo_list_p99_s, "LIST", figures)
