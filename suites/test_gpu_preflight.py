"""GPU preflight: a node whose GPUs fail preflight stays tainted and cordoned and gets no work; a healthy
one is released.

New GPU nodes join with the preflight taint and label; only a passing check
removes them. Nodes that go bad later are cordoned and drained, within the
PodDisruptionBudgets and never more than ``preflight_max_unavailable`` at
once. What is checked (taint, labels, condition and Event names from the
profile, ``clusterproof/preflight/contract.py``):

1. every node that joins under preflight is decided within
   ``preflight_quarantine_timeout_s``: exactly the nodes with an injected GPU
   fault (XIDs 79/48/94, lost or missing GPU, uncorrectable ECC, row remap
   failed or pending, NVLink down, PCIe x8, overheating, hardware slowdown)
   keep the taint, are cordoned and carry their reason (label, condition,
   Event); every healthy node is released, also those with benign conditions
   (application XIDs, corrected ECC, power cap, an idle link at gen1);
2. whole-node workloads waiting for the new nodes (plain pods, a Job, a
   Coscheduling gang) are bound only to released nodes;
3. more nodes than the cap go bad in service at once: each is cordoned and
   drained within ``preflight_remediation_timeout_s`` (of its fault, or of a
   slot freeing up), never more than the cap are out at once, and a
   PodDisruptionBudget never has fewer pods ready than it allows;
4. the checker, run on every node, agrees with the cluster's decisions: on
   real GPU nodes a pod per idle node (``preflight_image``; destructive), on
   simulated ones the same command against the mock NVML library (the pod
   manifests proven by a server-side dry run); a per-GPU table is attached;
5. nodes under preflight run no workload pods and failed ones say why
   (observational, any cluster);
6. no workload pod was ever bound to a node that had not passed, watched
   for the whole module.
And the checker on the machine the harness runs on (``--cp-local-gpus``: the
real ``libnvidia-ml``; otherwise the mock, and the report says so).

On the embedded cluster the harness started, its reference agent plays the
cluster's preflight DaemonSet and remediation (``clusterproof/preflight/agent.py``:
the real checker with real pynvml against each node's simulated GPUs); on any
other cluster (real hardware, or kwok nodes someone else runs) the cluster's
own machinery is tested. Joining and going bad need nodes the harness adds and
GPUs it can break: checks 1-3 run on the harness's own cluster only. Negative controls:
tests/test_gpu_preflight_controls.py -- an agent that ignores XID 79 (check
1 fails naming the node and the reason), one that removes the taint before
its checks finish (checks 2 and 6 name the pods bound to unchecked nodes),
a remediation that ignores the cap (check 3 names the nodes out at once),
a drain that deletes pods past their PodDisruptionBudget (check 3 names the
budget).
"""
from __future__ import annotations

import allure
import pytest

from clusterproof.core.errors import HarnessError
from clusterproof.core.waiting import WaitTimeout, wait_for
from clusterproof.fixtures import EXTRA_ENV
from clusterproof.kube.pods import list_pods
from clusterproof.preflight.contract import evictable, is_workload
from clusterproof.preflight.gpu_pods import (
    cross_check,
    gpu_rows,
    idle_gpu_nodes,
    render_table,
    run_checker_pods,
    simulate_checker_pods,
    table_csv,
)
from clusterproof.preflight.mock_nvml import FAULTS, checker_env, library_dir, run_checker
from clusterproof.preflight.phases import SAYS_WHY_S, go_bad_in_service, settle_join, what
from clusterproof.preflight.run import WAIT_LABEL, remove_waiting_workloads
from clusterproof.report.plots import Plot, Series

SHOW = 10


def _names(items: list[str]) -> str:
    more = f"; and {len(items) - SHOW} more" if len(items) > SHOW else ""
    return "; ".join(items[:SHOW]) + more


def _simulated(run):
    if not run.owned:
        pytest.skip("joining nodes and GPU faults are the harness's own (kwok nodes, mock NVML): it adds nodes and "
                    "breaks their GPUs only on the embedded cluster it started (no --cp-kubeconfig); here checks 4-6 "
                    "cover the cluster's own preflight machinery")
    return run


def _node(run, name: str) -> dict | None:
    return run.watch.nodes.get(name)


def _decision_plot(run, decided: dict[str, float], bound: float) -> None:
    order = {n: i for i, n in enumerate(run.names)}
    series = [Series(label, [(order[n], decided[n]) for n in run.names
                             if n in decided and (run.faults.expected_code(n) != "") == faulty])
              for label, faulty in (("faulty: quarantined", True), ("healthy: released", False))]
    Plot("Time from join to preflight decision, per node", "node (join order)", "time to decision (s)",
         series, {f"bound (preflight_quarantine_timeout_s = {bound:g} s)": bound}).attach()


# --- 1. joining nodes -------------------------------------------------------------------------

@pytest.mark.smoke
def test_faulty_nodes_stay_quarantined_with_their_reason_and_healthy_ones_are_released(
        preflight, cluster, profile, figures):
    """Every node that joins under preflight is decided within ``preflight_quarantine_timeout_s``: the nodes with an
    injected GPU fault keep the taint, are cordoned and say why (label, condition, Event), and every healthy node is
    released. Red: the nodes decided wrongly, late or without their reason are named."""
    run = _simulated(preflight)
    bound = profile.preflight_quarantine_timeout_s
    out = settle_join(cluster.api, run, bound)
    status = run.agent.counts() if run.agent else None
    faulty = sum(1 for n in run.names if run.faults.expected_code(n))
    figures.add("nodes joined (faulty / healthy)", len(run.names), f"nodes ({faulty} faulty)")
    figures.add("time to quarantine, p50", out.quarantine_p(50), "s")
    figures.add("time to quarantine, p99", out.quarantine_p(99), "s", bound, headline=True)
    figures.add("time to release, p99", out.release_p99_s, "s", bound)
    if status is not None and status.checks:
        figures.add("checker time per node (agent, mock NVML)", status.check_ms_per_node, "ms")
    _decision_plot(run, out.decided_s, bound)
    allure.attach("\n".join(f"{n}: {run.marks.state(_node(run, n) or {'metadata': {}})} ({what(run, n)})"
                            for n in run.names), "joining nodes: state and injected fault", allure.attachment_type.TEXT)
    assert not out.problems, f"{len(out.problems)} preflight decision problem(s): " + _names(out.problems)


@pytest.mark.smoke
@pytest.mark.coscheduling
def test_workloads_waiting_for_new_nodes_are_bound_only_to_released_ones(preflight, cluster, profile, run_id, figures):
    """Whole-node workloads waiting for the new nodes (plain pods, a Job, a Coscheduling gang) are bound, and only to
    nodes that passed preflight. Red: a pod landed on a node still under preflight or failed (named), or never
    bound."""
    run = _simulated(preflight)
    api, marks, total = cluster.api, run.marks, sum(run.waiting.values())
    allure.dynamic.parameter("waiting workloads", f"{run.waiting} ({run.gang_note})", excluded=True)
    bad = []
    try:
        def bound():
            run.alive()
            pods = list_pods(api, run.namespace, WAIT_LABEL)
            return {n: p["spec"].get("nodeName") for n, p in pods.items() if not p["metadata"].get("deletionTimestamp")}
        try:
            placed = wait_for(bound, until=lambda b: len(b) == total and all(b.values()),
                              timeout=profile.preflight_quarantine_timeout_s + profile.gang_unschedulable_flush_s,
                              interval=1, what=f"{total} waiting whole-node pods bound")
        except WaitTimeout as e:
            bad.append(str(e))
            placed = bound()
        bad += run.watch.violations()      # the moment of the bind first, then where the pods are now
        for pod, node in sorted(placed.items()):
            state = marks.state(_node(run, node)) if node and _node(run, node) else None
            if node and state != "released":
                bad.append(f"pod {run.namespace}/{pod} is on node {node}, which is {state} "
                           f"({what(run, node)}; reason {marks.reason(_node(run, node))})")
        figures.add("waiting pods bound", sum(1 for v in placed.values() if v), "pods", total, op="==")
    finally:
        remove_waiting_workloads(api, run, run_id)   # the in-service check needs the nodes
    assert not bad, f"{len(bad)} waiting pod(s) bound where they may not be: " + _names(bad)


# --- 3. going bad in service -----------------------------------------------------------------------

@pytest.mark.smoke
def test_nodes_going_bad_in_service_are_drained_within_the_cap_and_the_pdb(preflight, cluster, profile, namespace,
                                                                           run_id, figures):
    """More nodes than ``preflight_max_unavailable`` go bad in service at once: each is cordoned and drained within
    ``preflight_remediation_timeout_s``, never more than the cap are out at once, and no PodDisruptionBudget is
    broken. Red: the remediation ignored the cap or a budget, or was late (the nodes are named)."""
    run = _simulated(preflight)
    cap, bound = profile.preflight_max_unavailable, profile.preflight_remediation_timeout_s
    out = go_bad_in_service(cluster.api, run, profile, namespace, run_id)
    allure.attach("\n".join(f"{n}: {FAULTS[kind].what}" for n, kind in out.victims.items())
                  + "".join(f"\nwave {i + 1}: {', '.join(w)}" for i, w in enumerate(out.waves)),
                  f"{len(out.victims)} nodes going bad in service at once (cap {cap})", allure.attachment_type.TEXT)
    status = run.agent.counts() if run.agent else None
    figures.add("most nodes out of service at once", out.most_out, "nodes", cap)
    figures.add("time to cordon, p99", out.cordon_p99_s, "s")
    figures.add("time to cordon and drain, p99", out.drained_p99_s, "s", bound)
    figures.add("fewest ReplicaSet pods Ready", out.fewest_ready, "pods", out.replicas - 1, op=">=")
    if status is not None:
        figures.add("evictions refused by the PDB (429, retried)", status.evictions_refused_429, "evictions")
        figures.add("evictions answered 504, PDB update conflicts (retried)", status.evictions_conflict_504,
                    "evictions")
    assert not out.problems, f"{len(out.problems)} in-service remediation problem(s): " + _names(out.problems)


# --- 4. the checker on every node agrees with the cluster ------------------------------------------

@pytest.mark.smoke
@pytest.mark.destructive  # real hardware: a checker pod takes each idle GPU node whole
def test_checker_on_every_gpu_node_agrees_with_the_clusters_decisions(preflight, cluster, profile, namespace,
                                                                       run_id, figures):
    """The checker, run on every GPU node (a pod per idle node on real hardware, the mock NVML on simulated ones),
    agrees with the cluster's decisions; the per-GPU table is attached. Red: a node the cluster released fails the
    checker, or one it holds back passes (named)."""
    run, api, marks = preflight, cluster.api, preflight.marks
    if cluster.owned:
        nodes = {n: _node(run, n) for n in run.names if _node(run, n) is not None}
        verdicts, refused = simulate_checker_pods(api, namespace, run_id, nodes, run.faults.path, marks,
                                                  profile.node_gpus)
        allure.dynamic.tag("checker:mock-nvml")
        allure.dynamic.parameter("GPUs checked", "SIMULATED: go-nvml's mock DGX H100 machines through the project's "
                                 "libnvidia-ml.so.1 (no GPU here); checker pod manifests proven by server-side dry run",
                                 excluded=True)
    elif cluster.simulated:
        pytest.skip("every node is a kwok node of a cluster the harness did not start: no container runs there, so a "
                    "checker pod has no GPU to check; the embedded cluster (no --cp-kubeconfig) checks its nodes' "
                    "simulated GPUs, a cluster of real GPU nodes with preflight_image set runs a checker pod on each")
    else:
        if not profile.preflight_image:
            pytest.skip("preflight_image is empty: name an image with this repository's preflight package and "
                        "nvidia-ml-py (clusterproof/preflight/checker/Dockerfile) to run the checker on the real GPU "
                        "nodes")
        nodes = idle_gpu_nodes(api)
        if not nodes:
            pytest.skip("no idle GPU node (nvidia.com/gpu allocatable, no workload pod) to run the checker on")
        try:
            verdicts = run_checker_pods(api, namespace, run_id, nodes, profile.preflight_image, marks,
                                        profile.preflight_xid_window_ms, profile.preflight_pod_timeout_s)
        except HarnessError as e:
            pytest.exit(f"clusterproof: {e}", returncode=4)
        refused = []
        allure.dynamic.tag("checker:real-gpus")
        allure.dynamic.parameter("GPUs checked", f"REAL HARDWARE: a checker pod ({profile.preflight_image}) per idle "
                                 "GPU node", excluded=True)
    rows = gpu_rows(verdicts)
    allure.attach(render_table(rows), "GPU table (one row per GPU)", allure.attachment_type.TEXT)
    allure.attach(table_csv(rows), "GPU table (csv)", allure.attachment_type.CSV)
    bad, notes = cross_check(marks, nodes, verdicts)
    bad += refused
    missing = sorted(set(nodes) - set(verdicts))
    if missing:
        bad.append(f"no verdict for {len(missing)} node(s): {', '.join(missing[:SHOW])}")
    if notes:
        allure.attach("\n".join(notes), "held back but passing now", allure.attachment_type.TEXT)
    failing = sum(1 for v in verdicts.values() if not v.get("ok"))
    figures.add("nodes checked", len(verdicts), f"nodes ({failing} failing)")
    assert not bad, f"{len(bad)} node(s) where the checker and the cluster disagree: " + _names(bad)


# --- 5. observational, any cluster ---------------------------------------------------------------------

def _unpassed_problems(run) -> tuple[list[str], int, int]:
    """(problems, nodes under preflight, nodes failed) on the nodes that have not passed, right now."""
    marks = run.marks
    nodes = {n["metadata"]["name"]: n for n in run.watch.nodes.snapshot()}
    on: dict[str, list[str]] = {}
    for p in run.watch.pods.snapshot():
        if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp") and evictable(p) \
                and is_workload(p, marks.taint_key):
            on.setdefault(p["spec"]["nodeName"], []).append(f"{p['metadata']['namespace']}/{p['metadata']['name']}")
    bad, under, failed = [], 0, 0
    for name, node in sorted(nodes.items()):
        if marks.label(node) == "pending" or marks.tainted(node):
            under += 1
            bad += [f"pod {pod} runs on node {name}, which is under preflight ({marks.state(node)})"
                    for pod in on.get(name, [])]
        if marks.label(node) == "failed" or (marks.reason(node) and not marks.out_of_service(node)):
            failed += 1
            if not marks.tainted(node) and not node["spec"].get("unschedulable"):
                bad.append(f"node {name} failed preflight ({marks.reason(node)}) but is neither tainted nor cordoned")
            if not marks.reason(node):
                bad.append(f"node {name} failed preflight but has no {marks.reason_key} label saying why")
            elif marks.condition_type and not marks.condition(node):
                bad.append(f"node {name} failed preflight ({marks.reason(node)}) but has no {marks.condition_type} "
                           "condition")
    return bad, under, failed


@pytest.mark.smoke
def test_nodes_under_preflight_run_no_workload_and_failed_ones_say_why(preflight, figures):
    """Nodes under preflight run no workload pod, and every node that failed it is tainted or cordoned and
    says why (label, condition). Observational, safe on any cluster. Red: the pod or the node is named."""
    # A node caught between two writes of a decision (the label and cordon, then the condition) gets
    # SAYS_WHY_S to complete it.
    run = preflight
    try:
        bad, under, failed = wait_for(lambda: _unpassed_problems(run), until=lambda r: not r[0],
                                      timeout=SAYS_WHY_S, interval=1, what="no problem on unpassed nodes")
    except WaitTimeout:
        bad, under, failed = _unpassed_problems(run)
    if not under and not failed:
        pytest.skip(f"no node is under preflight ({run.marks.taint_key}) or failed it: nothing to observe")
    figures.add("nodes under preflight / failed", under, f"under preflight, {failed} failed")
    assert not bad, f"{len(bad)} problem(s) on nodes that have not passed: " + _names(bad)


@pytest.mark.smoke
def test_no_workload_pod_was_ever_bound_to_a_node_that_had_not_passed(preflight, figures):
    """No workload pod was ever bound to a node that had not passed preflight, by the whole module's watch
    of every pod and node (checked last, so it covers every check above). Red: each such bind is named."""
    watch = preflight.watch
    watch.check()
    found = watch.violations()
    figures.add("workload pods bound while watched", len(watch.binds), "pods")
    assert not found, f"{len(found)} workload pod(s) bound to nodes that had not passed: " + _names(found)


# --- the machine the harness runs on ----------------------------------------------------------------------

@pytest.mark.smoke
def test_checker_passes_on_this_machine(pytestconfig, figures):
    """The checker passes on this machine: with ``--cp-local-gpus`` its GPUs through its own libnvidia-ml (real
    hardware); without it, a healthy simulated machine through the project's mock library (the report says
    which). Red: this machine fails preflight, with the checker's reasons."""
    if pytestconfig.option.cp_local_gpus:
        env, what = checker_env(None, None), "REAL HARDWARE: this machine's GPUs (--cp-local-gpus)"
        allure.dynamic.tag("real-hardware")
    else:
        env = checker_env(None, library_dir())
        what = "SIMULATED: mock NVML library (pass --cp-local-gpus for real GPUs)"
        allure.dynamic.tag("simulated")
    allure.dynamic.parameter("GPUs checked", what, excluded=True)
    pytestconfig.stash.setdefault(EXTRA_ENV, {})["gpu.local"] = what
    run = run_checker(None, env)
    if run.returncode == 4:
        pytest.exit(f"clusterproof: --cp-local-gpus: {run.stderr}", returncode=4)
    (name, v), = run.verdicts.items()
    rows = gpu_rows({name: v})
    allure.attach(render_table(rows), "GPU table (this machine)", allure.attachment_type.TEXT)
    figures.add("GPUs", len(v.get("gpus") or []), "GPUs")
    assert v["ok"], f"this machine ({name}) fails preflight: " + "; ".join(r["message"] for r in v["reasons"])
