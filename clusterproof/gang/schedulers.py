"""Which gang schedulers the gang suite runs against (its fixtures: ``clusterproof.fixtures.gang``).

- ``coscheduling``: on the embedded cluster, the harness's own Coscheduling
  scheduler (``clusterproof.cluster.coscheduling``: started with the cluster as a kwokctl
  component, CRDs applied at start); elsewhere ``gang_scheduler_name`` names
  the one the cluster runs, and its PodGroup CRD must be installed.
- ``native``: Kubernetes' own gang scheduling, checked only by profiles that
  ask for it (``gang_native``), and there in the API version discovery shows
  served (v1alpha1 on 1.35, v1alpha2 on 1.36, v1beta1 on 1.37).

The profile decides which backends a run checks (a backend it does not ask
for is not collected, rather than skipped on every run). A backend asked for
that the cluster does not serve is skipped with the reason (e.g. a real
1.34 cluster has no Workload API; an existing cluster without Coscheduling
and no ``gang_scheduler_name``); a user mistake (a scheduler name without
the CRD, a scheduler that binds nothing) fails every check with one line.
"""
from __future__ import annotations

from kubernetes import client

from clusterproof.cluster import coscheduling
from clusterproof.core import kubeversions
from clusterproof.core.errors import HarnessError
from clusterproof.gang.gangs import (
    LEGACY_NATIVE_API,
    NATIVE_APIS,
    NATIVE_GANG_TIMEOUT_S,
    Backend,
    Placement,
    probe_scheduler,
)
from clusterproof.kube.client import check_reachable, server_url, serving
from clusterproof.provision import toolchain


def native_backend(api: client.ApiClient, profile) -> Backend:
    """Native gang scheduling, in the newest API version the server's discovery lists Workloads in
    (``NATIVE_APIS``): a 1.35 cluster is judged with v1alpha1, a 1.36 with v1alpha2, a 1.37 with v1beta1."""
    name = profile.gang_native_scheduler_name
    b = Backend("native", name, f"native gang scheduling ({name})", NATIVE_GANG_TIMEOUT_S)
    if not profile.gang_native:
        b.skip = "not checked by this profile (gang_native: false; see clusterproof/config/profiles/native-gang.yaml)"
        return b
    b.served = serving(api, NATIVE_APIS, "workloads") or ""
    b.api = profile.gang_native_api or b.served
    if not b.api:
        b.skip = (f"native gang scheduling not served: discovery lists no Workload in {', '.join(NATIVE_APIS)} ("
                  + kubeversions.enable_hint(check_reachable(api)["gitVersion"], "the Workload API")
                  + "; gang_native: false stops asking)")
        return b
    legacy = b.api == LEGACY_NATIVE_API
    b.description = (f"native gang scheduling ({b.api} Workload" + ("" if legacy else " and PodGroup")
                     + ", pods' " + ("spec.workloadRef" if legacy else "spec.schedulingGroup") + f"; {name})")
    return b


def coscheduling_backend(cluster, profile) -> Backend:
    """Coscheduling: the harness's own on the embedded cluster, or the one ``gang_scheduler_name`` names.

    A cluster the profile names no Coscheduling scheduler for cannot be judged (skipped, saying what is
    missing and which key names it); a name the cluster cannot back (no PodGroup CRD) is a mistake (fails)."""
    name = profile.gang_scheduler_name
    b = Backend("coscheduling", name or coscheduling.OWN_SCHEDULER, "", profile.gang_schedule_timeout_s)
    served = coscheduling.podgroup_crd_served(cluster.api)
    if not name and cluster.kwok is None:
        b.skip = ((f"gang_scheduler_name is empty: the cluster serves the PodGroup CRD ({coscheduling.PODGROUP_CRD}); "
                   "set gang_scheduler_name to the schedulerName that runs Coscheduling (e.g. "
                   "scheduler-plugins-scheduler)") if served else
                  f"no Coscheduling on {server_url(cluster.api)}: the PodGroup CRD ({coscheduling.PODGROUP_CRD}) "
                  "is not installed and gang_scheduler_name is empty; install scheduler-plugins' Coscheduling "
                  "(its scheduler and manifests/coscheduling/crd.yaml) and set gang_scheduler_name to its "
                  "schedulerName, or run on the embedded cluster")
    elif not served:
        b.error = (f"the PodGroup CRD ({coscheduling.PODGROUP_CRD}) is not installed on "
                   f"{server_url(cluster.api)}: install scheduler-plugins' "
                   "manifests/coscheduling/crd.yaml, or run on the embedded cluster")
    b.description = (f"unusable: {b.error}" if b.error else f"not checked: {b.skip}" if b.skip else
                     f"schedulerName {name!r} (not started by the harness)" if name else
                     f"Coscheduling, scheduler-plugins {toolchain.SCHEDULER_PLUGINS_VERSION}, "
                     f"a component of the embedded cluster ({coscheduling.OWN_SCHEDULER!r})")
    return b


def progress_line(backends: list[Backend]) -> str:
    ran = [f"{b.name} ({b.description})" for b in backends if not b.skip]
    skipped = [f"{b.name} ({b.skip})" for b in backends if b.skip]
    return (f"gang backends: running {', '.join(ran) or 'none'}"
            + (f"; not running {', '.join(skipped)}" if skipped else ""))


def probe_once(cluster, namespace: str, run_id: str, backend: Backend, place: Placement,
               probed: dict[str, str | None]) -> str | None:
    """Once per backend and session (``probed``: the session's answers, kept by the gang fixtures): a
    scheduler answers to its name (a probe pod is bound), so one that is not running fails every check in
    seconds with one line instead of after every wait ran out. Returns that line, or None."""
    if backend.name not in probed:
        try:
            probe_scheduler(cluster.api, namespace, run_id, backend.scheduler_name, place, 30)
            probed[backend.name] = None
        except HarnessError as e:
            probed[backend.name] = str(e)
    return probed[backend.name]
