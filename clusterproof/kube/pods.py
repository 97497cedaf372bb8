"""Pods on the API: create many at once, read them, their events, and delete them for good.

Why a module: every suite creates pods concurrently, asks the scheduler's
verdict (events) and removes its pods before it ends. Three rules live here
once:

- events belong to a pod by ``involvedObject.uid``, never by name: a pod
  deleted and created again under the same name must not inherit the
  verdicts about its predecessor;
- "pods deleted" means gone from the API, not merely terminating (a
  terminating pod still holds its node);
- a delete that finds nothing (404) is not an error (``delete_if_present``);
- a wait on pods that runs out says what the cluster said about them
  (``explain_pods``: phase, conditions, container states, Events, one
  bounded line), never "last seen: Pending" or the pod's JSON.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

from kubernetes import client

from clusterproof.core.errors import HarnessError
from clusterproof.core.run import RUN_LABEL
from clusterproof.core.waiting import wait_for
from clusterproof.kube.apicalls import refused_by_own_policy, refused_by_rbac
from clusterproof.kube.client import (
    api_message,
    create_object,
    delete_each,
    delete_if_present,
    get_if_present,
    list_all,
    list_metadata,
    list_raw,
    raw_request,
)

# explain_pods: each piece of what was said is cut to PIECE characters, a pod's line to POD_LINE, and at most
# SHOW_PODS pods and SHOW_EVENTS of each one's latest distinct Events are shown.
PIECE = 220
POD_LINE = 900
SHOW_PODS = 3
SHOW_EVENTS = 3


def pods_path(ns: str) -> str:
    return f"/api/v1/namespaces/{ns}/pods"


def create_pods(api: client.ApiClient, ns: str, bodies: list[dict], workers: int = 24) -> dict[str, dict]:
    """Create pods concurrently, in order; return them as admitted, by name.

    24 workers: the client's connection pool (32 on the embedded cluster) also
    serves the watches that follow them.
    """
    def create(body: dict) -> dict:
        # create_object: a create whose connection broke is sent again, and our own first attempt
        # (a 409 on a pod bearing our marks) is taken for what it is. Strict field validation: a field this
        # server does not know (1.35's spec.workloadRef on a 1.37 server) is refused, not silently dropped --
        # a gang member without its membership would be a plain pod judged as a gang's.
        return create_object(api, pods_path(ns), body, {"fieldValidation": "Strict"})
    with ThreadPoolExecutor(max_workers=min(workers, max(1, len(bodies)))) as pool:
        return {p["metadata"]["name"]: p for p in pool.map(create, bodies)}


def try_create(api: client.ApiClient, ns: str, body: dict,
               dry_run: bool = False) -> tuple[dict | None, client.ApiException | None]:
    """Create one pod; an admission refusal (4xx) is a result here, not an error. A refusal by RBAC is
    not a result (the harness was not allowed to ask), nor one by the harness's own admission policies (it sent a
    shape they do not admit, or the cluster's admission made its pod into one): one line, HarnessError."""
    try:
        return json.loads(raw_request(api, "POST", pods_path(ns), {"dryRun": "All"} if dry_run else None,
                                      body=body).data), None
    except client.ApiException as e:
        if e.status >= 500:
            raise
        if refused_by_rbac(e):
            raise HarnessError(f"the harness may not create pods in namespace {ns} ({api_message(e)}): grant it "
                               "(clusterproof/kube/rbac.yaml: clusterproof-pool in the pool, clusterproof-team in team "
                               "namespaces)") from None
        own = refused_by_own_policy(e)
        if own:
            raise HarnessError(f"the harness's own admission policy refused its pod {body['metadata']['name']} in "
                               f"namespace {ns} ({own}): the cluster's verdict on it cannot be told; if the pod as "
                               "built carries none of what was refused, the cluster's own admission added it") from None
        return None, e


def list_pods(api: client.ApiClient, ns: str | None, selector: str | None = None) -> dict[str, dict]:
    """Pods by name (in ``ns``, or ``namespace/name`` across all namespaces), terminating ones included."""
    path = pods_path(ns) if ns else "/api/v1/pods"
    items = list_raw(api, path, {"labelSelector": selector} if selector else None)["items"]
    return {(p["metadata"]["name"] if ns else f"{p['metadata']['namespace']}/{p['metadata']['name']}"): p
            for p in items}


def terminating(pod: dict | None) -> bool:
    """Gone, or on its way out (a deletion timestamp)."""
    return pod is None or bool(pod["metadata"].get("deletionTimestamp"))


def pod_events(api: client.ApiClient, ns: str, reason: str, pods: dict[str, dict]) -> dict[str, list[str]]:
    """Messages of ``reason`` events about ``pods`` (name -> pod as created), by pod name, oldest first.

    Matched by ``involvedObject.uid``: a pod created again under an old name
    does not inherit what was said about its predecessor. Some controllers
    record no uid (the taint-eviction controller names only namespace/name):
    such an event belongs to the pod of that name only if it was recorded
    after that pod was created.
    """
    items = list_raw(api, f"/api/v1/namespaces/{ns}/events",
                     {"fieldSelector": f"reason={reason},involvedObject.kind=Pod"})["items"]
    when = lambda e: e.get("lastTimestamp") or e.get("eventTime") or e["metadata"].get("creationTimestamp") or ""  # noqa: E731
    items.sort(key=when)
    by_uid = {p["metadata"]["uid"]: name for name, p in pods.items()}
    out: dict[str, list[str]] = {}
    for e in items:
        ref = e["involvedObject"]
        name = by_uid.get(ref.get("uid", ""))
        if name is None and not ref.get("uid") and ref.get("name") in pods:
            born = pods[ref["name"]]["metadata"].get("creationTimestamp") or ""
            name = ref["name"] if when(e)[:19] >= born[:19] else None
        if name is not None:
            out.setdefault(name, []).append(e.get("message") or e.get("note") or "")
    return out


def pod_metadata(api: client.ApiClient, ns: str, selector: str | None = None) -> list[dict]:
    """The metadata of the pods in ``ns`` (``selector``'s), terminating ones included: what a wait for pods to
    go reads (``clusterproof.kube.client.list_metadata``). Of 4,000 pods: 8.3 MB against a full LIST's 15.3
    (their managedFields stay), 0.12-0.15 CPU-s of kube-apiserver against 0.25-0.26, 0.40-0.44 of the
    harness's against 0.69-0.72 (docs/benchmarks.md, "Where the time goes")."""
    return list_metadata(api, pods_path(ns), {"labelSelector": selector} if selector else None)


def delete_pods(api: client.ApiClient, ns: str, names: list[str], timeout: float = 120) -> None:
    """Delete pods now (grace 0) and wait until the API no longer has them, so their nodes are free."""
    delete_each(api, [f"{pods_path(ns)}/{n}" for n in names], {"gracePeriodSeconds": "0"})
    wanted = set(names)
    wait_for(lambda: sorted(wanted & {m["name"] for m in pod_metadata(api, ns)}), until=lambda left: not left,
             timeout=timeout, interval=0.5,
             what=f"pods {', '.join(names[:3])}{'...' if len(names) > 3 else ''} in {ns} gone")


def delete_selected(api: client.ApiClient, ns: str, selector: str, timeout: float = 300, what: str = "") -> None:
    """Delete the pods ``selector`` picks in ``ns`` (grace 0, one request each) and wait until they are gone."""
    names = [m["name"] for m in pod_metadata(api, ns, selector) if not m.get("deletionTimestamp")]
    delete_each(api, [f"{pods_path(ns)}/{n}" for n in names], {"gracePeriodSeconds": "0"})
    wait_for(lambda: len(pod_metadata(api, ns, selector)), until=lambda n: n == 0, timeout=timeout, interval=1,
             what=what or f"pods {selector} in namespace {ns} gone")


def delete_run_pods(api: client.ApiClient, ns: str, run_id: str, timeout: float = 300) -> None:
    """Delete this run's pods in ``ns`` (grace 0) and wait until they are gone.

    Also right in a namespace the run does not own: only pods with its run label go.
    """
    delete_selected(api, ns, f"{RUN_LABEL}={run_id}", timeout, f"this run's pods in namespace {ns} gone")


def delete_namespace(api: client.ApiClient, ns: str, run_id: str, timeout: float = 300) -> None:
    """Delete a namespace the run created, its pods and Events first, one request each.

    Why not just DELETE the namespace: kube-controller-manager's namespace
    controller empties it with one collection DELETE per resource, and the
    Events of thousands of pods outlast the apiserver's 60 s request timeout
    (``DELETE events.events.k8s.io -> 504``, measured at 7,500 nodes in the
    module after the 4,000-pod gang, in 2 nightly runs of 3). What is left to
    the controller is small; ``wait_namespaces_gone`` (the module guard) waits
    for it, so its work stays in the module that caused it.
    """
    try:
        delete_run_pods(api, ns, run_id, timeout)
    finally:
        events = f"/api/v1/namespaces/{ns}/events"
        delete_each(api, [f"{events}/{e['metadata']['name']}" for e in list_all(api, events)])
        delete_if_present(api, f"/api/v1/namespaces/{ns}")


def wait_namespaces_gone(api: client.ApiClient, run_id: str, timeout: float = 300) -> None:
    """Wait until none of this run's namespaces is terminating (the namespace controller caught up)."""
    def terminating() -> list[str]:
        return sorted(n["metadata"]["name"] for n in list_all(api, "/api/v1/namespaces",
                                                              {"labelSelector": f"{RUN_LABEL}={run_id}"})
                      if n["metadata"].get("deletionTimestamp"))
    wait_for(terminating, until=lambda left: not left, timeout=timeout, interval=0.5,
             what="this run's deleted namespaces gone")


def _cut(text: str, n: int = PIECE) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n - 3] + "..."


def _said(reason: str, message: str) -> str:
    return _cut(f"{reason}: {message}" if reason and message else reason or message)


def event_time(e: dict) -> str:
    """When an event (core/v1 view) was last seen, as written: ``lastTimestamp``, its series' last observation,
    or the new API's ``eventTime`` ("" when none)."""
    return (e.get("lastTimestamp") or (e.get("series") or {}).get("lastObservedTime") or e.get("eventTime")
            or e["metadata"].get("creationTimestamp") or "")


def pod_story(name: str, pod: dict | None, events: list[dict] = ()) -> str:
    """What the cluster says about a pod, in one line: its phase (and node), the reason the pod itself gives,
    each container's waiting or terminated reason and message, its conditions that are not True (reason:
    message), and its latest distinct Events (reason, how often, who said it: message). Bounded: every piece
    ``PIECE`` characters, the line ``POD_LINE``. Pure (``events``: core/v1 Events about this pod)."""
    parts = []
    if pod is None:
        parts.append("gone from the API")
    else:
        st = pod.get("status") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        parts.append((st.get("phase") or "no phase yet") + (f" on {node}" if node else ", not bound to a node")
                     + (f" ({_said(st.get('reason', ''), st.get('message', ''))})"
                        if st.get("reason") or st.get("message") else ""))
        for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
            for kind in ("waiting", "terminated"):
                s = (cs.get("state") or {}).get(kind)
                if s is not None and (s.get("reason") or s.get("message")):
                    code = f" exit {s['exitCode']}" if "exitCode" in s else ""
                    why = _said(s.get("reason", ""), s.get("message", ""))
                    parts.append(f"container {cs.get('name')} {kind}{code}: {why}")
        for c in st.get("conditions") or []:
            if c.get("status") != "True":
                parts.append(f"{c.get('type')}={c.get('status')}"
                             + (f" ({_said(c.get('reason', ''), c.get('message', ''))})"
                                if c.get("reason") or c.get("message") else ""))
    seen, said = set(), []
    for e in sorted(events, key=event_time, reverse=True):
        key = (e.get("reason"), e.get("message"))
        if key in seen:
            continue
        seen.add(key)
        count = (e.get("series") or {}).get("count") or e.get("count") or 1
        who = (e.get("source") or {}).get("component") or e.get("reportingComponent") or ""
        said.append(f"{e.get('reason', '?')}" + (f" x{count}" if count > 1 else "") + (f" ({who})" if who else "")
                    + f": {_cut(e.get('message') or e.get('note') or '')}")
        if len(said) == SHOW_EVENTS:
            break
    parts.append("Events: " + ("; ".join(said) if said else "none"))
    return _cut(f"pod {name}: " + "; ".join(parts), POD_LINE)


def events_about(api: client.ApiClient, ns: str, name: str, pod: dict | None = None) -> list[dict]:
    """The core/v1 Events about pod ``name``: its own by uid where both carry one (a pod created again under the
    name does not inherit its predecessor's), else by name."""
    items = list_raw(api, f"/api/v1/namespaces/{ns}/events",
                     {"fieldSelector": f"involvedObject.kind=Pod,involvedObject.name={name}"})["items"]
    uid = (pod or {}).get("metadata", {}).get("uid")
    return [e for e in items if not uid or not e["involvedObject"].get("uid") or e["involvedObject"]["uid"] == uid]


def explain_pods(api: client.ApiClient, ns: str | None, names, total: int | None = None) -> str:
    """What the cluster said about the pods a wait still waits for (``wait_for(explain=...)``): the first
    ``SHOW_PODS`` of ``names`` (sorted; ``namespace/name`` each when ``ns`` is None, as ``list_pods`` names
    them), each as ``pod_story``, and how many more; ``total``: how many pods the wait is about, if more than
    ``names``. Reads each shown pod and its Events once."""
    names = sorted(names)
    if not names:
        return "no pod is left to wait for"
    lines = []
    for ref in names[:SHOW_PODS]:
        where, name = ref.split("/", 1) if ns is None else (ns, ref)
        pod = get_if_present(api, f"{pods_path(where)}/{name}")
        lines.append(pod_story(f"{where}/{name}", pod, events_about(api, where, name, pod)))
    more = f"; and {len(names) - SHOW_PODS} more not there yet" if len(names) > SHOW_PODS else ""
    of = f" of {total}" if total and total > len(names) else ""
    return f"{len(names)}{of} pod(s) not there yet -- " + " | ".join(lines) + more
