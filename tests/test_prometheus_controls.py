"""Negative controls for suites/test_prometheus_limits.py.

The suite runs as a user types it against this session's embedded cluster
(``--cp-kubeconfig``), each run starting its own embedded Prometheus (scraping
that API server with the kubeconfig's credentials) over the smoke history
(1,000 nodes), or a smaller one:

- healthy limits: every check passes (the unbounded series API is its
  strict expected failure);
- a Prometheus without a useful timeout: the embedded one started with
  ``--query.timeout=10m`` while the profile requires 250 ms
  (``prometheus_embedded_query_timeout=10m``): the flag check and the
  timeout checks fail, naming ``--query.timeout=10m`` and how long the
  query ran. (Requiring 10 m as well is no control: the query sized to the
  history then answers whole within the limit and the checks rightly skip,
  "too light"; red there depended on 64 copies outlasting the client's 120 s
  wait, which a faster machine did not -- a fresh-clone CI, 2026-11-28);
- a huge ``prometheus_max_samples``: the max-samples check fails, naming
  ``--query.max-samples`` and the samples the query asked for;
- a 200-node history (a site profile's ``nodes``, as a new user's run had):
  the seed quantile alone answers under the 250 ms timeout, so it is sized
  (copies added up) until it reaches the limit and is judged -- green with
  the limits; a 1-node history under a 5 s timeout cannot be filled: the
  timeout checks skip naming ``prometheus_backfill_nodes``, never red. (A
  200-node history under a 10 m timeout is a skip too, not red: 64 copies
  answer in ~20 s, nowhere near 10 m);
- prometheus-api-client with its default retries turns a timed-out query
  into ``RetryError`` after four requests, the body (and errorType) lost;
  the harness's client sends it once and shows ``503 timeout``;
- against an existing Prometheus (``--cp-prometheus-url``) the suite is
  read-only unless ``--cp-allow-destructive``.
"""
from __future__ import annotations

import time
import xml.etree.ElementTree as ET

import pytest
import requests
from prometheus_api_client import PrometheusConnect

from clusterproof.prometheus.queries import tiny_timeout_probe
from tests.harness import run_pytest

pytestmark = pytest.mark.control
SUITE = "suites/test_prometheus_limits.py"
HEAVY = ("test_the_seed_query_is_cut_at_the_query_timeout", "test_a_request_timeout_cannot_extend_the_query_timeout",
         "test_a_query_over_max_samples_gets_422", "test_queries_above_max_concurrency_wait_in_the_queue")


def _args(cluster, profile, *extra):
    return [SUITE, "--cp-kubeconfig", str(cluster.kubeconfig), "--cp-profile", profile.name, *extra]


def test_prometheus_suite_passes_with_the_profile_limits(cluster, profile, tmp_path):
    run = run_pytest(_args(cluster, profile), tmp_path)
    assert run.returncode == 0 and not run.failures, run.output[-3000:]
    assert "xfailed" in run.output, run.output[-1500:]


def test_without_a_query_timeout_the_timeout_checks_fail(cluster, profile, tmp_path):
    run = run_pytest(_args(cluster, profile, "--cp-set", "prometheus_embedded_query_timeout=10m"), tmp_path)
    assert run.returncode == 1, run.output[-3000:]
    for name in ("test_the_seed_query_is_cut_at_the_query_timeout[histogram-quantile]",
                 "test_a_request_timeout_cannot_extend_the_query_timeout",
                 "test_queries_above_max_concurrency_wait_in_the_queue"):
        msg = run.failures.get(name, "")
        assert "--query.timeout=10m" in msg, f"{name}: {msg[:1500] or run.output[-2000:]}"
    msg = run.failures["test_the_seed_query_is_cut_at_the_query_timeout[histogram-quantile]"]
    assert "was not cut by the query timeout" in msg and "it ran " in msg and "samples" in msg, msg[:1500]
    # the flag check names the looser timeout against the profile's; max-samples still holds
    msg = run.failures.get("test_prometheus_runs_with_the_profile_query_limits", "")
    assert "--query.timeout is 10m (profile prometheus_query_timeout 250ms)" in msg, msg[:1500] or run.output[-3000:]
    assert "test_a_query_over_max_samples_gets_422" in run.passed, run.output[-3000:]


def test_with_a_huge_max_samples_the_max_samples_check_fails(cluster, profile, tmp_path):
    huge = 10 ** 12
    run = run_pytest(_args(cluster, profile, "--cp-set", f"prometheus_max_samples={huge}"), tmp_path)
    assert run.returncode == 1, run.output[-3000:]
    msg = run.failures.get("test_a_query_over_max_samples_gets_422", "")
    assert f"--query.max-samples={huge}" in msg and "was not refused for loading too many samples" in msg, \
        msg[:1500] or run.output[-3000:]
    assert "samples" in msg.split("on the server):", 1)[-1], msg[:1500]
    # the timeout still cuts the seed's queries
    assert "test_the_seed_query_is_cut_at_the_query_timeout[histogram-quantile]" in run.passed, run.output[-3000:]


SMALL = "prometheus_backfill_nodes=200"     # 29,000 bucket series: the seed quantile alone takes ~0.2 s here
CUT = ("test_the_seed_query_is_cut_at_the_query_timeout[histogram-quantile]",
       "test_a_request_timeout_cannot_extend_the_query_timeout", "test_queries_above_max_concurrency_wait_in_the_queue")


def _skips(tmp_path) -> dict[str, str]:
    """A child run's skipped checks (its junit XML): test name -> skip reason. (``-rs`` lines name the
    file and line of the skip, not the test.)"""
    out = {}
    for case in ET.parse(tmp_path / "junit.xml").getroot().iter("testcase"):
        skipped = case.find("skipped")
        if skipped is not None:
            out[case.get("name")] = skipped.get("message", "") + (skipped.text or "")
    return out


def test_on_a_small_history_the_timeout_checks_judge_a_sized_query_and_none_is_a_false_red(cluster, profile,
                                                                                            tmp_path):
    """The new user's run: too little history for the seed's queries to reach the 250 ms timeout on their own."""
    run = run_pytest(_args(cluster, profile, "--cp-set", SMALL, "-rs"), tmp_path)
    assert run.returncode == 0 and not run.failures, run.output[-3000:]
    for name in CUT:
        assert name in run.passed, f"{name}: {_skips(tmp_path).get(name) or run.output[-3000:]}"
    # the long range query selects 29,000 series x 121 steps: over max-samples before the timeout, said so
    long_range = "test_the_seed_query_is_cut_at_the_query_timeout[long-range]"
    if long_range not in run.passed:
        why = _skips(tmp_path).get(long_range, "")
        assert "--query.max-samples" in why and "another limit" in why, why or run.output[-3000:]


def test_on_a_history_of_almost_nothing_the_timeout_checks_skip_naming_the_key(cluster, profile, tmp_path):
    """One node's history (145 bucket series, a few ms a copy) under a 5 s timeout: 64 copies stay far under
    it, however loaded the machine."""
    run = run_pytest(_args(cluster, profile, "--cp-set", "prometheus_backfill_nodes=1", "--cp-set",
                           "prometheus_query_timeout=5s", "-rs"), tmp_path)
    assert run.returncode == 0 and not run.failures, run.output[-3000:]
    skips = _skips(tmp_path)
    for name in CUT:
        assert "prometheus_backfill_nodes" in skips.get(name, ""), f"{name}: {skips.get(name) or run.output[-3000:]}"
    assert "cannot judge" in skips[CUT[0]] and "not cut" not in skips[CUT[0]], skips[CUT[0]]


def test_library_default_retries_hide_the_timeout_that_the_harness_client_shows(prometheus):
    """prometheus-api-client 0.7.2 as it comes: a 503 ``timeout`` is retried three times, then RetryError."""
    q = tiny_timeout_probe()
    requests_seen = 'prometheus_http_requests_total{code="503",handler="/api/v1/query"}'
    before = prometheus.prom.own_metric(requests_seen) or 0
    library = PrometheusConnect(prometheus.prom.url)          # the library's default Retry(total=3, ...503...)
    t0 = time.monotonic()
    with pytest.raises(requests.exceptions.RetryError) as caught:
        library.custom_query(q.expr, params={"timeout": "1ms"})
    elapsed = time.monotonic() - t0
    after_library = prometheus.prom.own_metric(requests_seen) or 0
    assert after_library - before == 4, f"the library sent the query {after_library - before:g} times"
    assert "errorType" not in str(caught.value) and "timed out" not in str(caught.value), str(caught.value)
    assert elapsed >= 1.0, f"the retries backed off only {elapsed:.2f} s"   # backoff_factor 1: >= 1 s between tries

    answer = prometheus.prom.query(q.expr, timeout="1ms")
    assert (prometheus.prom.own_metric(requests_seen) or 0) - after_library == 1
    assert answer.status == 503 and answer.error_type == "timeout" and "timed out" in answer.error, str(answer)


def test_an_existing_prometheus_is_read_only_without_allow_destructive(cluster, profile, prometheus, tmp_path):
    run = run_pytest(_args(cluster, profile, "--cp-prometheus-url", prometheus.prom.url, "-rs"), tmp_path)
    assert run.returncode == 0 and not run.failures, run.output[-3000:]
    for name in ("test_prometheus_runs_with_the_profile_query_limits", "test_a_cheap_query_answers",
                 "test_a_tiny_request_timeout_cuts_a_modest_query"):
        assert name in run.passed, run.output[-3000:]
    assert not [p for p in run.passed if p.startswith(HEAVY)], run.passed
    assert "pass --cp-allow-destructive to run it" in run.output, run.output[-3000:]
