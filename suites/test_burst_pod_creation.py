"""A burst of whole-node GPU pods is created, bound and started within the SLOs.

A large training job arrives as hundreds of pods created at once, one per
8-GPU node, and several jobs follow back to back (profile keys ``burst_*``).
The load is locust (``load/burst.py``, run as its own process, authenticated
as a ServiceAccount so API Priority and Fairness applies); the measurement
is a pod watch started before the load (``fixtures.podtimeline``). Checked:
every pod is created; every job is bound completely; pod creates meet the
mutating-call SLO (p99 <= 1 s, locust's client-side statistics); pod startup
(created -> Running, observed on the watch) meets the pod-startup SLO
(p99 <= 5 s). Scheduling throughput, per-job bind times and 429s are
reported (Allure attachments; ``bench/burst.py`` writes them to JSON).
Negative control: tests/test_burst_controls.py stops or throttles the
kube-scheduler and shows these tests fail, naming the cause.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import os
from dataclasses import asdict, dataclass

import allure
import pytest
from kubernetes import client

from fixtures.podtimeline import PodTimeline, dump, job_times, percentile, scheduling_throughput
from fixtures.run import RUN_LABEL, metadata
from fixtures.stash import PROFILE
from fixtures.waiting import WaitTimeout, wait_for
from fixtures.watch import list_raw
from load.burst_plan import burst_args, job_names, pods_planned
from load.identity import create_load_identity
from load.runner import LocustResult, run_locust
from reports.pngplot import scatter

SHOW = 10


def pytest_generate_tests(metafunc):
    if "job" in metafunc.fixturenames:
        profile = metafunc.config.stash[PROFILE]
        metafunc.parametrize("job", [pytest.param(j, id=j) for j in job_names(profile)])


@dataclass
class Burst:
    planned: int
    locust: LocustResult
    pods: list                     # fixtures.podtimeline.PodTimes
    incomplete: str | None         # why the wait for all pods Running ended early, if it did
    figures: dict


@pytest.fixture(scope="module")
def burst_namespace(cluster, run_id):
    """One namespace for the whole burst (every test reads the same burst); pods deleted first."""
    name = f"cp-{run_id[-4:]}-burst-{os.urandom(2).hex()}"
    cluster.core.create_namespace({"metadata": metadata(name, run_id)})
    yield name
    # Delete the pods explicitly and wait: "nothing left behind" must hold
    # when the run ends, not whenever the namespace controller gets to it.
    core = cluster.core
    try:
        core.delete_collection_namespaced_pod(name, label_selector=f"{RUN_LABEL}={run_id}",
                                              grace_period_seconds=0)
        wait_for(lambda: len(list_raw(cluster.api, f"/api/v1/namespaces/{name}/pods",
                                      {"labelSelector": f"{RUN_LABEL}={run_id}"})["items"]),
                 until=lambda n: n == 0, timeout=120, interval=1, what=f"burst pods in {name} deleted")
    finally:
        try:
            core.delete_namespace(name, propagation_policy="Background")
        except client.ApiException as e:
            if e.status != 404:
                raise


def _schedulable_shared_nodes(cluster, profile) -> int:
    nodes = list_raw(cluster.api, "/api/v1/nodes", {"labelSelector": f"{profile.pool_label}=shared"},
                     timeout=300)["items"]
    return sum(1 for n in nodes if not n.get("spec", {}).get("unschedulable"))


def scheduler_state(api) -> str:
    """What the kube-scheduler's leader lease says (a stopped scheduler stops renewing it)."""
    try:
        lease = list_raw(api, "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kube-scheduler")
    except client.ApiException as e:
        if e.status == 404:
            return "there is no kube-scheduler leader lease in kube-system: is a scheduler running?"
        return f"cannot read the kube-scheduler lease ({e.status})"
    renew = lease.get("spec", {}).get("renewTime")
    if not renew:
        return "the kube-scheduler lease has never been renewed: is the scheduler running?"
    t = dt.datetime.strptime(renew.split(".")[0].rstrip("Z"), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=dt.timezone.utc)
    age = (dt.datetime.now(dt.timezone.utc) - t).total_seconds()
    duration = lease["spec"].get("leaseDurationSeconds", 15)
    verdict = ("is the scheduler running?" if age > duration
               else "the scheduler is alive; check its client QPS and the pods' events")
    return f"kube-scheduler lease last renewed {age:.0f} s ago (duration {duration} s): {verdict}"


@pytest.fixture(scope="module")
def burst(cluster, profile, run_id, burst_namespace, tmp_path_factory) -> Burst:
    planned = pods_planned(profile)
    free = _schedulable_shared_nodes(cluster, profile)
    if planned > free:
        pytest.fail(f"the burst ({profile.burst_jobs} jobs x {profile.burst_job_size} whole-node pods = "
                    f"{planned}) is larger than the {free} schedulable nodes labelled "
                    f"{profile.pool_label}=shared: lower burst_jobs/burst_job_size", pytrace=False)
    work = tmp_path_factory.mktemp("burst")
    ident = create_load_identity(cluster.api, burst_namespace, run_id, work / "identity")
    timeline = PodTimeline(cluster.api, burst_namespace, f"{RUN_LABEL}={run_id}").start()
    incomplete = None
    try:
        result = run_locust("load/burst.py", cluster.api.configuration.host, profile.burst_users,
                            burst_args(profile, burst_namespace, run_id, ident), work / "locust",
                            timeout_s=profile.burst_timeout_s, processes=profile.burst_locust_processes)
        try:
            timeline.wait_running(planned, timeout=profile.burst_timeout_s,
                                  stall_timeout=profile.burst_stall_timeout_s)
        except WaitTimeout as e:
            incomplete = f"{e}; {scheduler_state(cluster.api)}"
    finally:
        timeline.stop()
    pods = timeline.snapshot()
    figures = burst_figures(profile, result, pods)
    _attach(profile, result, pods, figures)
    return Burst(planned, result, pods, incomplete, figures)


def burst_figures(profile, result: LocustResult, pods) -> dict:
    """The measurements of one burst (also what bench/burst.py writes)."""
    create = result.stats.get("create pod")
    startup = [p.startup_s for p in pods if p.startup_s is not None]
    return {
        "pods_planned": pods_planned(profile), "pods_seen": len(pods),
        "pods_bound": sum(p.bound is not None for p in pods),
        "pods_running": len(startup),
        "create_requests": create.requests if create else 0,
        "create_failures": create.failures if create else 0,
        "create_qps": round(create.rps, 1) if create else 0.0,
        "create_latency_p50_s": create.p50_s if create else None,
        "create_latency_p99_s": create.p99_s if create else None,
        "responses_429": result.count_failures("429"),
        "locust_seconds": round(result.seconds, 2),
        "pod_startup_p50_s": round(percentile(startup, 50), 3) if startup else None,
        "pod_startup_p99_s": round(percentile(startup, 99), 3) if startup else None,
        "scheduling_throughput_pods_per_s": round(scheduling_throughput(pods), 1),
        "jobs": [asdict(j) for j in job_times(pods)],
    }


def _attach(profile, result, pods, figures) -> None:
    allure.attach(json.dumps(figures, indent=2), "burst figures", allure.attachment_type.JSON)
    allure.attach.file(str(result.stats_csv), "locust stats (create pod, client side)",
                       allure.attachment_type.CSV)
    allure.attach(dump(pods), "pod timeline (s since first pod seen)", allure.attachment_type.TEXT)
    if pods:
        t0 = min(p.added for p in pods)
        png = scatter({"blue": [(p.added - t0, p.startup_s) for p in pods if p.startup_s is not None],
                       "grey": [(p.added - t0, p.bound - p.added) for p in pods if p.bound is not None]},
                      {"red": profile.slo_pod_startup_p99_s})
        allure.attach(png, "latency per pod: blue created->Running, grey created->bound, "
                      "red startup SLO (x: s since first create, y: s)", allure.attachment_type.PNG)


def _names(names) -> str:
    names = sorted(names)
    more = f" and {len(names) - SHOW} more" if len(names) > SHOW else ""
    return ", ".join(names[:SHOW]) + more


@pytest.mark.smoke
def test_every_pod_of_the_burst_is_created(burst):
    f = burst.figures
    errors = "; ".join(f"{r['Error']} x{r['Occurrences']}" for r in burst.locust.failures)
    created = f["create_requests"] - f["create_failures"]
    assert created == burst.planned and f["pods_seen"] == burst.planned, (
        f"{created} of {burst.planned} pod creates succeeded ({f['pods_seen']} pods seen on the watch); "
        f"failures: {errors or 'none'}; locust: {burst.locust.log_tail.splitlines()[-1:] }")


@pytest.mark.smoke
def test_every_job_is_bound_completely(burst, job):
    mine = [p for p in burst.pods if p.job == job]
    unbound = [p.name for p in mine if p.bound is None]
    assert mine and not unbound, (
        f"job {job}: {len(mine) - len(unbound)} of {len(mine)} pods bound"
        + (f", unbound: {_names(unbound)}" if unbound else "")
        + (f"; {burst.incomplete}" if burst.incomplete else ""))


@pytest.mark.smoke
def test_pod_creates_meet_the_mutating_call_slo(burst, profile):
    p99 = burst.figures["create_latency_p99_s"]
    assert p99 is not None, "locust recorded no 'create pod' request"
    assert p99 <= profile.slo_mutating_p99_s, (
        f"pod create latency SLO (p99 <= {profile.slo_mutating_p99_s:g} s) broken: p99 {p99:g} s, "
        f"p50 {burst.figures['create_latency_p50_s']:g} s over {burst.figures['create_requests']} "
        f"creates ({burst.figures['responses_429']} answered 429)")


@pytest.mark.smoke
def test_pod_startup_latency_meets_the_slo(burst, profile):
    # A pod that never ran counts as infinitely slow: the SLO is over every pod created.
    lat = [p.startup_s if p.startup_s is not None else math.inf for p in burst.pods]
    lat += [math.inf] * max(0, burst.planned - len(lat))
    p99 = percentile(lat, 99)
    not_running = sum(1 for x in lat if math.isinf(x))
    assert p99 <= profile.slo_pod_startup_p99_s, (
        f"pod startup latency SLO (p99 <= {profile.slo_pod_startup_p99_s:g} s) broken: p99 "
        + (f"{p99:.2f} s" if math.isfinite(p99) else "infinite")
        + f" over {burst.planned} pods, {not_running} never Running"
        + f", p50 {percentile(lat, 50):.2f} s"
        + (f"; {burst.incomplete}" if burst.incomplete else ""))
