"""Unit tests of the per-module API work (clusterproof.cluster.apiwork): pure, no cluster.

The end-to-end side -- a real module's row, attachment and api-work.json -- is
checked by tests/test_api_health_guard.py's cluster test of the guard.
"""
from __future__ import annotations

from collections import Counter

import pytest

from clusterproof.cluster import apiwork
from clusterproof.cluster.apiwork import HARNESS, ModuleWork, Snapshot
from clusterproof.kube.apicalls import CallRecorder

pytestmark = pytest.mark.unit

SCRAPE = """# TYPE apiserver_request_total counter
apiserver_request_total{code="201",group="",resource="pods",subresource="",verb="POST"} %(pods)d
apiserver_request_total{code="409",group="",resource="pods",subresource="",verb="POST"} 2
apiserver_request_total{code="200",group="",resource="pods",subresource="",verb="LIST"} %(lists)d
apiserver_request_total{code="201",group="",resource="pods",subresource="eviction",verb="POST"} 1
apiserver_request_total{code="200",group="coordination.k8s.io",resource="leases",subresource="",verb="PUT"} %(leases)d
apiserver_request_total{code="0",group="",resource="nodes",subresource="",verb="WATCH"} 4
apiserver_request_total{code="200",group="",resource="",subresource="/readyz",verb="GET"} 7
# TYPE apiserver_watch_events_total counter
apiserver_watch_events_total{group="",resource="pods",version="v1"} %(events)d
# TYPE apiserver_watch_events_sizes histogram
apiserver_watch_events_sizes_bucket{group="",resource="pods",version="v1",le="1024"} 0
apiserver_watch_events_sizes_bucket{group="",resource="pods",version="v1",le="+Inf"} %(events)d
apiserver_watch_events_sizes_sum{group="",resource="pods",version="v1"} %(bytes)d
apiserver_watch_events_sizes_count{group="",resource="pods",version="v1"} %(events)d
"""


def scrape(pods=10, lists=3, leases=100, events=50, bytes=50 * 4096):
    return SCRAPE % {"pods": pods, "lists": lists, "leases": leases, "events": events, "bytes": bytes}


def test_the_servers_counts_are_read_as_the_clients_verbs_and_resources():
    got = apiwork.served(scrape())
    assert got[("create", "pods")] == 12               # every code together
    assert got[("list", "pods")] == 3
    assert got[("create", "pods/eviction")] == 1
    assert got[("update", "leases.coordination.k8s.io")] == 100
    assert got[("watch", "nodes")] == 4
    assert got[("get", "(non-resource) /readyz")] == 7
    events, size = apiwork.watch_events(scrape())
    assert events == {"pods": 50} and size == {"pods": 50 * 4096}


def test_a_modules_work_is_what_grew_between_its_two_snapshots():
    a = Snapshot(100.0, Counter({("list", "pods"): 5, ("watch", "pods"): 1}), scrape(),
                 {"kube-apiserver": 40.0, "etcd": 10.0, HARNESS: 3.0})
    b = Snapshot(160.0, Counter({("list", "pods"): 9, ("watch", "pods"): 2, ("create", "pods"): 50}),
                 scrape(pods=60, lists=7, leases=160, events=250, bytes=250 * 4096),
                 {"kube-apiserver": 70.5, "etcd": 12.0, "kwok-controller": 5.0, HARNESS: 4.5})
    w = ModuleWork.between("burst_pod_creation", a, b)
    assert w.harness == {"list pods": 4, "watch pods": 1, "create pods": 50}
    # /readyz's count did not move: not in the module's work
    assert w.apiserver == {"create pods": 50, "list pods": 4, "update leases.coordination.k8s.io": 60}
    assert w.watch_events == {"pods": 200}
    # kwok-controller was not running at the start: all of its count is the module's. (A counter that went
    # back -- a process restarted during the module -- is left out.)
    assert w.cpu_s == {"kube-apiserver": 30.5, "etcd": 2.0, "kwok-controller": 5.0, HARNESS: 1.5}
    row = w.row()
    assert (row["seconds"], row["harness_requests"], row["harness_lists"], row["harness_watches"],
            row["harness_writes"], row["apiserver_requests"], row["watch_events"], row["watch_mib"],
            row["control_plane_cpu_s"], row["harness_cpu_s"]) == (60.0, 55, 4, 1, 50, 114, 200, 0.8, 37.5, 1.5)
    text = w.report()
    assert "served by kube-apiserver (every client): 114" in text and "create pods" in text
    lines = apiwork.table_lines([row])
    assert lines[0].split()[:2] == ["suite", "time"] and "burst_pod_creation" in lines[-1]


def test_a_modules_peak_memory_is_each_components_peak_at_its_end():
    status = "Name:\tkube-apiserver\nVmPeak:\t 9000000 kB\nVmHWM:\t 3145728 kB\nVmRSS:\t 2000000 kB\n"
    assert apiwork.peak_rss_bytes(status) == 3 * 2**30
    assert apiwork.peak_rss_bytes("Name:\tkthreadd\n") is None      # a kernel thread has none
    a = Snapshot(0.0, Counter(), None, {}, {"kube-apiserver": 2**30})
    b = Snapshot(1.0, Counter(), None, {}, {"kube-apiserver": 3 * 2**30, "etcd": 512 * 2**20})
    w = ModuleWork.between("x", a, b)
    assert w.row()["peak_rss_mib"] == {"etcd": 512, "kube-apiserver": 3072}
    assert "kube-apiserver 3,072 MiB, etcd 512 MiB" in w.report()
    me = apiwork.components_peak_rss({"me": __import__("os").getpid(), "gone": 2**22 + 1})
    assert set(me) == {"me"} and me["me"] > 2**20


def test_unreadable_server_counters_are_said_not_zero():
    a = Snapshot(0.0, Counter(), None, {})
    b = Snapshot(1.0, Counter({("get", "nodes"): 1}), scrape(), {})
    w = ModuleWork.between("x", a, b)
    assert w.apiserver is None and w.row()["apiserver_requests"] is None
    assert "not readable" in w.report()
    assert apiwork.table_lines([w.row()])[-1].split()[7] == "-"     # x, 1, s, 1, 0, 0, 0, -


def test_the_recorder_counts_by_verb_and_resource():
    calls = CallRecorder()
    for url in ("https://x/api/v1/namespaces/a/pods", "https://x/api/v1/namespaces/b/pods"):
        calls.record("POST", url, 201)
    calls.record("GET", "https://x/api/v1/pods?labelSelector=a", 200)
    calls.record("POST", "https://x/api/v1/namespaces/a/pods/p/eviction", 429)
    calls.record("PUT", "https://x/apis/coordination.k8s.io/v1/namespaces/c/leases/l", 200)
    assert calls.by_verb_and_resource() == {("create", "pods"): 2, ("list", "pods"): 1,
                                            ("create", "pods/eviction"): 1,
                                            ("update", "leases.coordination.k8s.io"): 1}
