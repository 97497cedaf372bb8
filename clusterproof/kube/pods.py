"""Pods on the API: create many at once, read them, their events, and delete them for good.

Why a module: every suite creates pods concurrently, asks the scheduler's
verdict (events) and removes its pods before it ends. Three rules live here
once:

- events belong to a pod by ``involvedObject.uid``, never by name: a pod
  deleted and created again under the same name must not inherit the
  verdicts about its predecessor;
- "pods deleted" means gone from the API, not merely terminating (a
  terminating pod still holds its node);
- a delete that finds nothing (404) is not an error (``delete_if_present``).
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

from kubernetes import client

from clusterproof.core.errors import HarnessError
from clusterproof.core.run import RUN_LABEL
from clusterproof.core.waiting import wait_for
from clusterproof.kube.apicalls import refused_by_rbac
from clusterproof.kube.client import (
    api_message,
    create_object,
    delete_each,
    delete_if_present,
    list_all,
    list_raw,
    raw_request,
)


def pods_path(ns: str) -> str:
    return f"/api/v1/namespaces/{ns}/pods"


def create_pods(api: client.ApiClient, ns: str, bodies: list[dict], workers: int = 24) -> dict[str, dict]:
    """Create pods concurrently, in order; return them as admitted, by name.

    24 workers: the client's connection pool (32 on the embedded cluster) also
    serves the watches that follow them.
    """
    def create(body: dict) -> dict:
        # create_object: a create whose connection broke is sent again, and our own first attempt
        # (a 409 on a pod bearing our marks) is taken for what it is.
        return create_object(api, pods_path(ns), body)
    with ThreadPoolExecutor(max_workers=min(workers, max(1, len(bodies)))) as pool:
        return {p["metadata"]["name"]: p for p in pool.map(create, bodies)}


def try_create(api: client.ApiClient, ns: str, body: dict,
               dry_run: bool = False) -> tuple[dict | None, client.ApiException | None]:
    """Create one pod; an admission refusal (4xx) is a result here, not an error. A refusal by RBAC is
    not a result (the harness was not allowed to ask): one line, HarnessError."""
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


def delete_pods(api: client.ApiClient, ns: str, names: list[str], timeout: float = 120) -> None:
    """Delete pods now (grace 0) and wait until the API no longer has them, so their nodes are free."""
    delete_each(api, [f"{pods_path(ns)}/{n}" for n in names], {"gracePeriodSeconds": "0"})
    wanted = set(names)
    wait_for(lambda: sorted(wanted & set(list_pods(api, ns))), until=lambda left: not left,
             timeout=timeout, interval=0.5,
             what=f"pods {', '.join(names[:3])}{'...' if len(names) > 3 else ''} in {ns} gone")


def delete_selected(api: client.ApiClient, ns: str, selector: str, timeout: float = 300, what: str = "") -> None:
    """Delete the pods ``selector`` picks in ``ns`` (grace 0, one request each) and wait until they are gone."""
    names = [n for n, p in list_pods(api, ns, selector).items() if not p["metadata"].get("deletionTimestamp")]
    delete_each(api, [f"{pods_path(ns)}/{n}" for n in names], {"gracePeriodSeconds": "0"})
    wait_for(lambda: len(list_pods(api, ns, selector)), until=lambda n: n == 0, timeout=timeout, interval=1,
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
