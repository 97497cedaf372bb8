"""Negative controls, bad input and cleanup for suites/test_gpu_preflight.py.

The suite runs as a user would run it (a subprocess, ``--cp-kubeconfig`` on this
session's embedded cluster: the existing-cluster backend, simulated, so the
harness's reference agent plays the preflight DaemonSet):

- an agent that ignores XID 79 (the whole suite): the decision check fails,
  naming the node with the XID 79 fault and the reason it should carry; the
  checker's agreement and the in-service drain fail on it too; the others
  pass beside them with their tables and figures (no
  healthy run of its own: the gate runs the suite whole on smoke beside the
  self-tests, and as a guest, tests/test_permissions.py);
- an agent that removes the taint before its checks finish: the waiting
  workloads land on nodes that had not passed; the whole-run watch names
  the pods and the nodes;
- a remediation that ignores the cap: the in-service check names every node
  that was out at once; one that deletes pods past their PodDisruptionBudget:
  the check names the budget and how few pods were left Ready;
- bad input (profile values, ``--cp-local-gpus`` without NVML): one line, exit 4;
- Ctrl-C in the middle of the in-service check, and a run killed with
  SIGKILL (the next run's sweeper): no scratch node, namespace, Event,
  agent process or fault file is left, and no planned node carries a
  preflight mark or a cordon it did not have.
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import psutil
import pytest

from clusterproof.cluster.nodes import node_bodies
from clusterproof.core.run import RUN_LABEL
from clusterproof.core.waiting import wait_for
from clusterproof.kube.client import list_raw
from clusterproof.kube.liveness import wait_expired
from clusterproof.preflight.contract import Marks
from tests.harness import (
    KILLED_RUN_LEASE,
    allure_figures,
    allure_results,
    assert_one_line,
    background_pytest,
    ended_early,
    interrupt,
    kill_run,
    run_leftovers,
    run_pytest,
)

pytestmark = [pytest.mark.control, pytest.mark.coscheduling]   # the session's cluster runs the gang scheduler
SUITE = "suites/test_gpu_preflight.py"
DECIDED = "test_faulty_nodes_stay_quarantined_with_their_reason_and_healthy_ones_are_released"
WAITING = "test_workloads_waiting_for_new_nodes_are_bound_only_to_released_ones"
IN_SERVICE = "test_nodes_going_bad_in_service_are_drained_within_the_cap_and_the_pdb"
EVER_BOUND = "test_no_workload_pod_was_ever_bound_to_a_node_that_had_not_passed"
CHECKER = "test_checker_on_every_gpu_node_agrees_with_the_clusters_decisions"
SCRATCH = r"cp-gpu-scratch-pf-[0-9a-z]+-[0-9a-f]+-\d+"


def _args(cluster, profile, run_id, *sets, select=None):
    return [SUITE, "--cp-kubeconfig", str(cluster.kubeconfig), "--cp-profile", profile.name, "--cp-run-id", run_id,
            "--cp-set=gang_scheduler_name=clusterproof-coscheduling",
            *(["-k", select] if select else []), *[f"--cp-set={s}" for s in sets]]


def _run(cluster, profile, tmp_path, *sets, select=None, timeout=900):
    run_id = f"pfctl-{os.urandom(2).hex()}"
    return run_id, run_pytest(_args(cluster, profile, run_id, *sets, select=select), tmp_path, timeout=timeout)


def leftovers(cluster, profile, session_run: str, run_id: str) -> list[str]:
    """Everything of ``run_id`` still on the cluster (its scratch nodes, namespaces, Events...), its agent
    process, and every planned node that carries a preflight mark or cordon the plan does not give it."""
    api, marks = cluster.api, Marks.from_profile(profile)
    left = run_leftovers(api, run_id)
    left += [f"agent process {p.pid}" for p in psutil.process_iter(["cmdline"])
             if "clusterproof.preflight.agent" in " ".join(p.info["cmdline"] or [])
             and run_id in (p.info["cmdline"] or [])]
    nodes = {n["metadata"]["name"]: n for n in list_raw(api, "/api/v1/nodes")["items"]}
    for body in node_bodies(profile, session_run):
        name = body["metadata"]["name"]
        node = nodes.get(name)
        if node is None:
            left.append(f"planned node {name} is gone")
            continue
        planned_taint = any(t["key"] == marks.taint_key for t in body["spec"]["taints"])
        if marks.tainted(node) != planned_taint or marks.label(node) or marks.reason(node) \
                or node["spec"].get("unschedulable") or marks.condition(node):
            left.append(f"planned node {name} carries a preflight mark or cordon ({marks.state(node)})")
    return left


def _assert_nothing_left(cluster, profile, session_run, run_id):
    wait_for(lambda: leftovers(cluster, profile, session_run, run_id), until=lambda left: not left,
             timeout=180, interval=1, what=f"nothing of run {run_id} left")


# --- negative controls ----------------------------------------------------------------------------------

def _negative(res, test):
    params = {p["value"] for p in res[test].get("parameters", [])}
    assert any("NEGATIVE CONTROL" in v for v in params), params


def test_agent_that_ignores_xid_79_fails_naming_the_node_and_the_reason(cluster, profile, run_id, tmp_path):
    """The whole suite: the checks that see the XID 79 node released fail (the decision, the checker's
    agreement, the in-service drain, whose faults include an XID 79); the others pass beside them, with their
    tables and figures (the gate runs the suite whole on smoke beside the self-tests, and as a guest: no healthy
    run here)."""
    rid, run = _run(cluster, profile, tmp_path, "preflight_agent=ignore-xid79")
    assert run.returncode == 1, run.output[-3000:]
    assert set(run.failures) == {DECIDED, CHECKER, IN_SERVICE} and len(run.passed) == 4, run.output[-3000:]
    assert re.search(rf"node {SCRATCH} is released, but its GPUs fail preflight \(xid-79: GPU 3: XID 79",
                     run.failures[CHECKER]), run.failures[CHECKER][:3000]
    res = allure_results(tmp_path)
    atts = {a["name"] for a in res[CHECKER]["attachments"]}
    assert {"GPU table (one row per GPU)", "GPU table (csv)"} <= atts, atts
    figs = allure_figures(tmp_path, res[DECIDED])
    assert "time to quarantine, p99" in figs and "nodes joined (faulty / healthy)" in figs, figs
    msg = run.failures.get(DECIDED, "")
    xid79 = set(re.findall(rf"node ({SCRATCH}) \(injected: XID 79 \(GPU fell off the bus\) on GPU 3\) was "
                           r"released; it must stay quarantined with reason xid-79", msg))
    assert len(xid79) == 1, msg[:3000]
    # Only the XID 79 node: every other fault is still caught.
    assert set(re.findall(rf"node ({SCRATCH}) \(injected: [^;]*\) was released", msg)) == xid79, msg[:3000]
    assert "Traceback" not in msg
    _negative(res, DECIDED)
    _assert_nothing_left(cluster, profile, run_id, rid)


def test_agent_that_removes_the_taint_before_checks_finish_is_caught_by_the_watch(cluster, profile, run_id,
                                                                                  tmp_path):
    rid, run = _run(cluster, profile, tmp_path, "preflight_agent=untaint-early", select="waiting or ever_bound")
    assert run.returncode == 1, run.output[-3000:]
    assert set(run.failures) == {WAITING, EVER_BOUND}, run.output[-3000:]
    pattern = (rf"pod cp-\w+-preflight-[0-9a-f]+/[\w-]+ was bound to node ({SCRATCH}) while it had not passed "
               rf"preflight \(label {re.escape(profile.preflight_label_key)}=pending\)")
    for test in (WAITING, EVER_BOUND):
        assert re.search(pattern, run.failures[test]), run.failures[test][:3000]
    _assert_nothing_left(cluster, profile, run_id, rid)


def test_remediation_that_ignores_the_cap_fails_naming_the_nodes_out_at_once(cluster, profile, run_id, tmp_path):
    rid, run = _run(cluster, profile, tmp_path, "preflight_agent=ignore-cap", select="in_service")
    assert run.returncode == 1, run.output[-3000:]
    msg = run.failures.get(IN_SERVICE, "")
    k, cap = profile.preflight_inservice_faults, profile.preflight_max_unavailable
    m = re.search(rf"(\d+) nodes were out of service at once \(cap preflight_max_unavailable={cap}\): "
                  rf"((?:{SCRATCH}(?:, )?)+)", msg)
    assert m and int(m[1]) == k and len(m[2].split(", ")) == k, msg[:3000]
    _assert_nothing_left(cluster, profile, run_id, rid)


def test_drain_that_ignores_the_pdb_fails_naming_the_budget(cluster, profile, run_id, tmp_path):
    """Not one of the issue's three: it proves the PodDisruptionBudget check can fail too."""
    rid, run = _run(cluster, profile, tmp_path, "preflight_agent=ignore-pdb", select="in_service")
    assert run.returncode == 1, run.output[-3000:]
    msg = run.failures.get(IN_SERVICE, "")
    replicas = profile.preflight_inservice_faults + 3
    m = re.search(rf"PodDisruptionBudget inservice \(minAvailable {replicas - 1}\) was overrun: only (\d+) of "
                  rf"{replicas} pods were Ready at", msg)
    assert m and int(m[1]) < replicas - 1, msg[:3000]
    _assert_nothing_left(cluster, profile, run_id, rid)


# --- bad input ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("setting,expected", [
    pytest.param("preflight_agent=lenient", "preflight_agent must be one of auto, harness, cluster, ignore-xid79",
                 id="unknown-agent"),
    pytest.param("preflight_inservice_faults=3", "preflight_inservice_faults (3) must be larger than "
                 "preflight_max_unavailable (3)", id="cap-never-tested"),
    pytest.param("preflight_join_nodes=10", "preflight_join_nodes=10 leaves", id="cohort-too-small"),
    pytest.param("preflight_condition_type=gpu-bad", "preflight_condition_type 'gpu-bad' must match",
                 id="condition-not-camel-case"),
    pytest.param("preflight_reason_label_key=clusterproof.io/preflight", "preflight_label_key and "
                 "preflight_reason_label_key are both", id="same-label-keys"),
])
def test_bad_preflight_profile_values_end_the_run_with_one_line(setting, expected, tmp_path):
    assert_one_line(run_pytest([SUITE, "--cp-profile", "smoke", f"--cp-set={setting}"], tmp_path, timeout=120),
                    expected)


def test_local_gpus_without_an_nvml_library_is_one_line(tmp_path):
    """No GPU on this machine: ``--cp-local-gpus`` asks for its real libnvidia-ml, which is not there."""
    run = run_pytest([SUITE, "--cp-profile", "smoke", "--cp-local-gpus", "-k", "this_machine"], tmp_path, timeout=120)
    assert_one_line(run, "local-gpus: preflight: no NVML library", "NVMLError_LibraryNotFound")


# --- nothing is left behind ----------------------------------------------------------------------------------

def _start(cluster, profile, tmp_path, rid, *sets, select=None):
    return background_pytest(_args(cluster, profile, rid, *sets, select=select), tmp_path)


def _wait_cordoned(cluster, proc, rid):
    """Until the run's agent has cordoned a node gone bad in service (the middle of the in-service check)."""
    def cordoned():
        ended_early(proc)
        return [n for n in list_raw(cluster.api, "/api/v1/nodes", {"labelSelector": f"{RUN_LABEL}={rid}"})["items"]
                if n["spec"].get("unschedulable") and "clusterproof.io/preflight" not in n["metadata"]["labels"]]
    wait_for(cordoned, timeout=300, interval=0.5, what=f"run {rid} cordoned a node gone bad in service")


def test_interrupted_run_leaves_no_node_mark_agent_or_event(cluster, profile, run_id, tmp_path, api_guard):
    rid = f"pfctl-{os.urandom(2).hex()}"
    with _start(cluster, profile, tmp_path, rid, select="in_service") as proc:
        _wait_cordoned(cluster, proc, rid)
        interrupt(proc, api_guard)
    _assert_nothing_left(cluster, profile, run_id, rid)
    assert not list(Path(tempfile.gettempdir()).glob(f"cp-preflight-{rid}-*")), "the run's fault file is left"


def test_next_run_sweeps_what_a_killed_run_left(cluster, profile, run_id, api_guard, tmp_path):
    """SIGKILL: nothing can clean up. The agent dies with the harness; the next run's sweeper removes
    the scratch nodes and the Events once the killed run's Lease has expired."""
    rid = f"pfdead-{os.urandom(2).hex()}"
    with _start(cluster, profile, tmp_path, rid, KILLED_RUN_LEASE, select="in_service") as proc:
        _wait_cordoned(cluster, proc, rid)
        kill_run(proc, api_guard, gone=lambda: not [
            p.pid for p in psutil.process_iter(["cmdline"])
            if rid in (p.info["cmdline"] or []) and "clusterproof.preflight.agent" in " ".join(p.info["cmdline"])])
    left = run_leftovers(cluster.api, rid)
    assert any(x.startswith("scratch node") for x in left), left   # the kill really left something
    wait_expired(cluster.api, rid, timeout=60)
    (tmp_path / "next").mkdir()
    sweeper, run = _run(cluster, profile, tmp_path / "next", select="under_preflight")
    assert run.returncode == 0, run.output[-3000:]
    assert re.search(rf"sweep: removed: nodes/{SCRATCH} \(run {rid}: lease", run.output), run.output[-3000:]
    assert f"removed the work directories of dead runs: cp-preflight-{rid}-" in run.output, run.output[-3000:]
    assert not list(Path(tempfile.gettempdir()).glob(f"cp-preflight-{rid}-*")), "the killed run's fault file is left"
    _assert_nothing_left(cluster, profile, run_id, rid)
    _assert_nothing_left(cluster, profile, run_id, sweeper)
