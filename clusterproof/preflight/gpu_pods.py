"""The checker on GPU nodes: as a pod per real GPU node, or against the mock library; the GPU table.

Why a module: the suite cross-checks the cluster's preflight decisions with
the checker's own verdict per node, the same way on both kinds of cluster:

- real hardware (``--cp-kubeconfig``, ``--cp-allow-destructive``): a pod per idle
  GPU node, image ``preflight_image``, pinned to it as a DaemonSet pins its
  pods (node affinity on ``metadata.name``, through the scheduler; never
  ``nodeName``), tolerating exactly that node's taints -- it must also run on
  nodes under preflight or cordoned -- and asking for all of the node's GPUs
  (one whole node each), running ``python -m preflight check``; its log is
  the JSON verdict, its exit code 0/1/4 as the CLI's;
- simulated: the same command as one process for all nodes against the
  mock NVML library (``clusterproof.preflight.mock_nvml``), and the pod manifests sent to
  the API server as a server-side dry run, so they are proven admissible.

An image that cannot be pulled ends the check with one line naming the image
and the node. Everything here is removed with the test's namespace.
"""
from __future__ import annotations

import json

from kubernetes import client

from clusterproof.core.errors import HarnessError
from clusterproof.core.texttable import text_table
from clusterproof.core.waiting import wait_for
from clusterproof.kube.client import list_all, raw_request
from clusterproof.kube.pod_spec import pod_body, tolerating
from clusterproof.kube.pods import create_pods, explain_pods, list_pods, try_create
from clusterproof.preflight.contract import Marks, evictable
from clusterproof.preflight.mock_nvml import checker_env, library_dir, run_checker

CHECKER_LABEL = "clusterproof.io/preflight-checker"
IMAGE_ERRORS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
TABLE_COLUMNS = ("node", "gpu", "name", "bus_id", "temperature_c", "pcie", "ecc_uncorrected", "ecc_corrected",
                 "remapped_rows", "nvlinks", "clock_events", "xids", "verdict")


def gpus_of(node: dict) -> int:
    try:
        return int((node.get("status") or {}).get("allocatable", {}).get("nvidia.com/gpu", "0"))
    except ValueError:
        return 0


def idle_gpu_nodes(api: client.ApiClient) -> dict[str, dict]:
    """GPU nodes no workload pod runs on (the checker takes the whole node), by name."""
    busy = {p["spec"].get("nodeName") for p in list_pods(api, None).values() if evictable(p)}
    return {n["metadata"]["name"]: n for n in list_all(api, "/api/v1/nodes")
            if gpus_of(n) > 0 and n["metadata"]["name"] not in busy}


def checker_pod(name: str, run_id: str, node: dict, image: str, gpus: int, xid_window_ms: int) -> dict:
    """The checker for ``node`` (a Node object): its taints, the preflight taint among them, each tolerated exactly
    as read -- the harness's admission policies admit no wider toleration (docs/rbac.md), so a preflight controller
    that changes the taint's value before the pod is bound leaves it Pending (a timeout naming the node)."""
    taints = (node.get("spec") or {}).get("taints") or []
    node_name = node["metadata"]["name"]
    body = pod_body(name, run_id, gpus=gpus, labels={CHECKER_LABEL: node_name[:63]}, restart_policy="Never",
                    node=node_name, tolerations=tolerating(taints))
    c = body["spec"]["containers"][0]
    c["image"] = image
    c["command"] = ["python", "-m", "preflight", "check", "--expect-gpus", str(gpus),
                    "--xid-window-ms", str(xid_window_ms)]
    return body


def pod_outcome(pod: dict) -> tuple[str, str]:
    """('running' | 'done' | 'image-error', detail) of a checker pod. Pure."""
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_ERRORS:
            return "image-error", f"{waiting['reason']}: {(waiting.get('message') or '').strip()[:200]}"
        term = (cs.get("state") or {}).get("terminated")
        if term is not None:
            return "done", str(term.get("exitCode"))
    if status.get("phase") in ("Succeeded", "Failed"):
        return "done", "0" if status["phase"] == "Succeeded" else "1"
    return "running", status.get("phase") or "Pending"


def verdict_from_log(node: str, exit_code: str, log: str) -> dict:
    """The pod's verdict; a checker that could not run (exit 4) becomes a failed verdict with its line."""
    for line in reversed(log.strip().splitlines()):
        try:
            v = json.loads(line)
            if isinstance(v, dict) and "ok" in v:
                return {**v, "machine": node}
        except ValueError:
            continue
    last = log.strip().splitlines()[-1] if log.strip() else f"exit code {exit_code}, no output"
    return {"machine": node, "ok": False, "code": "nvml-unavailable", "gpus": [],
            "reasons": [{"check": "nvml", "code": "nvml-unavailable", "gpus": [], "message": last}]}


def run_checker_pods(api: client.ApiClient, ns: str, run_id: str, nodes: dict[str, dict], image: str,
                     marks: Marks, xid_window_ms: int, timeout: float) -> dict[str, dict]:
    """One checker pod per node; their verdicts by node. An unpullable image: HarnessError."""
    bodies = {name: checker_pod(f"preflight-{i}", run_id, node, image, gpus_of(node), xid_window_ms)
              for i, (name, node) in enumerate(sorted(nodes.items()))}
    create_pods(api, ns, list(bodies.values()))
    pod_of = {b["metadata"]["name"]: node for node, b in bodies.items()}

    def outcomes():
        pods = list_pods(api, ns, CHECKER_LABEL)
        out = {pod_of[n]: pod_outcome(p) for n, p in pods.items() if n in pod_of}
        bad = {node: d for node, (kind, d) in out.items() if kind == "image-error"}
        if bad:
            node, detail = sorted(bad.items())[0]
            raise HarnessError(f"preflight_image {image} cannot be pulled on node {node} ({detail}): set "
                               "preflight_image to an image your GPU nodes can pull "
                               "(see clusterproof/preflight/checker/Dockerfile)")
        return out

    def unfinished(o) -> list[str]:
        return [b["metadata"]["name"] for node, b in bodies.items() if o.get(node, ("",))[0] != "done"]
    done = wait_for(outcomes, until=lambda o: len(o) == len(bodies) and all(k == "done" for k, _ in o.values()),
                    timeout=timeout, interval=2, what=f"{len(bodies)} checker pod(s) finished",
                    explain=lambda o: explain_pods(api, ns, unfinished(o), len(bodies)))
    verdicts = {}
    for pod_name, node in pod_of.items():
        log = raw_request(api, "GET", f"/api/v1/namespaces/{ns}/pods/{pod_name}/log",
                          headers={"Accept": "application/json, */*"}).data.decode(errors="replace")
        verdicts[node] = verdict_from_log(node, done[node][1], log)
    return verdicts


def simulate_checker_pods(api: client.ApiClient, ns: str, run_id: str, nodes: dict[str, dict], faults,
                          marks: Marks, gpus: int, dry_run_sample: int = 5) -> tuple[dict[str, dict], list[str]]:
    """Simulated GPUs: the checker's verdicts (mock NVML, one process) and the pod manifests proven by a
    server-side dry run (a sample). Returns (verdicts, manifests the API server refused)."""
    refused = []
    for i, name in enumerate(sorted(nodes)[:dry_run_sample]):
        body = checker_pod(f"preflight-dry-{i}", run_id, nodes[name], "example.com/clusterproof-preflight:dry-run",
                           gpus, 0)
        _, err = try_create(api, ns, body, dry_run=True)
        if err is not None:
            refused.append(f"checker pod for {name}: {err.status} {err.reason}")
    run = run_checker(sorted(nodes), checker_env(faults, library_dir()), "--expect-gpus", str(gpus),
                      "--xid-window-ms", "0")
    if run.returncode == 4:
        raise HarnessError(f"the preflight checker could not run against the mock library: {run.stderr}")
    return run.verdicts, refused


def gpu_rows(verdicts: dict[str, dict]) -> list[dict]:
    """One row per GPU of every checked node (the report's GPU table). Pure."""
    rows = []
    for node, v in sorted(verdicts.items()):
        verdict = "pass" if v.get("ok") else (v.get("code") or "fail")
        for g in v.get("gpus") or [{}]:
            rr = g.get("remapped_rows") or {}
            rows.append({
                "node": node, "gpu": g.get("index", ""), "name": g.get("name", ""), "bus_id": g.get("bus_id", ""),
                "temperature_c": g.get("temperature_c", ""), "pcie": g.get("pcie", ""),
                "ecc_uncorrected": g.get("ecc_uncorrected", ""), "ecc_corrected": g.get("ecc_corrected", ""),
                "remapped_rows": (f"{rr.get('correctable', 0)}c/{rr.get('uncorrectable', 0)}u"
                                  + (" pending" if rr.get("pending") else "") + (" FAILED" if rr.get("failure") else "")
                                  if rr else ""),
                "nvlinks": f"{g['nvlinks_up']}/{g['nvlinks']}" if "nvlinks" in g else "",
                "clock_events": ",".join(g.get("clock_events") or []), "xids": ",".join(map(str, g.get("xids") or [])),
                "verdict": verdict if not g.get("error") else f"{verdict} ({g['error']})"})
    return rows


def render_table(rows: list[dict], limit: int = 400) -> str:
    table = text_table(TABLE_COLUMNS, [[r[c] for c in TABLE_COLUMNS] for r in rows[:limit]])
    if len(rows) > limit:
        table += f"\n... and {len(rows) - limit} more rows (all of them in the CSV)"
    return table


def table_csv(rows: list[dict]) -> str:
    import csv
    import io
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=TABLE_COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def cross_check(marks: Marks, nodes: dict[str, dict], verdicts: dict[str, dict]) -> tuple[list[str], list[str]]:
    """(violations, notes): a node the checker fails must be held back (tainted, labelled or cordoned);
    a node the cluster released must pass. A held-back node that passes now is a note, not a defect
    (a transient fault, or a repair not yet re-checked). Pure."""
    bad, notes = [], []
    for name, v in sorted(verdicts.items()):
        node = nodes.get(name)
        if node is None:
            continue
        held = marks.unpassed(node) or bool(node.get("spec", {}).get("unschedulable"))
        why = "; ".join(r.get("message", "") for r in v.get("reasons") or []) or "passed"
        if not v.get("ok") and not held:
            bad.append(f"node {name} is released, but its GPUs fail preflight ({v.get('code')}: {why})")
        elif v.get("ok") and held:
            notes.append(f"node {name} is held back ({marks.state(node)}) but passes preflight now")
    return bad, notes
