"""A wait on pods that runs out says what the cluster said about them, never "last seen: Pending".

- ``pod_story`` (pure): a pod's phase, the reason it gives itself, each
  container's waiting/terminated reason and message, its conditions that are
  not True and its latest distinct Events, in one bounded line -- for the
  three ways a pod stays Pending in practice: the scheduler finds no node
  (FailedScheduling), the node may not pull its image (ErrImageNeverPull),
  the node's runtime cannot make its sandbox (FailedCreatePodSandBox);
- ``wait_for(explain=...)`` puts that line in the failure instead of the raw
  state, and falls back to the state when the explanation itself fails;
- negative control against the session cluster: a pod whose node selector
  no node matches, waited for with a short bound, fails naming the
  scheduler's "0/N nodes are available" verdict, not "Pending";
- a wait for pods to go reads their metadata only (a PartialObjectMetadataList,
  not the full pods), and still sees every pod until it is gone.
"""
from __future__ import annotations

import json

import pytest

from clusterproof.core.run import RUN_LABEL
from clusterproof.core.waiting import WaitTimeout, wait_for
from clusterproof.kube.client import METADATA_ONLY, get_if_present, request_data
from clusterproof.kube.pod_spec import pod_body
from clusterproof.kube.pods import (
    POD_LINE,
    create_pods,
    delete_pods,
    delete_selected,
    explain_pods,
    pod_metadata,
    pod_story,
    pods_path,
)


def _event(reason, message, count=1, who="kubelet", at="2026-11-27T10:00:00Z", uid="u1"):
    return {"metadata": {"creationTimestamp": at}, "involvedObject": {"kind": "Pod", "uid": uid}, "reason": reason,
            "message": message, "count": count, "source": {"component": who}, "lastTimestamp": at}


def _pod(phase="Pending", node=None, containers=(), conditions=(), reason=None, message=None):
    status = {"phase": phase, "conditions": list(conditions), "containerStatuses": list(containers)}
    if reason:
        status.update(reason=reason, message=message)
    return {"metadata": {"name": "p", "uid": "u1"}, "spec": {"nodeName": node} if node else {}, "status": status}


UNREADY = [{"type": "Ready", "status": "False", "reason": "ContainersNotReady",
            "message": "containers with unready status: [main]"},
           {"type": "PodScheduled", "status": "True"}]


@pytest.mark.cluster
def test_an_image_the_node_may_not_pull_is_named():
    waiting = {"name": "main", "state": {"waiting": {
        "reason": "ErrImageNeverPull",
        "message": 'Container image "example.invalid/none:1" is not present with pull policy of Never'}}}
    line = pod_story("ns/p", _pod(node="real-0", containers=[waiting], conditions=UNREADY),
                     [_event("Scheduled", "Successfully assigned ns/p to real-0", who="default-scheduler",
                             at="2026-11-27T09:59:59Z"),
                      _event("ErrImageNeverPull", 'Container image "example.invalid/none:1" is not present with '
                                                  "pull policy of Never", count=4),
                      _event("Failed", "Error: ErrImageNeverPull", count=4)])
    assert line.startswith("pod ns/p: Pending on real-0; container main waiting: ErrImageNeverPull: Container "
                           'image "example.invalid/none:1" is not present'), line
    assert "Ready=False (ContainersNotReady" in line and "PodScheduled" not in line, line
    assert "Events: " in line and "Failed x4 (kubelet): Error: ErrImageNeverPull" in line, line


@pytest.mark.unit
def test_the_runtimes_sandbox_error_on_the_node_is_named():
    creating = {"name": "main", "state": {"waiting": {"reason": "ContainerCreating"}}}
    sandbox = ('Failed to create pod sandbox: rpc error: code = Unknown desc = failed to create containerd task: '
               'failed to create shim task: OCI runtime create failed: runc create failed: unable to start '
               'container process: error during container init: cgroup mountpoint does not exist: unknown')
    line = pod_story("ns/p", _pod(node="real-0", containers=[creating], conditions=UNREADY),
                     [_event("FailedCreatePodSandBox", sandbox, count=12)])
    assert "container main waiting: ContainerCreating" in line, line
    assert "FailedCreatePodSandBox x12 (kubelet): Failed to create pod sandbox: rpc error" in line, line
    assert len(line) <= POD_LINE


@pytest.mark.unit
def test_a_pod_no_node_takes_carries_the_schedulers_verdict():
    verdict = ("0/100 nodes are available: 100 node(s) didn't match Pod's node affinity/selector. preemption: "
               "0/100 nodes are available: 100 Preemption is not helpful for scheduling.")
    pod = _pod(conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": verdict}])
    line = pod_story("ns/p", pod, [_event("FailedScheduling", verdict, count=3, who="default-scheduler")])
    assert line.startswith("pod ns/p: Pending, not bound to a node; PodScheduled=False (Unschedulable: 0/100 nodes "
                           "are available"), line
    assert "FailedScheduling x3 (default-scheduler): 0/100 nodes are available" in line, line


@pytest.mark.unit
def test_a_gone_pod_a_terminated_container_and_a_pod_reason_are_said():
    assert pod_story("ns/p", None, [_event("TaintManagerEviction", "Marking for deletion Pod ns/p",
                                           who="taint-eviction-controller")]) == (
        "pod ns/p: gone from the API; Events: TaintManagerEviction (taint-eviction-controller): Marking for "
        "deletion Pod ns/p")
    done = {"name": "checker", "state": {"terminated": {"exitCode": 4, "reason": "Error",
                                                        "message": "libnvidia-ml.so.1: cannot open shared object"}}}
    line = pod_story("ns/p", _pod("Failed", "real-0", [done], reason="UnexpectedAdmissionError",
                                  message="Allocate failed due to no healthy devices present"))
    assert ("Failed on real-0 (UnexpectedAdmissionError: Allocate failed due to no healthy devices present); "
            "container checker terminated exit 4: Error: libnvidia-ml.so.1") in line, line
    assert line.endswith("Events: none"), line


@pytest.mark.unit
def test_the_line_is_bounded_and_events_are_latest_first_and_distinct():
    events = [_event("BackOff", "Back-off pulling image " + "x" * 5000, at=f"2026-11-27T10:00:{i:02d}Z")
              for i in range(10)] + [_event(f"Reason{i}", f"said {i}", at=f"2026-11-27T09:00:{i:02d}Z")
                                     for i in range(10)]
    line = pod_story("ns/p", _pod(), events)
    assert "x" * 100 + "..." in line and "x" * 300 not in line, line      # each piece is cut
    assert line.count("BackOff") == 1, line        # the same reason and message once, with its latest time
    many = [{"name": f"c{i}", "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "y" * 400}}}
            for i in range(10)]
    line = pod_story("ns/p", _pod(containers=many), events)
    assert len(line) == POD_LINE and line.endswith("..."), len(line)       # and so is the line
    short = pod_story("ns/p", _pod(), [_event(f"Reason{i}", f"said {i}", at=f"2026-11-27T09:00:{i:02d}Z")
                                       for i in range(10)])
    assert "Reason9" in short and "Reason7" in short and "Reason6" not in short, short


@pytest.mark.unit
def test_a_wait_that_runs_out_says_the_explanation_not_the_state():
    state = {"status": {"phase": "Pending"}, "spec": {"containers": [{"name": "x" * 50}]}}
    with pytest.raises(WaitTimeout) as caught:
        wait_for(lambda: state, until=lambda s: False, timeout=0.05, interval=0.01, what="the pod Running",
                 explain=lambda s: "pod ns/p: Pending, not bound to a node; Events: FailedScheduling: 0/3 nodes")
    msg = str(caught.value)
    assert msg == ("the pod Running: not reached within 0.05 s; pod ns/p: Pending, not bound to a node; Events: "
                   "FailedScheduling: 0/3 nodes"), msg

    def broken(_):
        raise ConnectionError("API server gone")
    with pytest.raises(WaitTimeout, match=r"last seen: \{'status'.*\(no explanation: ConnectionError: API server"):
        wait_for(lambda: state, until=lambda s: False, timeout=0.05, interval=0.01, what="x", explain=broken)


@pytest.mark.cluster
def test_a_pod_that_cannot_be_scheduled_is_explained_by_the_scheduler_not_as_pending(cluster, namespace, run_id):
    """Negative control on the session cluster: nothing matches the pod's node selector."""
    api = cluster.api
    create_pods(api, namespace, [pod_body("nowhere", run_id, node_selector={"example.com/no-such-pool": "x"})])
    try:
        with pytest.raises(WaitTimeout) as caught:
            # Until the scheduler's verdict is on the pod: only that is what the control is about.
            wait_for(lambda: get_if_present(api, f"/api/v1/namespaces/{namespace}/pods/nowhere"),
                     until=lambda p: (p or {}).get("status", {}).get("phase") == "Running", timeout=15, interval=0.5,
                     what="pod nowhere Running", explain=lambda _: explain_pods(api, namespace, ["nowhere"]))
        msg = str(caught.value)
        assert "last seen" not in msg and '"metadata"' not in msg and json.dumps(namespace) not in msg, msg
        assert f"pod {namespace}/nowhere: Pending, not bound to a node" in msg, msg
        assert "Unschedulable" in msg and "nodes are available" in msg and "node affinity/selector" in msg, msg
        assert "FailedScheduling" in msg, msg
    finally:
        delete_pods(api, namespace, ["nowhere"])


@pytest.mark.cluster
def test_a_wait_for_pods_to_go_reads_their_metadata_only(cluster, namespace, run_id):
    """The server answers the wait's LIST with the pods' metadata only (red if it sent whole pods: the Accept
    header ignored), and the wait still sees each pod, terminating or not, until it is gone."""
    api, mine = cluster.api, f"{RUN_LABEL}={run_id}"
    create_pods(api, namespace, [pod_body(f"m-{i}", run_id) for i in range(3)])
    try:
        raw = json.loads(request_data(api, "GET", pods_path(namespace), {"labelSelector": mine}, headers=METADATA_ONLY))
        assert raw["kind"] == "PartialObjectMetadataList", raw["kind"]
        assert all(set(i) == {"kind", "apiVersion", "metadata"} for i in raw["items"]), raw["items"][0]
        assert sorted(m["name"] for m in pod_metadata(api, namespace, mine)) == ["m-0", "m-1", "m-2"]
        delete_selected(api, namespace, mine, timeout=120)
        assert pod_metadata(api, namespace, mine) == []
    finally:
        delete_pods(api, namespace, [f"m-{i}" for i in range(3)])
