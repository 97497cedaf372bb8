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

import math

import pytest

from fixtures.stash import PROFILE
from fixtures.stats import percentile
from load.burst_plan import job_names

# Floods the API server with pod creates: opt-in on real clusters (--allow-destructive).
pytestmark = pytest.mark.destructive

SHOW = 10


def pytest_generate_tests(metafunc):
    if "job" in metafunc.fixturenames:
        profile = metafunc.config.stash[PROFILE]
        metafunc.parametrize("job", [pytest.param(j, id=j) for j in job_names(profile)])


def _s(seconds) -> str:
    return "n/a" if seconds is None else f"{seconds:g} s"


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
    f = burst.figures
    p99 = f["create_latency_p99_s"]
    assert p99 is not None, "locust recorded no 'create pod' request"
    # The SLO is defined on the apiserver's own histogram; quoting it next to
    # locust's figure tells the API server's share from the generator's.
    server, slo = f.get("create_latency_server_p99_s"), profile.slo_mutating_p99_s
    assert p99 <= slo, (
        f"pod create latency SLO (p99 <= {profile.slo_mutating_p99_s:g} s) broken: p99 {p99:g} s "
        f"client side (locust), p50 {f['create_latency_p50_s']:g} s over {f['create_requests']} creates "
        f"at {f['create_qps']:g} pods/s ({f['responses_429']} answered 429); the apiserver's own "
        f"histogram says p99 {_s(server)} for the same creates")


@pytest.mark.smoke
def test_pod_startup_latency_meets_the_slo(burst, profile):
    # A pod that never ran counts as infinitely slow: the SLO is over every pod created.
    lat = [p.startup_s if p.startup_s is not None else math.inf for p in burst.pods]
    lat += [math.inf] * max(0, burst.planned - len(lat))
    p99 = percentile(lat, 99)
    not_running = sum(1 for x in lat if math.isinf(x))
    f, slo = burst.figures, profile.slo_pod_startup_p99_s
    assert p99 <= slo, (
        f"pod startup latency SLO (p99 <= {profile.slo_pod_startup_p99_s:g} s) broken: p99 "
        + (f"{p99:.2f} s" if math.isfinite(p99) else "infinite")
        + f" over {burst.planned} pods, {not_running} never Running"
        + f", p50 {percentile(lat, 50):.2f} s; created->bound p99 {_s(f['created_to_bound_p99_s'])}, "
        + f"bound->Running p99 {_s(f['bound_to_running_p99_s'])}; pods created at {f['create_qps']:g}/s, "
        + f"bound at {f['scheduling_throughput_pods_per_s']:g}/s"
        + (f"; {burst.incomplete}" if burst.incomplete else ""))
