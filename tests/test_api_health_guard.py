"""The always-on API health guard: any 5xx fails the module that caused it, unless it declared it.

A run (as a user types it, on its own embedded cluster) executes a module
that makes the apiserver answer 504 (etcd stopped under a write with a 1 s
timeout) without saying so, and a module that does the same inside
``api_guard.excuse(...)`` -- as a negative control that stalls etcd on
purpose declares it. The first fails in its teardown naming verb, resource,
code and count; the second passes, its 5xx reported as excused; both
modules' reports carry the 429s per flow schema.
"""
from __future__ import annotations

import json

import pytest

from clusterproof.cluster.apiguard import Health, describe, rejections, server_errors
from tests.harness import run_pytest


@pytest.mark.cluster
def test_an_undeclared_5xx_fails_its_module_and_a_declared_one_does_not(tmp_path):
    run = run_pytest(["tests/poison/api_5xx.py", "tests/poison/api_5xx_excused.py", "--cp-profile", "smoke"],
                     tmp_path, timeout=600)
    assert run.returncode == 1, run.output[-3000:]
    assert len(run.failures) == 1, run.failures
    [(name, msg)] = run.failures.items()
    assert name == "test_a_write_times_out_in_the_apiserver", run.output[-3000:]
    assert "the API servers answered 5xx during this module: POST configmaps -> 504 x1" in msg, msg
    assert "test_a_declared_write_timeout" in run.passed, run.output[-3000:]
    reports, work = [], []
    for f in (tmp_path / "allure").glob("*-container.json"):
        for fx in json.loads(f.read_text()).get("afters", []):
            for a in fx.get("attachments", []):
                if a["name"].startswith("API health during this module"):
                    reports.append((tmp_path / "allure" / a["source"]).read_text())
                if a["name"].startswith("API work during this module"):
                    work.append((tmp_path / "allure" / a["source"]).read_text())
    # What each module cost, by both instruments: the harness's client saw its configmap writes, and
    # kube-apiserver served them (clusterproof.cluster.apiwork); the run ends with the table of both modules.
    assert len(work) == 2 and all("create configmaps" in w and "served by kube-apiserver (every client): "
                                  in w and "kube-apiserver " in w for w in work), work
    table = run.output[run.output.index("API work per suite"):].splitlines()
    assert [ln.split()[0] for ln in table[2:4]] == ["api_5xx", "api_5xx_excused"], table[:5]
    assert any("5xx excused (etcd stopped on purpose (self-test)): POST configmaps -> 504 x1" in r
               for r in reports), reports
    assert all(r.startswith("429s per flow schema: ") for r in reports) and len(reports) == 2, reports


TEXT = """# TYPE apiserver_request_total counter
apiserver_request_total{code="201",group="",resource="configmaps",subresource="",verb="POST"} %d
apiserver_request_total{code="504",group="",resource="configmaps",subresource="",verb="POST"} %d
apiserver_request_total{code="500",group="apps",resource="deployments",subresource="status",verb="PATCH"} %d
# TYPE apiserver_flowcontrol_rejected_requests_total counter
apiserver_flowcontrol_rejected_requests_total{flow_schema="f",priority_level="p",reason="queue-full"} %d
"""


@pytest.mark.unit
def test_guard_counts_5xx_and_429s_between_scrapes():
    before, after = TEXT % (5, 1, 0, 10), TEXT % (9, 3, 2, 25)
    errors = server_errors(before, after)
    assert {describe(k): v for k, v in errors.items()} == {"POST configmaps -> 504": 2.0,
                                                           "PATCH deployments.apps/status -> 500": 2.0}
    assert rejections(before, after) == {("f", "p"): 15.0}
    h = Health(errors, {}, [], rejections(before, after))
    assert h.report().startswith("429s per flow schema: f -> p: 15\n5xx: ")


@pytest.mark.unit
def test_an_excused_window_stays_open_until_the_5xx_count_stops_moving(monkeypatch):
    """A killed client's abandoned requests are counted a moment after it is gone: the 504s the apiserver
    counts after the block, while the count still moves, are excused too; the window closes when two reads
    agree."""
    from clusterproof.cluster import apiguard
    monkeypatch.setattr(apiguard, "SETTLE_EVERY_S", 0.0)
    reads = iter([TEXT % (5, 1, 0, 0), TEXT % (5, 3, 0, 0), TEXT % (5, 7, 0, 0), TEXT % (5, 7, 0, 0),
                  TEXT % (5, 9, 0, 0)])
    guard = apiguard.ApiGuard(api=None)
    monkeypatch.setattr(guard, "scrape", lambda like=None: next(reads))
    with guard.excuse("a run killed on purpose"):
        pass
    assert {describe(k): v for k, v in guard.excused.items()} == {"POST configmaps -> 504": 6.0}
    assert next(reads) == TEXT % (5, 9, 0, 0)     # the read after the two that agreed was never taken


ETCD_TEXT = """# TYPE etcd_request_duration_seconds histogram
etcd_request_duration_seconds_bucket{operation="create",type="/registry/pods",le="0.5"} %d
etcd_request_duration_seconds_bucket{operation="create",type="/registry/pods",le="1"} %d
etcd_request_duration_seconds_bucket{operation="create",type="/registry/pods",le="60"} %d
etcd_request_duration_seconds_bucket{operation="create",type="/registry/pods",le="+Inf"} %d
etcd_request_duration_seconds_bucket{operation="get",type="/registry/leases",le="0.5"} %d
etcd_request_duration_seconds_bucket{operation="get",type="/registry/leases",le="1"} %d
etcd_request_duration_seconds_bucket{operation="get",type="/registry/leases",le="60"} %d
etcd_request_duration_seconds_bucket{operation="get",type="/registry/leases",le="+Inf"} %d
"""


@pytest.mark.unit
def test_a_5xx_says_whether_etcd_was_slow_as_the_apiserver_saw_it():
    """A 504 is the API server's deadline; the guard's line says whether storage held it up (etcd requests over
    1 s, the most first) or every etcd request was fast (then the API server itself was slow)."""
    from clusterproof.cluster.apiguard import storage_latency
    before = ETCD_TEXT % (0, 0, 0, 0, 0, 0, 0, 0)
    slow = ETCD_TEXT % (90, 95, 100, 100, 50, 50, 50, 50)
    assert storage_latency(before, slow) == ("etcd, as kube-apiserver saw it: create /registry/pods: 5 of 100 over "
                                             "1 s, p99 48 s")
    fast = ETCD_TEXT % (100, 100, 100, 100, 50, 50, 50, 50)
    assert storage_latency(before, fast) == "etcd, as kube-apiserver saw it: all 150 requests within 1 s"
    assert storage_latency(TEXT % (5, 1, 0, 10), TEXT % (9, 3, 2, 25)) == ""
    h = Health({("POST", "", "pods", "", "504"): 3.0}, {}, [], {}, storage=storage_latency(before, fast))
    assert h.error_line() == "POST pods -> 504 x3 (etcd, as kube-apiserver saw it: all 150 requests within 1 s)"
