"""Real nodes in the loop: a real kubelet and containerd beside the kwok nodes.

Each check here runs on the embedded cluster's real nodes (profile key
``real_nodes``; ``fixtures/realnodes.py``): containers really start, the
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
import time

import allure
import pytest

from fixtures import hostpkgs, realnodes
from fixtures.kube import get_if_present, list_raw
from fixtures.node_taints import add_taint, remove_taint
from fixtures.pod_spec import pod_body
from fixtures.pods import create_pods, delete_pods, list_pods
from fixtures.preflight_contract import Marks
from fixtures.real_preflight import restore, run_round
from fixtures.stats import percentile
from fixtures.waiting import WaitTimeout, wait_for
from reports.plots import Figure, Series
from reports.plugin import measured

POD_STARTUP_SLO_S = 5.0          # Kubernetes' pod startup SLO (p99, image already present)
STARTUP_PODS = 6                  # per node kind
REAL = "real (kubelet + containerd)"
KWOK = "simulated (kwok)"
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


def _tolerate_real() -> list[dict]:
    return [{"key": realnodes.REAL_NODE_TAINT["key"], "operator": "Exists"}]


def _real_pod(name: str, run_id: str, node: str, image: str, tolerations: list[dict] | None = None) -> dict:
    body = pod_body(name, run_id, tolerations=tolerations if tolerations is not None else _tolerate_real(),
                    hostnames=[node])
    c = body["spec"]["containers"][0]
    c["image"], c["imagePullPolicy"] = image, "IfNotPresent"
    # Requests only: a real container under the simulated pods' 10m CPU limit gets 1 ms of CPU per 100 ms,
    # and runc's own start-up inside the pod's cgroup then takes 5-6 s (measured here).
    c["resources"].pop("limits", None)
    body["spec"]["terminationGracePeriodSeconds"] = 5
    return body


def _started_s(pod: dict) -> float | None:
    """created -> Ready, from the pod's own timestamps (API server and kubelet, one host clock; 1 s resolution)."""
    from fixtures.podtimeline import _condition_time, _epoch
    created = _epoch(pod["metadata"].get("creationTimestamp"))
    ready = _condition_time(pod.get("status") or {}, "Ready")
    return None if created is None or ready is None else ready - created


# --- 1. GPU preflight through a checker pod on a real node --------------------------------------

@pytest.mark.smoke
def test_the_checker_pod_on_each_real_node_finds_the_injected_fault_and_the_node_is_held_back(
        real, cluster, profile, namespace, run_id):
    """Each real node joins under preflight twice: first with a fault injected into its simulated GPUs
    (the checker pod must find it and the node must stay quarantined with its reason), then healthy
    (the checker pod must pass it and the node must be released). The checker runs from
    ``preflight_image`` as built on this machine, NVML handed in by the node's GPU runtime."""
    marks = Marks.from_profile(profile)
    image = real.images["checker"].digest_ref   # pinned by digest: exactly the image built here
    allure.dynamic.parameter("GPUs checked", f"REAL kubelet and container ({image}); GPUs SIMULATED (mock NVML "
                             "handed in by the node's GPU runtime, as the NVIDIA container toolkit would)")
    faults = realnodes.faults_file(cluster.kwok.directory)
    rounds, problems, seconds = [], [], []
    try:
        for node in real.names:
            for kind in (INJECTED, None):
                t0 = time.monotonic()
                r = run_round(cluster.api, cluster.kubeconfig, faults, namespace, run_id, node, kind, image, marks,
                              real.gpus, profile.preflight_xid_window_ms, profile.preflight_pod_timeout_s)
                seconds.append(time.monotonic() - t0)
                rounds.append(r)
                problems += r.problems
    finally:
        for node in real.names:
            restore(cluster.api, node, marks)
    allure.attach("\n".join(f"{r.node}: injected {r.injected or 'nothing'} -> checker pod answered "
                            f"{r.verdict.get('code') or 'pass'} -> {r.decision}" for r in rounds),
                  "rounds (node, injected fault, the pod's verdict, the decision)", allure.attachment_type.TEXT)
    allure.attach(json.dumps([r.verdict for r in rounds], indent=1), "checker pod verdicts (json)",
                  allure.attachment_type.JSON)
    measured("checker pod round (pod created to decision), max", max(seconds) if seconds else None, "s")
    assert not problems, f"{len(problems)} problem(s) with preflight on real nodes: " + "; ".join(problems)


# --- 2. pod startup: a real container beside kwok's ----------------------------------------------

@pytest.mark.smoke
def test_real_containers_and_kwok_pods_start_within_the_pod_startup_slo(real, cluster, namespace, run_id):
    """Created -> Ready for pods on a real node (sandbox, CNI, container start; image present) and for the
    same pods on kwok nodes, side by side; the pod startup SLO (p99 <= 5 s) applies to both. As in the burst
    suite's steady phase, the node's first pod ever (its QoS cgroups, CNI bridge and first sandbox are made
    then) is a warm-up: measured and reported, not held to the SLO."""
    api, node = cluster.api, real.names[0]
    image = real.images["pause"].digest_ref
    warm = _real_pod("startup-warm-up", run_id, node, image)
    create_pods(api, namespace, [warm])
    try:
        first = wait_for(lambda: get_if_present(api, f"/api/v1/namespaces/{namespace}/pods/startup-warm-up"),
                         until=lambda p: _started_s(p or {}) is not None, timeout=120, interval=0.5,
                         what="the warm-up pod Ready on the real node")
    finally:
        delete_pods(api, namespace, ["startup-warm-up"])
    measured(f"pod startup, first pod on the node (warm-up), {REAL}", _started_s(first), "s")
    bodies = {REAL: [_real_pod(f"startup-real-{i}", run_id, node, image) for i in range(STARTUP_PODS)],
              KWOK: [pod_body(f"startup-kwok-{i}", run_id) for i in range(STARTUP_PODS)]}
    for b in bodies[KWOK]:
        b["metadata"]["labels"]["clusterproof.io/startup"] = "kwok"
    for b in bodies[REAL]:
        b["metadata"]["labels"]["clusterproof.io/startup"] = "real"
    create_pods(api, namespace, bodies[REAL] + bodies[KWOK])
    names = [b["metadata"]["name"] for bs in bodies.values() for b in bs]
    try:
        pods = wait_for(lambda: list_pods(api, namespace, "clusterproof.io/startup"),
                        until=lambda ps: all(_started_s(ps.get(n, {})) is not None for n in names),
                        timeout=120, interval=1, what=f"{len(names)} startup pods Ready")
    finally:
        delete_pods(api, namespace, names)
    times = {kind: sorted(_started_s(pods[b["metadata"]["name"]]) for b in bs) for kind, bs in bodies.items()}
    on_kwok = {pods[b["metadata"]["name"]]["spec"].get("nodeName") for b in bodies[KWOK]}
    assert node not in on_kwok, f"a kwok startup pod landed on real node {node} (its taint did not keep it off)"
    Figure("Pod startup, created to Ready, per pod: real node beside kwok nodes", "pod (sorted by startup time)",
           "created to Ready (s, 1 s resolution)",
           [Series(kind, [(i, t) for i, t in enumerate(ts)]) for kind, ts in times.items()],
           {f"pod startup SLO ({POD_STARTUP_SLO_S:g} s, p99)": POD_STARTUP_SLO_S}).attach()
    for kind, ts in times.items():
        measured(f"pod startup p99, {kind}", percentile(ts, 99), "s", POD_STARTUP_SLO_S)
    slow = {kind: percentile(ts, 99) for kind, ts in times.items() if percentile(ts, 99) > POD_STARTUP_SLO_S}
    assert not slow, "pod startup p99 above the 5 s SLO: " + ", ".join(f"{k} {v:.0f} s" for k, v in slow.items())


# --- 3. the kubelet enforces taints itself ----------------------------------------------------------

def _tasks(node: realnodes.RealNode) -> set[str]:
    out = subprocess.run([hostpkgs.binary("ctr"), "--address", str(node.socket), "-n", "k8s.io", "tasks", "ls", "-q"],
                         capture_output=True, text=True, timeout=30)
    return set(out.stdout.split())


@pytest.mark.smoke
def test_a_noexecute_taint_kills_the_running_container_and_the_kubelet_refuses_an_untolerating_pod(
        real, cluster, namespace, run_id):
    """A NoExecute taint on a real node: its running container is evicted and really stopped (containerd has
    no task for it any more), and a pod bound to the node without tolerating the taint is refused by the
    kubelet's own admission (never started)."""
    api, rn = cluster.api, real.nodes[0]
    image = real.images["pause"].digest_ref
    victim = _real_pod("evict-victim", run_id, rn.name, image)
    create_pods(api, namespace, [victim])
    pod = wait_for(lambda: get_if_present(api, f"/api/v1/namespaces/{namespace}/pods/evict-victim"),
                   until=lambda p: _started_s(p or {}) is not None, timeout=60, interval=0.5,
                   what="the victim container running on the real node")
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
        refused = _real_pod("refused", run_id, rn.name, image)
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


# --- 4. API Priority and Fairness sees a kubelet ------------------------------------------------------

def _heartbeats(audit_log, names: list[str]) -> list[dict]:
    """The real nodes' Lease and node-status writes the apiserver audited (fixtures.realnodes.audit_rules)."""
    out = []
    try:
        lines = audit_log.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:
            continue
        ref = e.get("objectRef") or {}
        if ref.get("name") in names and ref.get("resource") in ("leases", "nodes") and e.get("stage") == "ResponseComplete":
            out.append(e)
    return out


NODE_FLOWS = {"system-node-high", "system-nodes"}   # the stock FlowSchemas of group system:nodes
MIN_RENEWALS = 3


@pytest.mark.smoke
def test_the_real_kubelets_requests_are_classified_as_a_nodes_and_its_lease_never_lapses(real, cluster):
    """API Priority and Fairness puts every request of a real kubelet into a node flow: ``system-node-high``
    (its Lease renewals and node status, priority level ``node-high``) or ``system-nodes``, never ``exempt``
    -- read from the flow schema the API server named in each response to the kubelet. Every Lease renewal
    and node status write comes from ``system:node:<name>`` (the API server's audit log), and the Lease was
    renewed all session long (the API overload suite's flood included, which runs before this module) with
    no gap longer than its duration."""
    schemas = {fs["metadata"]["uid"]: fs["metadata"]["name"] for fs in
               list_raw(cluster.api, "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas")["items"]}
    # A short run (this module alone) may have seen one renewal so far: renewals come every 10 s.
    try:
        events = wait_for(lambda: _heartbeats(cluster.kwok.audit_log, real.names),
                          until=lambda evs: all(sum(1 for e in evs if e["objectRef"]["name"] == n
                                                    and e["objectRef"]["resource"] == "leases") >= MIN_RENEWALS
                                                for n in real.names),
                          timeout=realnodes.LEASE_DURATION_S + 10, interval=2, what="real node Lease renewals audited")
    except WaitTimeout:
        events = _heartbeats(cluster.kwok.audit_log, real.names)
    problems, rows, flows = [], [], {}
    for name in real.names:
        log = cluster.kwok.directory / "logs" / f"{realnodes.kubelet_component(name)}.log"
        got = {schemas.get(uid, uid if uid == realnodes.UNCLASSIFIED else f"unknown uid {uid}"): n
               for uid, n in realnodes.flow_schema_uids(log).items()}
        flows[name] = got
        if "system-node-high" not in got:
            problems.append(f"node {name}: none of its kubelet's {sum(got.values())} responses was classified "
                            f"system-node-high (its flows: {_flows(got)})")
        elsewhere = {k: v for k, v in got.items() if k not in NODE_FLOWS and k != realnodes.UNCLASSIFIED}
        if elsewhere:
            problems.append(f"node {name}: {sum(elsewhere.values())} of its kubelet's requests were classified "
                            f"outside the node flows: {_flows(elsewhere)}")
        evs = [e for e in events if e["objectRef"]["name"] == name]
        foreign = [e for e in evs if e["user"].get("username") != f"system:node:{name}"
                   and e.get("userAgent", "").startswith("kubelet")]
        if foreign:
            problems.append(f"node {name}: {len(foreign)} heartbeats came from {foreign[0]['user'].get('username')}, "
                            f"not system:node:{name}")
        leases = [e for e in evs if e["objectRef"]["resource"] == "leases"]
        if len(leases) < MIN_RENEWALS:
            problems.append(f"node {name}: {len(leases)} Lease renewal(s) audited")
            continue
        times = sorted(_epoch_us(e["stageTimestamp"]) for e in leases)
        gaps = [b - a for a, b in zip(times, times[1:])]
        rows.append((name, len(leases), times[-1] - times[0], max(gaps)))
        Figure(f"Lease renewals of {name} (real kubelet)", "time since its first renewal (s)",
               "gap since the previous renewal (s)",
               [Series("renewal", [(t - times[0], g) for t, g in zip(times[1:], gaps)])],
               {f"Lease duration ({realnodes.LEASE_DURATION_S} s)": realnodes.LEASE_DURATION_S}).attach()
        if max(gaps) > realnodes.LEASE_DURATION_S:
            problems.append(f"node {name}: its Lease went {max(gaps):.0f} s without renewal "
                            f"(duration {realnodes.LEASE_DURATION_S} s)")
    allure.attach("\n".join(f"{n}: {_flows(f)}" for n, f in flows.items()),
                  "flow schemas of the real kubelets' requests (responses counted)", allure.attachment_type.TEXT)
    allure.attach("\n".join(f"{n}: {c} renewals over {s:.0f} s, longest gap {g:.1f} s" for n, c, s, g in rows),
                  "Lease renewals per real node", allure.attachment_type.TEXT)
    if rows:
        measured("real node Lease renewal, longest gap", max(r[3] for r in rows), "s", realnodes.LEASE_DURATION_S)
    assert not problems, "; ".join(problems)


def _flows(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])) or "none"


def _epoch_us(value: str) -> float:
    import datetime as dt
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
