"""Unit tests of pure helpers (no cluster): profiles, percentiles, latency windows, requests read in
RBAC terms, the manifest's rules, the informer's relist, the permission list, waiting, one-line errors."""
from __future__ import annotations

import json
import math
import re
import types

import pytest
from kubernetes import client

from clusterproof.cluster.node_plan import node_plan
from clusterproof.config.profile import load_profile
from clusterproof.core.errors import HarnessError
from clusterproof.core.stats import histogram_quantile, percentile, seconds
from clusterproof.core.waiting import WaitTimeout, wait_for
from clusterproof.kube import access, apimetrics, node_taints
from clusterproof.kube import client as kube
from clusterproof.kube.access import Manifest
from clusterproof.kube.apicalls import Call, classify, refused_by_rbac
from clusterproof.kube.informer import Gone, Informer

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name,nodes", [pytest.param("smoke", 100, id="smoke"),
                                         pytest.param("nightly", 7500, id="nightly")])
def test_node_plan_adds_up_to_the_profile_node_count(name, nodes):
    p = load_profile(name)
    plan = node_plan(p)
    assert sum(pool.count for pool in plan) == nodes
    teams = [pool for pool in plan if pool.name.startswith("team-")]
    assert [pool.name for pool in teams] == [f"team-{t}" for t in p.teams]
    assert all(pool.taints[0].key == p.team_taint_key for pool in teams)
    assert not next(pool for pool in plan if pool.name == "shared").taints


def test_overrides_are_typed_and_unknown_keys_rejected():
    small = ["nodes=7", "teams=a", "burst_jobs=1", "burst_job_size=1", "burst_users=1",
             "burst_locust_processes=1", "burst_steady_pods=1"]
    assert load_profile("smoke", small).nodes == 7
    with pytest.raises(HarnessError, match="unknown key 'node'"):
        load_profile("smoke", ["node=7"])
    with pytest.raises(HarnessError, match="team_fraction must be between 0 and 1"):
        load_profile("smoke", ["team_fraction=2"])
    with pytest.raises(HarnessError, match="not a valid label/taint key"):
        load_profile("smoke", ["team_taint_key=Not A Key"])


def test_quantile_interpolates_like_prometheus():
    # 100 calls: 50 under 0.1 s, 49 more under 0.5 s, 1 under 1 s.
    b = {0.1: 50, 0.5: 99, 1.0: 100, math.inf: 100}
    assert histogram_quantile(0.5, b) == pytest.approx(0.1)
    assert histogram_quantile(0.99, b) == pytest.approx(0.5)
    assert histogram_quantile(0.995, b) == pytest.approx(0.75)
    # Beyond the last finite bucket the last bound is all we know.
    assert histogram_quantile(0.99, {1.0: 0, 60.0: 0, math.inf: 10}) == 60.0


def test_percentile_is_nearest_rank():
    samples = [float(i) for i in range(1, 101)]        # 1..100
    assert percentile(samples, 99) == 99.0
    assert percentile(samples, 50) == 50.0
    assert percentile([3.0], 99) == 3.0
    assert math.isnan(percentile([], 99))


def test_a_bench_distribution_of_seconds_has_its_count_percentiles_and_maximum():
    samples = [float(i) / 3 for i in range(1, 101)]
    assert seconds(samples) == {"n": 100, "p50_s": 16.67, "p99_s": 33.0, "max_s": 33.33}
    assert seconds(samples, (90,)) == {"n": 100, "p90_s": 30.0, "max_s": 33.33}
    assert seconds([]) == {"n": 0, "p50_s": None, "p99_s": None, "max_s": None}


def test_histogram_delta_keeps_only_series_with_new_calls():
    text = ('# TYPE apiserver_request_duration_seconds histogram\n'
            'apiserver_request_duration_seconds_bucket{verb="POST",group="",resource="nodes",'
            'subresource="",scope="cluster",component="apiserver",dry_run="",version="v1",le="1"} {a}\n'
            'apiserver_request_duration_seconds_bucket{verb="POST",group="",resource="nodes",'
            'subresource="",scope="cluster",component="apiserver",dry_run="",version="v1",le="+Inf"} {a}\n'
            'apiserver_request_duration_seconds_count{verb="POST",group="",resource="nodes",'
            'subresource="",scope="cluster",component="apiserver",dry_run="",version="v1"} {a}\n'
            'apiserver_request_duration_seconds_sum{verb="POST",group="",resource="nodes",'
            'subresource="",scope="cluster",component="apiserver",dry_run="",version="v1"} 1\n')
    before = apimetrics.histograms(text.replace("{a}", "3"))
    after = apimetrics.histograms(text.replace("{a}", "10"))
    d = apimetrics.delta(after, before)
    [lat] = apimetrics.latencies(d, ("POST",))
    assert (lat.verb, lat.resource, lat.count) == ("POST", "nodes", 7)
    assert apimetrics.delta(before, before) == {}


def test_single_object_slo_leaves_collection_deletes_and_lists_out():
    """DELETECOLLECTION is its own verb and scope in the apiserver's metrics (CleanScope): a
    collection delete of thousands of pods is not a single-object call."""
    b = {0.1: 10.0, math.inf: 10.0}
    slow = {0.1: 0.0, 30.0: 5.0, math.inf: 5.0}
    hist = {("POST", "", "pods", "", "resource"): b, ("DELETE", "", "pods", "", "resource"): b,
            ("DELETECOLLECTION", "", "pods", "", "namespace"): slow, ("LIST", "", "pods", "", "namespace"): slow}
    lat = apimetrics.latencies(hist, apimetrics.MUTATING_VERBS, apimetrics.SINGLE_OBJECT)
    assert [(x.verb, x.resource) for x in lat] == [("DELETE", "pods"), ("POST", "pods")]


def test_a_window_knows_which_apiserver_replica_answered():
    one = "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1.7e+09\n"
    other = one.replace("1.7e+09", "1.8e+09")
    assert apimetrics.replica(one) == "1.7e+09" != apimetrics.replica(other)
    assert apimetrics.replica("apiserver_request_total 3\n") == ""


@pytest.mark.parametrize("method,url,want", [
    ("GET", "https://h:6443/api/v1/nodes?limit=500", Call("list", "", "nodes")),
    ("GET", "/api/v1/nodes/n1", Call("get", "", "nodes", name="n1")),
    ("GET", "/api/v1/namespaces/a/pods?watch=true&resourceVersion=1", Call("watch", "", "pods", namespace="a")),
    ("POST", "/api/v1/namespaces/a/serviceaccounts/s/token", Call("create", "", "serviceaccounts", "token", "a", "s")),
    ("PATCH", "/api/v1/namespaces/a/pods/p/status", Call("patch", "", "pods", "status", "a", "p")),
    ("DELETE", "/api/v1/namespaces/a", Call("delete", "", "namespaces", name="a")),
    ("GET", "/api/v1/namespaces/a", Call("get", "", "namespaces", name="a")),
    ("DELETE", "/api/v1/namespaces/a/pods", Call("deletecollection", "", "pods", namespace="a")),
    ("PUT", "/apis/coordination.k8s.io/v1/namespaces/h/leases/l", Call("update", "coordination.k8s.io", "leases",
                                                                       namespace="h", name="l")),
    ("POST", "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas", Call("create", "flowcontrol.apiserver.k8s.io",
                                                                       "flowschemas")),
    ("GET", "/metrics", Call("get", path="/metrics")),
    ("GET", "/apis/scheduling.k8s.io/v1alpha2", Call("get", path="/apis/scheduling.k8s.io/v1alpha2")),
])
def test_a_request_is_read_in_rbac_terms_as_the_apiserver_reads_it(method, url, want):
    assert classify(method, url) == want


def test_a_rule_allows_exactly_its_verbs_resources_names_and_namespace():
    role = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "create"]},
            {"apiGroups": ["flowcontrol.apiserver.k8s.io"], "resources": ["flowschemas"], "verbs": ["delete"],
             "resourceNames": ["clusterproof-flood"]},
            {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    docs = [{"kind": "ClusterRole", "metadata": {"name": "r"}, "rules": role},
            {"kind": "RoleBinding", "metadata": {"name": "b", "namespace": "pool-1"},
             "roleRef": {"kind": "ClusterRole", "name": "r"},
             "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "home"}]}]
    m = Manifest.from_docs(docs, subject=("home", "sa"))
    assert m.allows(Call("create", "", "pods", namespace="pool-1"))
    assert not m.allows(Call("create", "", "pods", namespace="kube-system"))      # bound in pool-1 only
    assert not m.allows(Call("delete", "", "pods", namespace="pool-1", name="p"))   # not its verb
    assert not m.allows(Call("get", "", "pods", "log", "pool-1", "p"))            # a subresource is its own
    # A RoleBinding grants a ClusterRole's rules in its namespace only: resourceNames of a cluster-scoped
    # kind never match through it, and a non-resource URL only through a ClusterRoleBinding.
    assert not m.allows(Call("delete", "flowcontrol.apiserver.k8s.io", "flowschemas", name="clusterproof-flood"))
    assert {(i.verb, i.resource) for i in m.unused([Call("get", "", "pods", namespace="pool-1")])} == \
        {("create", "pods"), ("delete", "flowschemas")}


class _FakeApi:
    """A list and watch script for the informer's relist logic (the real API is tested in tests/)."""

    def __init__(self, lists, watches):
        self.lists, self.watches = list(lists), list(watches)

    def list(self, _path, _query):
        return self.lists.pop(0)

    def watch(self, _path, _rv, _query, _timeout):
        for event in self.watches.pop(0):
            if event == "410":
                raise Gone("too old resource version")
            yield event, 100


def _pod(name, rv):
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}}


def test_informer_relists_after_410_and_emits_deleted_for_what_vanished():
    fake = _FakeApi(
        lists=[{"metadata": {"resourceVersion": "10"}, "items": [_pod("a", "1"), _pod("b", "2")]},
               {"metadata": {"resourceVersion": "30"}, "items": [_pod("a", "11"), _pod("c", "25")]}],
        watches=[[{"type": "MODIFIED", "object": _pod("a", "11")}, "410"],
                 [{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "31"}}}]])
    seen = []
    inf = Informer(None, "/api/v1/namespaces/ns/pods", on_event=lambda k, o: seen.append((k, o["metadata"]["name"])),
                   list_fn=fake.list, watch_fn=fake.watch)
    inf.run(until=lambda: inf.rv == "31")
    # a: modified once on the watch, not again on the relist (same resourceVersion);
    # b vanished while the watch was broken: DELETED; c appeared: ADDED.
    assert seen == [("ADDED", "a"), ("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b"), ("ADDED", "c")]
    assert sorted(o["metadata"]["name"] for o in inf.snapshot()) == ["a", "c"]
    assert inf.relists == 1


def test_permission_list_comes_from_the_shipped_manifest_and_where_it_is_bound():
    base = {i.describe() for i in Manifest.shipped(False, ("ml-research",), pool=["p-0"]).items}
    assert {"list nodes cluster-wide (clusterproof)", "get /metrics (clusterproof)",
            "create leases (coordination.k8s.io) in namespace clusterproof (clusterproof-home)",
            "create pods in namespace p-0 (clusterproof-pool)",
            "create pods in namespace ml-research (clusterproof-team)"} <= base
    assert not any(d.startswith("patch nodes") for d in base)
    assert not any("clusterproof-pool" in d and "clusterproof-0" in d for d in base), (
        "the pool found replaces the file's")
    more = {i.describe() for i in Manifest.shipped(True, pool=["p-0"]).items} - base
    assert {"patch nodes cluster-wide (clusterproof-destructive)",
            "delete flowschemas clusterproof-flood (flowcontrol.apiserver.k8s.io) cluster-wide "
            "(clusterproof-destructive)"} <= more
    assert not any("serviceaccounts/token" in d or d.startswith("bind ") for d in more), more


def test_wait_for_is_bounded_and_reports_the_last_state():
    seen = iter(range(1000))
    with pytest.raises(WaitTimeout, match=r"counter reaches 10\^6: not reached within 0.2 s; last seen: \d+"):
        wait_for(lambda: next(seen), until=lambda n: n >= 10**6, timeout=0.2, interval=0.01,
                 what="counter reaches 10^6")
    assert wait_for(lambda: 5, timeout=1, what="five") == 5


class _Item:
    def __init__(self, destructive):
        self.destructive, self.added = destructive, []

    def get_closest_marker(self, name):
        return object() if name == "destructive" and self.destructive else None

    def add_marker(self, marker):
        self.added.append(marker)


@pytest.mark.parametrize("real,allowed,skipped", [
    pytest.param(True, False, True, id="real-cluster-without-opt-in-skips"),
    pytest.param(True, True, False, id="real-cluster-with-allow-destructive-runs"),
    pytest.param(False, False, False, id="simulated-cluster-runs")])
def test_destructive_checks_need_opt_in_on_real_hardware(real, allowed, skipped):
    import types

    from clusterproof.fixtures import REAL_HARDWARE
    from clusterproof.fixtures import cluster as cluster_fixtures
    config = types.SimpleNamespace(stash={REAL_HARDWARE: real},
                                   option=types.SimpleNamespace(cp_allow_destructive=allowed))
    harmless, destructive = _Item(False), _Item(True)
    cluster_fixtures.pytest_collection_modifyitems(config, [harmless, destructive])
    assert not harmless.added
    assert bool(destructive.added) == skipped
    if skipped:
        # either spelling: the message is fixtures/cluster.py's, moving to the --cp- names
        assert re.search(r"--(cp-)?allow-destructive", destructive.added[0].kwargs["reason"])


def test_report_titles_are_sentences_and_docstrings_read_as_html():
    import types

    from clusterproof.report.allure import as_html, sentence
    item = types.SimpleNamespace(originalname="test_gang_is_bound_all_together",
                                 name="test_gang_is_bound_all_together[native]")
    assert sentence(item) == "Gang is bound all together (native)"
    html = as_html("What holds.\nStill the same paragraph.\n\n- a ``key``\n  continued\n- b")
    assert html.startswith('<p style="margin: 0 0 0.6em 0">What holds. Still the same paragraph.</p>\n<ul style=')
    assert html.endswith("><li>a <code>key</code> continued</li><li>b</li></ul>")
    api = types.SimpleNamespace(originalname="test_mutating_api_calls_meet_the_slo",
                                name="test_mutating_api_calls_meet_the_slo")
    assert sentence(api) == "Mutating API calls meet the SLO"
    kueue = types.SimpleNamespace(originalname="test_kueues_webhooks_refuse_a_jobset",
                                  name="test_kueues_webhooks_refuse_a_jobset")
    assert sentence(kueue) == "Kueue's webhooks refuse a JobSet"


def test_a_suites_failure_message_is_its_own_sentence():
    from clusterproof.report.allure import plain_failure
    with pytest.raises(AssertionError) as e:
        assert not [1, 2], "mutating latency SLO broken: PATCH nodes p99 1.2 s"
    plain_failure(e)
    assert str(e.value) == "mutating latency SLO broken: PATCH nodes p99 1.2 s"
    with pytest.raises(AssertionError) as e:
        assert 1 == 2
    plain_failure(e)        # no message of its own: pytest's explanation is all there is, kept
    assert "assert 1 == 2" in str(e.value)


def test_time_per_suite_moves_the_bring_up_out_of_the_suite_that_paid_for_it():
    from clusterproof.report import timing
    t = timing.Timing()   # a session's own table (the report keeps one per session, no module state)
    for when, secs in (("setup", 101.0), ("call", 5.0), ("teardown", 1.0)):
        t.log("suites/test_gang_scheduling.py::t", when, "passed", secs, bringup_s=100.0)
    profile = types.SimpleNamespace(budget_gang_scheduling_s=6, budget_bringup_s=0, budget_total_s=0)
    rows = {r["suite"]: r for r in t.rows(profile)}
    assert rows[timing.BRINGUP]["seconds"] == 100.0 and rows[timing.BRINGUP]["budget_s"] is None
    assert rows["gang_scheduling"]["seconds"] == 7.0 and rows["gang_scheduling"]["over_budget"]
    # Which part of the suite took the time: its set-up (less the bring-up), its checks, its teardown.
    assert (rows["gang_scheduling"]["setup_s"], rows["gang_scheduling"]["call_s"],
            rows["gang_scheduling"]["teardown_s"]) == (1.0, 5.0, 1.0)
    gang = next(line for line in timing.table_lines(t.rows(profile)) if line.startswith("gang_scheduling"))
    assert gang.split("6.0 s", 1)[1].split() == ["1.0", "s", "5.0", "s", "1.0", "s", "OVER", "BUDGET"]
    figures = {f.key: f for f in t.figures(profile)}
    assert figures["time :: gang_scheduling"].value == 7.0 and figures["time :: gang_scheduling"].verdict == "beyond"
    assert figures["time :: embedded cluster bring-up"].threshold is None


def _api(host: str = "https://10.0.0.1:6443"):
    return types.SimpleNamespace(configuration=types.SimpleNamespace(host=host))


def test_a_cluster_without_the_home_namespace_is_told_how_to_provision_it(monkeypatch):
    monkeypatch.setattr(access, "allowed", lambda api, spec: True)
    monkeypatch.setattr(kube, "get_if_present", lambda api, path, query=None: None)
    with pytest.raises(HarnessError, match=r"namespace clusterproof \(the harness's home: run Leases, owner "
                                           r"records\) does not exist on https://10.0.0.1:6443: kubectl apply -f "
                                           r"clusterproof/kube/rbac.yaml"):
        access.check(_api(), destructive=False)


def test_a_node_rewritten_ten_times_in_a_row_gives_up_in_one_line(monkeypatch):
    node = {"metadata": {"name": "n1", "resourceVersion": "7"}, "spec": {}}
    writes = []

    def conflict(api, path, body):
        writes.append(body)
        raise client.ApiException(status=409, reason="Conflict")
    monkeypatch.setattr(node_taints, "get_if_present", lambda api, path: node)
    monkeypatch.setattr(node_taints, "merge_patch", conflict)
    with pytest.raises(HarnessError, match="node n1 could not be written: 10 write conflicts in a row"):
        node_taints.add_taint(_api(), "n1", {"key": "k", "value": "v", "effect": "NoSchedule"})
    assert len(writes) == 10 and all(w["metadata"]["resourceVersion"] == "7" for w in writes)


def test_a_403_from_rbac_is_told_apart_from_an_admission_denial():
    """A check that expects admission to refuse must not take the authorizer's refusal as that verdict."""
    def err(message):
        return client.ApiException(status=403, reason="Forbidden",
                                   http_resp=types.SimpleNamespace(
                                       status=403, reason="Forbidden", headers={},
                                       data=json.dumps({"kind": "Status", "message": message}).encode()))
    rbac = err('pods "p" is forbidden: User "system:serviceaccount:clusterproof:clusterproof" cannot patch '
               'resource "pods" in API group "" in the namespace "team-a"')
    admission = err("pods \"p\" is forbidden: ValidatingAdmissionPolicy 'x' with binding 'y' denied request: "
                    "pod p may not tolerate another team's taint")
    assert refused_by_rbac(rbac) and not refused_by_rbac(admission)
    assert not refused_by_rbac(client.ApiException(status=409, reason="Conflict"))


def test_a_long_wait_for_pods_bound_or_refused_says_how_many_are_which():
    """The heartbeat of the taint suite's 3,000-pod wait shows counts, not a dict of pod names: a slow
    scheduler (few bound) and a slow verdict (few refused) read differently the next morning."""
    from clusterproof.kube.placement import settled_so_far
    where = {"a": "node-1", "b": None, "c": None, "d": None, "other": "node-2"}   # "other": not this wait's pod
    assert settled_so_far((where, {"b": ["0/5 nodes are available"]}, ["c", "d"]), ["a", "b", "c", "d"]) == (
        "1 of 4 pods bound, 1 refused (Pending with the scheduler's verdict), 2 open")


def test_a_refused_pod_whose_event_was_dropped_is_refused_by_its_condition():
    """kube-scheduler drops events when 1,000 are queued; the PodScheduled condition carries the same
    verdict. Only the pod created (same uid) counts, and a bound pod has no refusal."""
    from clusterproof.kube.placement import verdicts

    def pod(uid, node=None, reason="Unschedulable"):
        cond = {"type": "PodScheduled", "status": "False", "reason": reason,
                "message": "0/5 nodes are available: 3 node(s) had untolerated taint(s)."}
        return {"metadata": {"uid": uid}, "spec": {"nodeName": node}, "status": {"conditions": [cond]}}
    created = {"dropped": pod("u1"), "said": pod("u2"), "old": pod("u3"), "bound": pod("u4"), "gated": pod("u5")}
    now = {"dropped": pod("u1"), "said": pod("u2"), "old": pod("other"), "bound": pod("u4", "node-1"),
           "gated": pod("u5", reason="SchedulingGated")}
    got = verdicts(now, created, {"said": ["0/5 nodes are available: 3 node(s) had untolerated taint(s)."]})
    assert got == {"dropped": ["0/5 nodes are available: 3 node(s) had untolerated taint(s)."],
                   "said": ["0/5 nodes are available: 3 node(s) had untolerated taint(s)."]}


def test_a_gangs_timeout_rejection_is_read_on_the_member_itself():
    """The gang suite once waited 75 s for a 'rejected due to timeout' event that never came (events are best
    effort); the scheduler writes the same message to the member's PodScheduled condition. Another
    refusal, or a bound member, is not a timeout rejection."""
    from clusterproof.gang.gangs import timeout_rejection

    def pod(message, reason="Unschedulable", status="False"):
        return {"metadata": {"name": "m-0"}, "spec": {},
                "status": {"conditions": [{"type": "PodScheduled", "status": status, "reason": reason,
                                           "message": message}]}}
    timed_out = "rejected due to timeout after waiting 10s at plugin Coscheduling"
    assert timeout_rejection(pod(timed_out)) == timed_out
    assert timeout_rejection(pod("0/6 nodes are available: 6 Insufficient nvidia.com/gpu.")) is None
    assert timeout_rejection(pod("", reason="", status="True")) is None
    assert timeout_rejection({"metadata": {"name": "m-1"}, "spec": {}, "status": {}}) is None


def test_server_ports_are_handed_out_in_turn_below_the_ephemeral_range(tmp_path):
    """A port the OS picks from the ephemeral range can become any outgoing connection's source port before
    the component binds it ("bind: address already in use"). Ports come from below that range, in turn from
    one counter (two runs never get the same one), skipping one that something listens on, wrapping round."""
    import socket

    from clusterproof.core import ports
    top = ports.ephemeral_low() - 1
    low = top - ports.MIN_SPAN + 1
    # A stretch of ports nothing on this machine uses now (other runs may hold some of this range).
    start = next(p for p in range(low, top - 20) if all(ports.bindable(q) for q in range(p, p + 8)))
    state = tmp_path / "ports"
    state.write_text(str(start))
    taken = socket.socket()
    taken.bind(("0.0.0.0", start + 1))
    taken.listen()
    try:
        first = ports.free_ports(3, state, low)
        second = ports.free_ports(2, state, low)
    finally:
        taken.close()
    assert first == [start, start + 2, start + 3] and second == [start + 4, start + 5]
    assert int(state.read_text()) == start + 6
    state.write_text(str(top))     # the last port of the span: the one after it is the first
    got = ports.free_ports(2, state, low)
    assert got[0] in (top, low) and all(low <= p <= top for p in got) and got[0] != got[1]


def test_cpu_per_test_sums_each_modules_three_figures_once():
    from tests.cpu_per_test import per_module
    lines = [json.dumps({"test": f"tests/test_{m}.py::t{i}", "wall_s": 10, "own_s": 1, "children_s": c, "cluster_s": 2})
             for i, (m, c) in enumerate([("a", 3), ("b", 20), ("a", 4)])]
    modules = per_module(lines)
    assert list(modules) == ["test_b.py", "test_a.py"]          # the most CPU first
    assert modules["test_a.py"]["cpu_s"] == 1 + 3 + 2 + 1 + 4 + 2 and modules["test_a.py"]["wall_s"] == 20
