"""Gangs the Job controller makes (WorkloadWithJob, alpha since 1.36): a Job asks to be a gang, and the Job
controller, not the harness, creates its Workload and PodGroup and puts every pod it makes into that PodGroup.

How a Job asks differs by version (``kubeversions.Minor.job_gang``): on 1.36 an Indexed Job whose completions
equal its parallelism is a gang by that shape alone; from 1.37 it says so in ``spec.scheduling``. Either way
the objects the controller made are found by their controller owner reference, the one link it writes.
"""
from __future__ import annotations

from kubernetes import client

from clusterproof.cluster.stages import RUNS_UNTIL_DELETED
from clusterproof.core.progress import phase
from clusterproof.core.run import metadata
from clusterproof.core.waiting import wait_for
from clusterproof.gang.gangs import GANG_LABEL, Backend, Gang, Placement, decided_by, native_path, rank
from clusterproof.kube.client import create_object, delete_if_present, list_raw
from clusterproof.kube.pods import list_pods, terminating

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


def indexed_ranks(pod: dict, size: int, backoff_limit: int = 0, annotations: dict | None = None) -> dict:
    """A Job spec of ``size`` ranks made from ``pod``, all at once (Indexed, completions = parallelism), that run
    until deleted, as training does (on a kwok node: ``RUNS_UNTIL_DELETED``, else kwok completes a Job's pod as it
    starts). ``backoff_limit``: pods the Job replaces before it fails."""
    spec = {**pod["spec"], "restartPolicy": "Never"}
    return {"parallelism": size, "completions": size, "completionMode": "Indexed", "backoffLimit": backoff_limit,
            "template": {"metadata": {"labels": dict(pod["metadata"]["labels"]),
                                      "annotations": {RUNS_UNTIL_DELETED: "true", **(annotations or {})}},
                         "spec": spec}}


def gang_job(name: str, run_id: str, size: int, backend: Backend, place: Placement, gpus: int, how: str) -> dict:
    """A batch Job of ``size`` whole-node ranks (``indexed_ranks``) that asks to be a gang the way ``how`` says
    (``Minor.job_gang``)."""
    spec = indexed_ranks(rank("rank", run_id, backend.scheduler_name, place, gpus, {GANG_LABEL: name}), size)
    if how == "spec.scheduling":
        spec["scheduling"] = {"schedulingPolicy": {"gang": {}}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata(name, run_id), "spec": spec}


def create_job(api: client.ApiClient, ns: str, body: dict) -> dict:
    return create_object(api, f"/apis/batch/v1/namespaces/{ns}/jobs", body, {"fieldValidation": "Strict"})


def delete_job(api: client.ApiClient, ns: str, name: str, timeout: float) -> None:
    """Delete the Job (foreground: its pods first) and wait until no pod of it is left."""
    delete_if_present(api, f"/apis/batch/v1/namespaces/{ns}/jobs/{name}", {"propagationPolicy": "Foreground"})
    wait_for(lambda: list(list_pods(api, ns, f"{JOB_NAME_LABEL}={name}")),
             until=lambda left: not left, timeout=timeout, interval=0.5, what=f"pods of Job {name} gone")


def owned_by_job(api: client.ApiClient, backend: Backend, ns: str, resource: str, job: str) -> list[str]:
    """Names of the ``resource`` (workloads, podgroups) in ``ns`` whose controller is the Job ``job``."""
    items = list_raw(api, native_path(backend.api, ns, resource))["items"]
    return [o["metadata"]["name"] for o in items
            if any(r.get("kind") == "Job" and r.get("name") == job and r.get("controller")
                   for r in o["metadata"].get("ownerReferences") or [])]


def wait_job_gang(api: client.ApiClient, backend: Backend, ns: str, job: str, size: int, timeout: float) -> Gang:
    """Until the Job controller has made ``job``'s Workload and PodGroup and its ``size`` pods, every one in that
    PodGroup; the gang as the harness reads gangs (named by its PodGroup). Red, in one line, otherwise."""
    seen: dict = {}

    def made() -> dict:
        pods = {n: p for n, p in list_pods(api, ns, f"{JOB_NAME_LABEL}={job}").items() if not terminating(p)}
        seen.update(workloads=owned_by_job(api, backend, ns, "workloads", job),
                    podgroups=owned_by_job(api, backend, ns, "podgroups", job), pods=pods)
        return seen

    def done(s: dict) -> bool:
        return bool(s["workloads"] and s["podgroups"]) and len(s["pods"]) == size
    try:
        with phase(f"wait until the Job controller has made Job {job}'s Workload, PodGroup and {size} pods"):
            wait_for(made, until=done, timeout=timeout, interval=0.5,
                     what=f"Job {job}'s Workload, PodGroup and {size} pods, made by the Job controller",
                     describe=lambda s: f"{len(s['workloads'])} Workload, {len(s['podgroups'])} PodGroup, "
                                        f"{len(s['pods'])} pods")
    except AssertionError:
        raise AssertionError(
            f"the Job controller made {len(seen.get('workloads', []))} Workload and {len(seen.get('podgroups', []))} "
            f"PodGroup for Job {job} ({len(seen.get('pods', {}))} of {size} pods) within {timeout:g} s: "
            "kube-controller-manager runs without WorkloadWithJob, or does not take this Job for a gang") from None
    group = seen["podgroups"][0]
    outside = sorted(n for n, p in seen["pods"].items()
                     if ((p["spec"].get("schedulingGroup") or {}).get("podGroupName")) != group)
    assert not outside, (f"the Job controller made {len(outside)} of Job {job}'s pods outside its PodGroup {group} "
                         f"(no spec.schedulingGroup.podGroupName {group}): {', '.join(outside[:5])}")
    return Gang(group, ns, sorted(seen["pods"]), decided_by=decided_by(backend))
