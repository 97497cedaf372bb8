"""Unit tests of the GPU preflight suite's pure helpers (no cluster, no NVML).

The contract's marks and verdicts, the fault plan, the whole-run bind watch
(fed synthetic events: the order of resourceVersions decides), the checker
pod and its outcomes, the cross-check, the agent's request accounting.
"""
from __future__ import annotations

import pytest

from clusterproof.config.profile import load_profile
from clusterproof.core.errors import HarnessError
from clusterproof.preflight.agent import request_key
from clusterproof.preflight.contract import Marks, condition_reason, evictable, is_workload, max_out_at_once
from clusterproof.preflight.gpu_pods import (
    checker_pod,
    cross_check,
    gpu_rows,
    pod_outcome,
    render_table,
    verdict_from_log,
)
from clusterproof.preflight.mock_nvml import BENIGN, FAULTS, FaultFile, machine_spec, plan_faults
from clusterproof.preflight.run import resolve_agent
from clusterproof.preflight.watch import ContractWatch

pytestmark = pytest.mark.unit
M = Marks("example.com/preflight", "example.com/preflight", "example.com/preflight-reason", "GPUPreflightFailed",
          "GPUPreflightFailed")


def node(name="n1", rv=1, labels=None, taints=(), unschedulable=False, conditions=()):
    return {"metadata": {"name": name, "resourceVersion": str(rv), "labels": dict(labels or {})},
            "spec": {"taints": list(taints), "unschedulable": unschedulable},
            "status": {"conditions": list(conditions)}}


def pod(name="p", node_name=None, rv=1, owner=None, tolerations=(), phase="Running"):
    meta = {"name": name, "namespace": "ns", "resourceVersion": str(rv)}
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": "x"}]
    return {"metadata": meta, "spec": {"nodeName": node_name, "tolerations": list(tolerations)},
            "status": {"phase": phase}}


PENDING = node(labels={M.label_key: "pending"}, taints=[M.taint])
FAILED = node(labels={M.label_key: "failed", M.reason_key: "xid-79"}, taints=[M.taint], unschedulable=True,
              conditions=[{"type": "GPUPreflightFailed", "status": "True", "message": "GPU 3: XID 79"}])
RELEASED = node()
OUT = node(labels={M.reason_key: "gpu-lost"}, unschedulable=True)


# --- the contract's marks ---------------------------------------------------------------------------------

def test_node_states_follow_the_marks():
    assert [M.state(n) for n in (PENDING, FAILED, RELEASED, OUT)] == ["pending", "failed", "released",
                                                                       "out-of-service"]
    assert M.unpassed(PENDING) and M.unpassed(FAILED) and M.unpassed(OUT) and not M.unpassed(RELEASED)
    assert M.out_of_service(OUT) and not M.out_of_service(FAILED)   # a join failure was never in service
    untainted_early = node(labels={M.label_key: "pending"})
    assert M.unpassed(untainted_early) and M.pending(untainted_early)


def test_quarantine_and_release_problems_name_the_node_and_what_is_missing():
    assert M.quarantine_problems(FAILED, "xid-79", ["event"]) == []
    problems = M.quarantine_problems(node("n2", labels={M.label_key: "failed", M.reason_key: "ecc-uncorrectable"}),
                                     "xid-79", [])
    assert problems == ["node n2 lost its example.com/preflight taint", "node n2 is not cordoned",
                        "node n2 has reason label example.com/preflight-reason=ecc-uncorrectable, expected xid-79",
                        "node n2 has no condition GPUPreflightFailed=True", "node n2 has no GPUPreflightFailed Event"]
    assert M.release_problems(RELEASED) == []
    assert M.release_problems(PENDING) == ["node n1 still carries example.com/preflight",
                                           "node n1 still has label example.com/preflight=pending"]
    assert M.remediation_problems(OUT, "gpu-lost", ["e"]) == ["node n1 has no condition GPUPreflightFailed=True"]


def test_condition_reasons_are_camel_case():
    assert condition_reason("xid-79") == "Xid79"
    assert condition_reason("row-remap-pending") == "RowRemapPending"
    assert condition_reason("") == "Failed"


def test_workloads_exclude_daemonsets_mirror_pods_and_pods_that_tolerate_preflight():
    assert is_workload(pod(), M.taint_key)
    assert not is_workload(pod(owner="DaemonSet"), M.taint_key)
    assert not is_workload(pod(tolerations=[{"key": M.taint_key, "operator": "Exists"}]), M.taint_key)
    assert not is_workload(pod(tolerations=[{"operator": "Exists"}]), M.taint_key)
    assert is_workload(pod(owner="ReplicaSet", tolerations=[{"key": "other", "operator": "Exists"}]), M.taint_key)
    assert evictable(pod(owner="ReplicaSet")) and not evictable(pod(owner="DaemonSet"))
    assert not evictable(pod(phase="Succeeded"))


def test_most_nodes_out_at_once():
    timeline = [(1.0, frozenset({"a"})), (2.0, frozenset({"a", "b", "c"})), (3.0, frozenset({"c"}))]
    assert max_out_at_once(timeline) == (3, 2.0, frozenset({"a", "b", "c"}))
    assert max_out_at_once([]) == (0, None, frozenset())


# --- the whole-run watch, on synthetic events -------------------------------------------------------------

def _watch():
    w = ContractWatch(None, M, ("scope", "yes"))
    w.pod_list_rv = 5
    return w


def test_a_bind_while_the_node_had_not_passed_is_a_violation_even_if_it_passed_later():
    w = _watch()
    w._node("ADDED", node("n1", 10, labels={M.label_key: "pending", "scope": "yes"}, taints=[M.taint]))
    w._node("MODIFIED", node("n1", 11, labels={M.label_key: "pending", "scope": "yes"}))   # taint off early
    w._pod("MODIFIED", pod("early", "n1", rv=12))                                           # bound now
    w._node("MODIFIED", node("n1", 13, labels={"scope": "yes"}))                            # passed, too late
    w._pod("MODIFIED", pod("fine", "n1", rv=14))
    assert w.violations() == ["pod ns/early was bound to node n1 while it had not passed preflight "
                              "(label example.com/preflight=pending)"]


def test_binds_before_the_watch_daemonsets_and_released_nodes_are_no_violation():
    w = _watch()
    w._node("ADDED", node("n1", 3, labels={M.label_key: "pending"}, taints=[M.taint]))
    w._pod("ADDED", pod("old", "n1", rv=4))                      # bound before the watch began
    w._pod("MODIFIED", pod("ds", "n1", rv=6, owner="DaemonSet"))
    w._node("ADDED", node("n2", 7))
    w._pod("MODIFIED", pod("ok", "n2", rv=8))
    w._pod("MODIFIED", pod("ok", "n1", rv=9))                    # the first bind counts, not later updates
    assert w.violations() == []
    assert {b.pod for b in w.bound_to({"n2"})} == {"ns/ok"}


def test_the_watch_records_nodes_out_of_service_over_time():
    w = _watch()
    for i, name in enumerate(("a", "b", "c")):
        w._node("ADDED", node(name, 20 + i, labels={"scope": "yes"}))
    w._node("MODIFIED", node("a", 30, labels={"scope": "yes", M.reason_key: "xid-79"}, unschedulable=True))
    w._node("MODIFIED", node("b", 31, labels={"scope": "yes", M.reason_key: "gpu-lost"}, unschedulable=True))
    w._node("DELETED", node("a", 32, labels={"scope": "yes"}))
    w._node("MODIFIED", node("c", 33, labels={"scope": "yes", M.reason_key: "xid-48"}, unschedulable=True))
    w._node("MODIFIED", node("other", 34, labels={M.reason_key: "x"}, unschedulable=True))   # not in scope
    assert w.max_out()[0] == 2
    assert w.seen("a", "released") is not None and w.seen("a", "out-of-service") is not None


# --- faults -----------------------------------------------------------------------------------------------------

def test_fault_plan_spreads_every_kind_and_places_benign_conditions_on_healthy_nodes():
    names = [f"n{i}" for i in range(48)]
    plan = plan_faults(names, 0.25)
    faulty = [n for n, k in plan.items() if k in FAULTS]
    assert len(faulty) == 12 and {plan[n] for n in faulty} == set(FAULTS)
    assert {k for k in plan.values() if k in BENIGN} == set(BENIGN)
    assert plan == plan_faults(names, 0.25)                     # deterministic
    assert sum(1 for k in plan_faults(names, 0.001).values() if k in FAULTS) == 1   # at least one
    assert not any(k in FAULTS for k in plan_faults(names, 0).values())


def test_fault_file_says_what_the_checker_must_answer(tmp_path):
    ff = FaultFile(tmp_path / "f.json")
    ff.set({"a": "xid-79", "b": "gpu-missing", "c": "power-capped", "d": None})
    assert [ff.expected_code(n) for n in "abcd"] == ["xid-79", "gpu-count", "", ""]
    ff.set({"a": None})
    assert ff.expected_code("a") == ""
    with pytest.raises(ValueError, match="unknown fault kind 'melted'"):
        machine_spec("melted")


# --- checker pods and the cross-check ----------------------------------------------------------------------------

def test_checker_pod_takes_the_whole_node_and_runs_where_workloads_may_not():
    """Pinned like a DaemonSet's pod (affinity on the node's name, through the scheduler, never nodeName), tolerating
    the node's own taints exactly -- cordoned, under preflight, a team's -- and nothing else (the harness's admission
    policies admit no wider toleration: not even Exists on the preflight key)."""
    node = {"metadata": {"name": "gpu-7"}, "spec": {"taints": [
        {"key": M.taint_key, "value": "pending", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
        {"key": "example.com/team", "value": "a", "effect": "NoSchedule"}]}}
    p = checker_pod("preflight-0", "run1", node, "registry.example/pf:1", 8, 2000)
    spec = p["spec"]
    assert "nodeName" not in spec and spec["restartPolicy"] == "Never"
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-7"]}]}]
    c = spec["containers"][0]
    assert c["image"] == "registry.example/pf:1"
    assert c["command"] == ["python", "-m", "preflight", "check", "--expect-gpus", "8", "--xid-window-ms", "2000"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert spec["tolerations"] == [
        {"key": M.taint_key, "operator": "Equal", "value": "pending", "effect": "NoSchedule"},
        {"key": "example.com/team", "operator": "Equal", "value": "a", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unschedulable", "operator": "Equal", "value": "", "effect": "NoSchedule"}]
    assert not is_workload(p, M.taint_key)


@pytest.mark.parametrize("status,outcome", [
    pytest.param({"phase": "Pending", "containerStatuses": [{"state": {"waiting": {
        "reason": "ErrImagePull", "message": "not found"}}}]}, ("image-error", "ErrImagePull: not found"), id="pull"),
    pytest.param({"phase": "Pending", "containerStatuses": [{"state": {"waiting": {"reason": "ContainerCreating"}}}]},
                 ("running", "Pending"), id="creating"),
    pytest.param({"phase": "Failed", "containerStatuses": [{"state": {"terminated": {"exitCode": 1}}}]},
                 ("done", "1"), id="failed"),
    pytest.param({"phase": "Succeeded"}, ("done", "0"), id="succeeded"),
])
def test_checker_pod_outcomes(status, outcome):
    assert pod_outcome({"status": status}) == outcome


def test_verdict_from_the_pod_log():
    v = verdict_from_log("gpu-1", "1", 'noise\n{"ok": false, "code": "xid-79", "machine": "x", "reasons": []}\n')
    assert v["machine"] == "gpu-1" and v["code"] == "xid-79"
    v = verdict_from_log("gpu-2", "4", "preflight: no NVML library: libnvidia-ml.so.1 was not found\n")
    assert not v["ok"] and v["code"] == "nvml-unavailable" and "no NVML library" in v["reasons"][0]["message"]


def test_cross_check_wants_failing_nodes_held_back_and_released_ones_passing():
    fail = {"ok": False, "code": "xid-79", "reasons": [{"message": "GPU 3: XID 79"}], "gpus": []}
    ok = {"ok": True, "code": "", "reasons": [], "gpus": []}
    nodes = {"released-bad": node("released-bad"), "held-bad": dict(FAILED, metadata={"name": "held-bad"}),
             "held-ok": node("held-ok", labels={M.reason_key: "x"}, unschedulable=True), "fine": node("fine")}
    bad, notes = cross_check(M, nodes, {"released-bad": fail, "held-bad": fail, "held-ok": ok, "fine": ok})
    assert bad == ["node released-bad is released, but its GPUs fail preflight (xid-79: GPU 3: XID 79)"]
    assert notes == ["node held-ok is held back (out-of-service) but passes preflight now"]


def test_gpu_table_has_a_row_per_gpu():
    v = {"ok": False, "code": "nvlink-down", "gpus": [
        {"index": 0, "name": "H100", "bus_id": "0:18", "nvlinks_up": 17, "nvlinks": 18, "clock_events": ["gpu_idle"],
         "remapped_rows": {"correctable": 0, "uncorrectable": 1, "pending": True, "failure": False}, "xids": [79]}]}
    rows = gpu_rows({"n": v})
    assert rows[0]["nvlinks"] == "17/18" and rows[0]["remapped_rows"] == "0c/1u pending" and rows[0]["xids"] == "79"
    assert "nvlink-down" in render_table(rows)


# --- configuration ----------------------------------------------------------------------------------------------

def test_agent_choice():
    assert resolve_agent("auto", True) == "harness" and resolve_agent("auto", False) == "cluster"
    assert resolve_agent("ignore-cap", True) == "ignore-cap"
    with pytest.raises(HarnessError, match="runs the harness's agent, which checks simulated GPUs"):
        resolve_agent("harness", False)


def test_agent_counts_requests_by_verb_and_resource():
    assert request_key("PATCH", "https://h:6443/api/v1/nodes/n1/status") == "PATCH nodes/status"
    assert request_key("POST", "https://h/api/v1/namespaces/ns/pods/p/eviction") == "POST pods/eviction"
    assert request_key("GET", "https://h/api/v1/pods?fieldSelector=spec.nodeName%3Dn") == "GET pods"
    assert request_key("POST", "https://h/api/v1/namespaces/default/events") == "POST events"
    assert (request_key("GET", "https://h/apis/policy/v1/namespaces/x/poddisruptionbudgets")
            == "GET poddisruptionbudgets")


def test_default_and_smoke_preflight_profiles_are_consistent():
    for name in ("smoke", "nightly"):
        p = load_profile(name)
        assert p.preflight_inservice_faults > p.preflight_max_unavailable


def test_a_set_up_interrupted_midway_tears_down_and_attaches_the_agents_status(monkeypatch, tmp_path):
    """A run stopped during its set-up (Ctrl-C, a lost run Lease) undoes what it made: the agent is stopped
    and its status and log go to the report, as at the end of a module (a CI run once met a TypeError
    here instead: the interrupted path called the teardown without the report's attach)."""
    import types

    from clusterproof.preflight import run as preflight_run

    log = tmp_path / "agent.log"
    log.write_text("agent started\n")
    agent = types.SimpleNamespace(stopped=False, log=log, status=lambda: {"requests": 3})
    agent.stop = lambda: setattr(agent, "stopped", True)

    def interrupted(api, cluster, run, *_):
        run.agent = agent
        raise KeyboardInterrupt

    monkeypatch.setattr(preflight_run, "setup_simulated", interrupted)
    monkeypatch.setattr(preflight_run, "list_raw", lambda *a, **k: {"items": []})   # the run's Events: none
    attached = []
    cluster = types.SimpleNamespace(api=None, owned=True)
    with pytest.raises(KeyboardInterrupt):
        preflight_run.set_up(cluster, load_profile("smoke"), "run-1", print, None, attached.append)
    assert agent.stopped
    assert [a.name for a in attached] == ["preflight agent: status", "preflight agent: log"]
