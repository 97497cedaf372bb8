"""GPU preflight on a real node: the checker as a pod from its image, the decision from its verdict.

Why: this is the path a real GPU node takes -- a node joins under
preflight (label and taint ``pending``), a checker pod from
``preflight_image`` runs on it (NVML handed in by the node's GPU runtime,
``clusterproof.cluster.gpu_runtime``), its verdict (the container's log, read through
kube-apiserver from the real kubelet) decides: released, or quarantined with
its reason (taint kept, cordoned, label, condition, Event). The decision is
written by the harness's reference agent (``clusterproof.preflight.agent.Agent``,
the same code that decides for the kwok nodes), here fed by the pod's
verdict instead of an in-process NVML call. What the node's GPUs say is the
fault the run injected into the node's simulated GPUs (the fault file the
node's runtime hands in), so the verdict can be checked against the truth.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clusterproof.core.waiting import wait_for
from clusterproof.kube.client import get_if_present, load_client
from clusterproof.kube.node_taints import patch_node
from clusterproof.kube.pods import delete_selected
from clusterproof.preflight.contract import PENDING, Marks
from clusterproof.preflight.gpu_pods import CHECKER_LABEL, run_checker_pods
from clusterproof.preflight.mock_nvml import FaultFile
from clusterproof.preflight.run import node_events


@dataclass
class Round:
    node: str
    injected: str | None            # fault kind (None: healthy)
    expected_code: str              # what the checker must answer ('' = pass)
    verdict: dict
    decision: str                   # released | quarantined
    after: dict                     # the node object after the decision
    problems: list[str]


def _agent(kubeconfig: Path, marks: Marks, run_id: str, gpus: int):
    from clusterproof.preflight.agent import Agent, parse
    args = parse(["--kubeconfig", str(kubeconfig), "--scope", "clusterproof.io/node-kind=real", "--run-id", run_id,
                  "--status", "/dev/null", "--label-key", marks.label_key, "--taint-key", marks.taint_key,
                  "--reason-key", marks.reason_key, "--condition-type", marks.condition_type,
                  "--event-reason", marks.event_reason, "--expect-gpus", str(gpus)])
    return Agent(load_client(str(kubeconfig)), args)


def put_under_preflight(api, node: str, marks: Marks) -> None:
    """The node as it joins: label pending, the preflight taint, schedulable (what a new GPU node carries)."""
    def body(n):
        taints = [t for t in n["spec"].get("taints") or [] if t.get("key") != marks.taint_key] + [marks.taint]
        return {"metadata": {"labels": {marks.label_key: PENDING, marks.reason_key: None}},
                "spec": {"taints": taints, "unschedulable": None}}
    patch_node(api, node, body)


def restore(api, node: str, marks: Marks) -> None:
    """The node released and schedulable again, its preflight condition cleared (the end of the check)."""
    def body(n):
        kept = [t for t in n["spec"].get("taints") or [] if t.get("key") != marks.taint_key]
        return {"metadata": {"labels": {marks.label_key: None, marks.reason_key: None}},
                "spec": {"taints": kept or None, "unschedulable": None}}
    patch_node(api, node, body)
    if marks.condition_type:
        from clusterproof.kube.client import raw_request
        from clusterproof.preflight.agent import STRATEGIC, now_iso
        raw_request(api, "PATCH", f"/api/v1/nodes/{node}/status", headers=STRATEGIC, body={
            "status": {"conditions": [{"type": marks.condition_type, "status": "False", "reason": "Passed",
                                       "message": "GPU preflight passed", "lastTransitionTime": now_iso(),
                                       "lastHeartbeatTime": now_iso()}]}}).data


def run_round(api, kubeconfig: Path, faults_path: Path, ns: str, run_id: str, node: str, kind: str | None,
              image: str, marks: Marks, gpus: int, xid_window_ms: int, timeout: float) -> Round:
    """Inject ``kind`` into the node's GPUs, put the node under preflight, run the checker pod, decide."""
    faults = FaultFile(faults_path)
    faults.set({node: kind})
    expected = faults.expected_code(node)
    put_under_preflight(api, node, marks)
    obj = get_if_present(api, f"/api/v1/nodes/{node}")
    try:
        verdicts = run_checker_pods(api, ns, run_id, {node: obj}, image, marks, xid_window_ms, timeout)
    finally:
        delete_selected(api, ns, CHECKER_LABEL, what="checker pods")
    verdict = verdicts[node]
    agent = _agent(kubeconfig, marks, run_id, gpus)
    decision = {"ok": verdict.get("ok"), "code": verdict.get("code") or "",
                "message": "; ".join(r.get("message", "") for r in verdict.get("reasons") or []) or "passed"}
    if verdict.get("ok"):
        agent.release(node, decision)
        done = "released"
    else:
        agent.quarantine(node, decision)
        done = "quarantined"
    after = wait_for(lambda: get_if_present(api, f"/api/v1/nodes/{node}"),
                     until=lambda n: marks.label(n) != PENDING, timeout=30, interval=0.5,
                     what=f"node {node} decided")
    problems = []
    got = verdict.get("code") or ""
    if verdict.get("code") == "nvml-unavailable":
        held = "held back, not released" if marks.state(after) != "released" else "RELEASED"
        problems.append(f"node {node}: the checker pod could not use NVML "
                        f"({decision['message'][:400]}) -- the node is {marks.state(after)} ({held})")
    elif got != expected:
        problems.append(f"node {node}: injected {kind or 'nothing'}, the checker pod answered "
                        f"{got or 'pass'} (expected {expected or 'pass'})")
    if expected:
        problems += marks.quarantine_problems(after, expected,
                                           node_events(api, marks.event_reason).get(node, []))
    elif verdict.get("ok"):
        problems += marks.release_problems(after)
    if not verdict.get("ok") and marks.state(after) == "released":
        problems.append(f"node {node} was released although its checker failed")
    return Round(node, kind, expected, verdict, done, after, problems)

