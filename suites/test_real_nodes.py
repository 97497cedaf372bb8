"""Real nodes in the loop: a real kubelet and containerd beside the kwok nodes.

Each check here runs on the embedded cluster's real nodes (profile key
``real_nodes``; ``clusterproof/cluster/realnodes.py``): containers really start, the
kubelet itself admits and kills them, and its own identity renews its node
Lease. What is real and what is simulated, said on every page:

- REAL: kubelet (built at the cluster's version), containerd and runc
  (Debian), container images (built on this machine), pod sandboxes, CNI,
  taint admission and eviction, the node's API identity and its heartbeats.
- SIMULATED: the GPUs. The node's GPU runtime hands each container that asks
  for GPUs the project's mock ``libnvidia-ml.so.1`` (go-nvml's DGX H100
  machines), where a real node's NVIDIA container toolkit hands in the
  driver's. The checker pod from ``preflight_image`` is otherwise the exact
  path of a real GPU node.

A real container's start-up is measured in the burst suite's steady phase,
beside the kwok pods' and under the same load (``clusterproof.burst.measure.RealNodePods``),
held to the same pod-startup SLO. The API overload suite's lease check covers
the real node's Lease during the flood.

Negative controls (tests/test_real_node_controls.py): a node whose runtime
hands in no NVML library (``real_node_nvml: false``) must fail the preflight
check, naming the node and the library, with the node held back; kubelets
running as the admin (``real_node_identity: false``) must fail the
classification check; a kubelet killed mid-suite is named by the control-plane
guard as a dead component.
"""
from __future__ import annotations

import json
import subprocess

import allure
import pytest

from clusterproof.cluster import realnodes
from clusterproof.cluster.realnode_config import LEASE_DURATION_S, RealNode
from clusterproof.cluster.realnode_measure import (
    CheckerRounds,
    audited_heartbeats,
    flows_text,
    judge_heartbeats,
    renewals_audited,
)
from clusterproof.core.waiting import WaitTimeout, wait_for
from clusterproof.kube.client import get_if_present, list_raw
from clusterproof.kube.node_taints import add_taint, remove_taint
from clusterproof.kube.pods import create_pods, delete_pods, explain_pods
from clusterproof.kube.podtimeline import startup_server_s
from clusterproof.preflight.contract import Marks
from clusterproof.preflight.real import restore, run_round
from clusterproof.provision import hostpkgs
from clusterproof.report.plots import Plot, Series

INJECTED = "ecc-uncorrectable"    # a fault the checker finds without waiting for XID events
EVICT_TAINT = "clusterproof.io/evict-check"


@pytest.fixture(scope="module")
def real(cluster):
    if cluster.real is None:
        pytest.skip("no real node in this cluster: real nodes join only the embedded cluster "
                    "(profile key real_nodes; on a real cluster every node is real and "
                    "test_gpu_preflight runs the checker pod there)")
    allure.dynamic.tag("nodes:real")
    return cluster.real


# --- 1. GPU preflight through a checker pod on a real node --------------------------------------

@pytest.mark.smoke
def test_the_checker_pod_on_each_real_node_finds_the_injected_fault_and_the_node_is_held_back(
        real, cluster, profile, namespace, run_id, figures):
    """Each real node joins under preflight twice: first with a fault injected into its simulated GPUs
    (the checker pod must find it and the node must stay quarantined with its reason), then healthy
    (the checker pod must pass it and the node must be released). The checker runs from
    ``preflight_image`` as built on this machine, NVML handed in by the node's GPU runtime. Red: the node
    and what the checker or the cluster decided are named."""
    marks = Marks.from_profile(profile)
    image = real.images["checker"].digest_ref   # pinned by digest: exactly the image built here
    allure.dynamic.parameter("GPUs checked", f"REAL kubelet and container ({image}); GPUs SIMULATED (mock NVML "
                             "handed in by the node's GPU runtime, as the NVIDIA container toolkit would)",
                             excluded=True)
    faults = realnodes.faults_file(cluster.kwok.directory)
    run = CheckerRounds()
    try:
        for node in real.names:
            for kind in (INJECTED, None):
                run.timed(lambda node=node, kind=kind: run_round(
                    cluster.api, cluster.kubeconfig, faults, namespace, run_id, node, kind, image, marks, real.gpus,
                    profile.preflight_xid_window_ms, profile.preflight_pod_timeout_s))
    finally:
        for node in real.names:
            restore(cluster.api, node, marks)
    allure.attach("\n".join(f"{r.node}: injected {r.injected or 'nothing'} -> checker pod answered "
                            f"{r.verdict.get('code') or 'pass'} -> {r.decision}" for r in run.rounds),
                  "rounds (node, injected fault, the pod's verdict, the decision)", allure.attachment_type.TEXT)
    allure.attach(json.dumps([r.verdict for r in run.rounds], indent=1), "checker pod verdicts (json)",
                  allure.attachment_type.JSON)
    figures.add("checker pod round (pod created to decision), max", run.round_max_s, "s")
    assert not run.problems, (f"{len(run.problems)} problem(s) with preflight on real nodes: "
                              + "; ".join(run.problems))


# --- 2. the kubelet enforces taints itself ----------------------------------------------------------

def _tasks(node: RealNode) -> set[str]:
    out = subprocess.run([hostpkgs.binary("ctr"), "--address", str(node.socket), "-n", "k8s.io", "tasks", "ls", "-q"],
                         capture_output=True, text=True, timeout=30)
    return set(out.stdout.split())


@pytest.mark.smoke
def test_a_noexecute_taint_kills_the_running_container_and_the_kubelet_refuses_an_untolerating_pod(
        real, cluster, namespace, run_id):
    """A NoExecute taint on a real node: its running container is evicted and really stopped (containerd has
    no task for it any more), and a pod bound to the node without tolerating the taint is refused by the
    kubelet's own admission (never started). Red: the container kept running, or the pod was started."""
    api, rn = cluster.api, real.nodes[0]
    image = real.images["pause"].digest_ref
    victim = realnodes.pod_on("evict-victim", run_id, rn.name, image)
    create_pods(api, namespace, [victim])
    pod = wait_for(lambda: get_if_present(api, f"/api/v1/namespaces/{namespace}/pods/evict-victim"),
                   until=lambda p: startup_server_s(p or {}) is not None, timeout=60, interval=0.5,
                   what="the victim container running on the real node",
                   explain=lambda _: explain_pods(api, namespace, ["evict-victim"]))
    cid = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    assert cid in _tasks(rn), f"containerd on {rn.name} does not run the victim's container {cid[:12]}"
    taint = {"key": EVICT_TAINT, "value": run_id[:63], "effect": "NoExecute"}
    problems = []
    add_taint(api, rn.name, taint, run_id)
    try:
        try:
            wait_for(lambda: get_if_present(api, f"/api/v1/namespaces/{namespace}/pods/evict-victim"),
                     until=lambda p: p is None, timeout=90, interval=0.5, what="the victim pod evicted")
        except WaitTimeout:
            problems.append(f"pod evict-victim still on {rn.name} 90 s after a NoExecute taint it does not tolerate")
        try:
            wait_for(lambda: _tasks(rn), until=lambda t: cid not in t, timeout=60, interval=0.5,
                     what="the victim's container stopped")
        except WaitTimeout:
            problems.append(f"container {cid[:12]} still runs on {rn.name} after its pod was evicted")
        # Bound straight to the node (no scheduler): only the kubelet's admission stands in the way.
        refused = realnodes.pod_on("refused", run_id, rn.name, image)
        refused["spec"].pop("affinity", None)
        refused["spec"]["nodeName"] = rn.name
        create_pods(api, namespace, [refused])
        # The taint-eviction controller deletes such a pod within a second; the kubelet's refusal is its Event.
        try:
            said = wait_for(lambda: _pod_events(api, namespace, "refused"),
                            until=lambda evs: any(e["from"] == "kubelet" and e["reason"] == "TaintToleration"
                                                  for e in evs), timeout=60, interval=0.5,
                            what="the kubelet's TaintToleration refusal of the untolerating pod")
        except WaitTimeout:
            said = _pod_events(api, namespace, "refused")
            problems.append(f"the kubelet on {rn.name} did not refuse a pod that does not tolerate "
                            f"{EVICT_TAINT}:NoExecute (its Events: "
                            + ("; ".join(f"{e['from']} {e['reason']}" for e in said) or "none") + ")")
        allure.attach("\n".join(f"{e['from']}: {e['reason']}: {e['message']}" for e in said),
                      "the untolerating pod's Events", allure.attachment_type.TEXT)
        if any(e["reason"] == "Started" for e in said):
            problems.append("the untolerating pod's container was started")
    finally:
        remove_taint(api, rn.name, taint, run_id)
        delete_pods(api, namespace, ["evict-victim", "refused"])
    assert not problems, "; ".join(problems)


def _pod_events(api, namespace: str, pod: str) -> list[dict]:
    items = list_raw(api, f"/api/v1/namespaces/{namespace}/events",
                     {"fieldSelector": f"involvedObject.name={pod}"})["items"]
    return [{"from": (e.get("source") or {}).get("component") or e.get("reportingComponent") or "",
             "reason": e.get("reason", ""), "message": e.get("message", "")} for e in items]


# --- 3. API Priority and Fairness sees a kubelet ------------------------------------------------------

@pytest.mark.smoke
def test_the_real_kubelets_requests_are_classified_as_a_nodes_and_its_lease_never_lapses(real, cluster, figures):
    """Every request of a real kubelet is classified into a node flow (``system-node-high`` or
    ``system-nodes``, never ``exempt``), its Lease and status writes come from its own ``system:node:<name>``,
    and its Lease was renewed all session long with no gap longer than its duration. Red: the kubelet runs
    under the wrong identity or flow, or its Lease lapsed."""
    # The flow: the flow schema the API server named in each response to the kubelet. The identity: the
    # API server's audit log. "All session long" includes the API overload suite's flood, which runs
    # before this module.
    schemas = {fs["metadata"]["uid"]: fs["metadata"]["name"] for fs in
               list_raw(cluster.api, "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas")["items"]}
    # A short run (this module alone) may have seen one renewal so far: renewals come every 10 s.
    try:
        events = wait_for(lambda: audited_heartbeats(cluster.kwok.audit_log, real.names),
                          until=lambda evs: renewals_audited(evs, real.names),
                          timeout=LEASE_DURATION_S + 10, interval=2, what="real node Lease renewals audited")
    except WaitTimeout:
        events = audited_heartbeats(cluster.kwok.audit_log, real.names)
    beats = judge_heartbeats(real.names, events, schemas, cluster.kwok.directory)
    for name, lease in beats.leases.items():
        Plot(f"Lease renewals of {name} (real kubelet)", "time since its first renewal (s)",
             "gap since the previous renewal (s)",
             [Series("renewal", [(t - lease.times[0], g) for t, g in zip(lease.times[1:], lease.gaps)])],
             {f"Lease duration ({LEASE_DURATION_S} s)": LEASE_DURATION_S}).attach()
    allure.attach("\n".join(f"{n}: {flows_text(f)}" for n, f in beats.flows.items()),
                  "flow schemas of the real kubelets' requests (responses counted)", allure.attachment_type.TEXT)
    allure.attach("\n".join(f"{n}: {r.count} renewals over {r.span_s:.0f} s, longest gap {r.longest_gap_s:.1f} s"
                            for n, r in beats.leases.items()),
                  "Lease renewals per real node", allure.attachment_type.TEXT)
    if beats.leases:
        figures.add("real node Lease renewal, longest gap", beats.longest_gap_s, "s", LEASE_DURATION_S)
    assert not beats.problems, "; ".join(beats.problems)

