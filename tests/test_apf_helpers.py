"""Unit tests of the API overload suite's pure helpers (no cluster).

The FlowSchemas below are written for these tests in the shape of
Kubernetes' suggested configuration (names, precedences, subjects), small
enough to read; the matcher must pick what the apiserver picks.
"""
from __future__ import annotations

import pytest

from clusterproof.apf import flood as fm
from clusterproof.apf.flood_plan import split
from clusterproof.apf.overload import level_body, schema_body
from clusterproof.cluster.identities import sans
from clusterproof.kube import flowcontrol as apf

ALL = {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "namespaces": ["*"], "clusterScope": True}


def fs(name, precedence, level, subjects, resource_rules=(ALL,), non_resource=True):
    rule = {"subjects": subjects, "resourceRules": list(resource_rules)}
    if non_resource:
        rule["nonResourceRules"] = [{"verbs": ["*"], "nonResourceURLs": ["*"]}]
    return {"metadata": {"name": name, "uid": f"uid-{name}"},
            "spec": {"matchingPrecedence": precedence, "priorityLevelConfiguration": {"name": level}, "rules": [rule]}}


def group(n):
    return {"kind": "Group", "group": {"name": n}}


def user(n):
    return {"kind": "User", "user": {"name": n}}


def level(name, kind="Limited", queues=None, length=50):
    limited = {"nominalConcurrencyShares": 10, "limitResponse": {"type": "Reject"}}
    if queues:
        limited["limitResponse"] = {"type": "Queue", "queuing": {"queues": queues, "handSize": 6,
                                                                  "queueLengthLimit": length}}
    return {"metadata": {"name": name, "uid": f"uid-pl-{name}"},
            "spec": {"type": kind, **({"limited": limited} if kind == "Limited" else {"exempt": {}})}}


DEFAULTS = [
    fs("exempt", 1, "exempt", [group("system:masters")]),
    fs("probes", 2, "exempt", [group("system:authenticated"), group("system:unauthenticated")], resource_rules=()),
    fs("system-leader-election", 100, "leader-election",
       [user("system:kube-controller-manager"), user("system:kube-scheduler")],
       [{"verbs": ["get", "create", "update"], "apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "namespaces": ["*"]}], non_resource=False),
    fs("system-node-high", 400, "node-high", [group("system:nodes")],
       [{"verbs": ["*"], "apiGroups": [""], "resources": ["nodes", "nodes/status"], "namespaces": ["*"],
         "clusterScope": True},
        {"verbs": ["*"], "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "namespaces": ["*"]}],
       non_resource=False),
    fs("system-nodes", 500, "system", [group("system:nodes")]),
    fs("kube-controller-manager", 800, "workload-high", [user("system:kube-controller-manager")]),
    fs("kube-scheduler", 800, "workload-high", [user("system:kube-scheduler")]),
    fs("kube-system-service-accounts", 900, "workload-high",
       [{"kind": "ServiceAccount", "serviceAccount": {"namespace": "kube-system", "name": "*"}}]),
    fs("service-accounts", 9000, "workload-low", [group("system:serviceaccounts")]),
    fs("global-default", 9900, "global-default", [group("system:authenticated"), group("system:unauthenticated")]),
    fs("catch-all", 10000, "catch-all", [group("system:authenticated"), group("system:unauthenticated")]),
]
# The probes schema only has non-resource rules for health URLs.
DEFAULTS[1]["spec"]["rules"][0]["nonResourceRules"] = [{"verbs": ["get"], "nonResourceURLs": ["/healthz", "/readyz"]}]
LEVELS = {n: level(n, "Exempt" if n == "exempt" else "Limited", queues=None if n in ("exempt", "catch-all") else 64)
          for n in ("exempt", "leader-election", "node-high", "system", "workload-high", "workload-low",
                    "global-default", "catch-all")}
CONFIG = apf.ApfConfig(apf.sort_schemas(list(reversed(DEFAULTS))), LEVELS)


def where(req):
    return apf.classify(CONFIG.flow_schemas, req)["metadata"]["name"]


@pytest.mark.parametrize("req,expected", [
    (apf.node_requests()[0], "system-node-high"),
    (apf.node_requests()[1], "system-node-high"),
    (apf.Request("kubelet watching pods", "system:node:x", ("system:nodes",), "watch", "", "pods"), "system-nodes"),
    (apf.Request("simulated kubelets (no node: prefix)", "kwok:simulated-kubelets", ("system:nodes",), "patch", "",
                 "nodes/status"), "system-node-high"),
    (apf.controller_requests()[0], "kube-scheduler"),
    (apf.controller_requests()[1], "kube-controller-manager"),
    (apf.Request("scheduler leader lease", "system:kube-scheduler", (), "update", "coordination.k8s.io", "leases",
                 "kube-system"), "system-leader-election"),
    (apf.Request("node-controller SA", "system:serviceaccount:kube-system:node-controller",
                 ("system:serviceaccounts",), "patch", "", "nodes"), "kube-system-service-accounts"),
    (apf.load_requests("cp-ab12-flood", "clusterproof-load")[0], "service-accounts"),
    (apf.Request("admin", "kwok-admin", ("system:masters",), "create", "", "nodes"), "exempt"),
    (apf.Request("health", "x", ("system:authenticated",), "get", path="/healthz"), "probes"),
    (apf.Request("a user", "alice", ("system:authenticated",), "get", "", "pods", "default"), "global-default"),
])
@pytest.mark.unit
def test_requests_are_classified_as_the_apiserver_does(req, expected):
    assert where(req) == expected


@pytest.mark.unit
def test_equal_precedence_is_broken_by_name():
    a = fs("b-second", 10, "x", [group("g")])
    b = fs("a-first", 10, "y", [group("g")])
    req = apf.Request("r", "u", ("g",), "get", "", "pods", "ns")
    assert apf.classify(apf.sort_schemas([a, b]), req)["metadata"]["name"] == "a-first"


@pytest.mark.unit
def test_the_runs_flood_schema_matches_only_its_service_account():
    flood = schema_body("clusterproof-flood-r", "r", "clusterproof-flood-r",
                        {"kind": "ServiceAccount",
                         "serviceAccount": {"namespace": "cp-flood", "name": "clusterproof-load"}})
    schemas = apf.sort_schemas([*DEFAULTS, flood])
    assert apf.classify(schemas, apf.load_requests("cp-flood", "clusterproof-load")[0])["metadata"]["name"] == \
        "clusterproof-flood-r"
    assert apf.classify(schemas, apf.load_requests("cp-probe", "clusterproof-load")[0])["metadata"]["name"] == \
        "service-accounts"


@pytest.mark.unit
def test_stock_configuration_meets_the_default_expectations():
    assert apf.expectation_problems(CONFIG, "system-node-high", ["kube-scheduler", "kube-controller-manager"],
                                    "cp-x-flood", "clusterproof-load", 10000) == []


@pytest.mark.unit
def test_expectations_name_the_objects_that_differ():
    problems = apf.expectation_problems(CONFIG, "system-nodes", ["kube-scheduler"], "cp-x-flood",
                                        "clusterproof-load", 3000)
    text = "\n".join(problems)
    assert "matches FlowSchema system-node-high (PriorityLevel node-high), not system-nodes" in text
    assert ("kube-controller-manager listing nodes matches FlowSchema kube-controller-manager (PriorityLevel "
            "workload-high), none of kube-scheduler") in text
    assert "PriorityLevelConfiguration workload-low queues up to 3200 requests (64 queues x 50)" in text


@pytest.mark.unit
def test_a_load_identity_in_exempt_or_a_system_level_is_named():
    exempting = fs("all-sa-exempt", 50, "exempt", [group("system:serviceaccounts")])
    cfg = apf.ApfConfig(apf.sort_schemas([*DEFAULTS, exempting]), LEVELS)
    problems = apf.expectation_problems(cfg, "system-node-high", ["kube-scheduler", "kube-controller-manager"],
                                        "cp-x-flood", "clusterproof-load", 10000)
    assert any("matches FlowSchema all-sa-exempt into PriorityLevel exempt (exempt: never queued or rejected)" in p
               for p in problems), problems


@pytest.mark.unit
def test_level_body_rejects_or_queues():
    r = level_body("l", "run", 1, 0, 1, 50)["spec"]["limited"]
    assert r["limitResponse"] == {"type": "Reject"} and r["lendablePercent"] == 0 and r["borrowingLimitPercent"] == 0
    q = level_body("l", "run", 2, 64, 6, 1000)["spec"]["limited"]["limitResponse"]
    assert q == {"type": "Queue", "queuing": {"queues": 64, "handSize": 6, "queueLengthLimit": 1000}}
    assert apf.queue_depth({"spec": {"limited": {"limitResponse": q}}}) == 64000


@pytest.mark.unit
def test_counters_and_deltas_read_the_prometheus_text():
    text = ("# TYPE apiserver_flowcontrol_rejected_requests_total counter\n"
            'apiserver_flowcontrol_rejected_requests_total{flow_schema="f",priority_level="p",reason="queue-full"} 3\n'
            'apiserver_flowcontrol_rejected_requests_total{flow_schema="f",priority_level="p",reason="time-out"} 2\n')
    assert apf.rejected(text) == {("f", "p", "queue-full"): 3.0, ("f", "p", "time-out"): 2.0}
    assert apf.delta({("a",): 5.0, ("b",): 1.0}, {("a",): 5.0}) == {("b",): 1.0}


@pytest.mark.unit
def test_rejections_per_second_per_flow_schema():
    s = [fm.FlowSample(10.0, {}, {("f", "p"): 0.0}, {}, {}), fm.FlowSample(12.0, {}, {("f", "p"): 10.0}, {}, {}),
         fm.FlowSample(14.0, {}, {("f", "p"): 10.0, ("g", "q"): 0.0}, {}, {})]
    assert fm.rejections_per_second(s, 10.0) == {"f": [(2.0, 5.0), (4.0, 0.0)]}


@pytest.mark.unit
def test_latency_figures_count_429s_and_no_answers():
    s = [fm.Sample(0, "create configmap", 0.1, 201), fm.Sample(1, "get configmap", 0.05, 200),
         fm.Sample(2, "create configmap", 0.2, 429), fm.Sample(3, "delete configmap", 5.0, 0, error="timeout")]
    f = fm.latency_figures(s)
    assert (f.responses_429, f.no_response, f.requests) == (1, 1, 4)
    assert f.mutating_p99_s == 0.2 and f.p50_s == 0.1
    assert fm.latency_figures([]).p99_s is None
    assert {g.name: g.value for g in f.gather()}["responses_429"] == 1


@pytest.mark.unit
def test_flood_pods_are_split_by_client_kind():
    assert split(100, 0.25) == {"honouring": 75, "impatient": 25}
    assert split(3, 0.01) == {"honouring": 2, "impatient": 1}
    assert split(10, 0) == {"honouring": 10, "impatient": 0}


@pytest.mark.unit
def test_certificate_sans_are_typed_and_unique():
    assert sans(("localhost", "127.0.0.1", "::1", "localhost")) == "DNS:localhost,IP:127.0.0.1,IP:::1"


@pytest.mark.unit
def test_entropy_rule_matches_the_apiserver():
    from clusterproof.config.profile import load_profile
    with pytest.raises(Exception, match="needs 63 bits of entropy"):
        load_profile("smoke", ["apf_flood_queues=512", "apf_flood_hand_size=7"])
    load_profile("smoke", ["apf_flood_queues=64", "apf_flood_hand_size=6"])     # 36 bits: within the rule


@pytest.mark.unit
def test_recovery_needs_a_full_window_of_fast_requests_and_none_stuck():
    from clusterproof.apf.overload import recovery_state
    fast = [fm.Sample(100 + i * 0.2, "get configmap", 0.02, 200) for i in range(30)]
    assert recovery_state(fast, 106.0, None, 100.0, 0.1)["ok"]
    assert not recovery_state(fast, 104.0, None, 100.0, 0.1)["ok"], "the window is not full yet"
    assert not recovery_state(fast, 106.0, 105.5, 100.0, 0.1)["ok"], "a request has waited 0.5 s"
    slow = fast + [fm.Sample(103.0, "create configmap", 1.9, 201)]
    st = recovery_state(slow, 106.0, None, 100.0, 0.1)
    assert not st["ok"] and st["slowest_s"] == 1.9
    assert not recovery_state(fast + [fm.Sample(105.0, "get configmap", 0.01, 0)], 106.0, None, 100.0, 0.1)["ok"]


@pytest.mark.cluster
def test_component_certificates_carry_their_identities(tmp_path):
    """The PKI written before kwokctl: CA, admin as kwokctl makes it, one client certificate per component,
    and kubeconfig/--config patches that point each component at its own."""
    import subprocess

    import yaml

    from clusterproof.cluster.identities import IDENTITIES, components_patches, write_pki
    write_pki(tmp_path / "pki")

    def subject(name):
        return subprocess.run(["openssl", "x509", "-in", str(tmp_path / "pki" / f"{name}.crt"), "-noout", "-subject",
                               "-nameopt", "RFC2253"], capture_output=True, text=True, check=True).stdout.strip()
    assert subject("admin") == "subject=CN=kwok-admin,O=system:masters"
    assert subject("kwok-controller") == "subject=CN=kwok:simulated-kubelets,O=system:nodes"
    assert subject("kube-scheduler") == "subject=CN=system:kube-scheduler"
    for ident in IDENTITIES:
        verify = subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / "pki" / "ca.crt"),
                                 str(tmp_path / "pki" / f"{ident.file}.crt")], capture_output=True, text=True)
        assert verify.returncode == 0, verify.stdout + verify.stderr
    sched = tmp_path / "scheduler.yaml"
    sched.write_text(yaml.safe_dump({"apiVersion": "kubescheduler.config.k8s.io/v1",
                                     "kind": "KubeSchedulerConfiguration", "clientConnection": {"qps": 5.0}}))
    patches = {p["name"]: p["extraArgs"] for p in components_patches(tmp_path, "https://127.0.0.1:1", sched)}
    assert patches["kube-scheduler"] == [{"key": "config", "value": str(sched), "override": True}]
    conn = yaml.safe_load(sched.read_text())["clientConnection"]
    assert conn == {"qps": 5.0, "kubeconfig": str(tmp_path / "kube-scheduler.kubeconfig")}
    assert {"key": "use-service-account-credentials", "value": "true", "override": False} in \
        patches["kube-controller-manager"]
    kube = yaml.safe_load((tmp_path / "kwok-controller.kubeconfig").read_text())
    assert kube["users"][0]["user"]["client-certificate"] == str(tmp_path / "pki" / "kwok-controller.crt")
    assert kube["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:1"


@pytest.mark.unit
def test_only_the_known_eviction_504_is_not_an_error():
    """The guard excuses exactly an eviction's PDB-conflict 504; a 504 on a plain pod create still fails."""
    from clusterproof.cluster import apiguard

    def scrape(evict, create):
        row = 'apiserver_request_total{code="504",component="apiserver",group="",resource="pods",scope="resource",'
        return (row + f'subresource="eviction",verb="POST",version="v1"}} {evict}\n'
                + row + f'subresource="",verb="POST",version="v1"}} {create}\n')
    assert apiguard.server_errors(scrape(0, 0), scrape(3, 0)) == {}
    assert apiguard.server_errors(scrape(0, 0), scrape(3, 1)) == {("POST", "", "pods", "", "504"): 1.0}
