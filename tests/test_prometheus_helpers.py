"""Unit tests of the Prometheus helpers: pure functions, and the client against tiny local HTTP servers."""
from __future__ import annotations

import http.server
import json
import math
import threading

import pytest
import requests
from prometheus_api_client import PrometheusApiClientException

from clusterproof.cluster import toolchain
from clusterproof.core.timeparse import duration_s
from clusterproof.prometheus import slo as promslo
from clusterproof.prometheus.client import PARSE_BYTES, Answer, Prom, answer_from, from_library_error
from clusterproof.prometheus.history import (
    BLOCK_S,
    SHARD_MARK,
    Shape,
    backfill_shard,
    families,
    node_names,
    openmetrics,
    window_for,
)
from clusterproof.prometheus.limits import Scrapes, limit_bound, scrapes
from clusterproof.prometheus.queries import MAX_POINTS, max_samples_query, seed_queries

pytestmark = pytest.mark.selftest


@pytest.mark.parametrize("text,seconds", [("250ms", 0.25), ("2s", 2), ("10m", 600), ("1h30m", 5400), ("1.5", 1.5),
                                          ("1d", 86400)])
def test_prometheus_durations(text, seconds):
    assert duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["soon", "", "2x", "1m2", "s"])
def test_bad_prometheus_durations(text):
    with pytest.raises(ValueError):
        duration_s(text)


@pytest.mark.parametrize("status,body,deadline,samples", [
    (503, {"status": "error", "errorType": "timeout",
           "error": "query timed out in expression evaluation"}, True, False),
    (422, {"status": "error", "errorType": "execution",
           "error": "expanding series: context deadline exceeded"}, True, False),
    (422, {"status": "error", "errorType": "execution", "error": "context deadline exceeded"}, True, False),
    (422, {"status": "error", "errorType": "execution",
           "error": "query processing would load too many samples into memory in query execution"}, False, True),
    (400, {"status": "error", "errorType": "bad_data", "error": "invalid parameter \"query\""}, False, False),
    (200, {"status": "success", "data": {"resultType": "vector", "result": []}}, False, False),
])
def test_answers_are_classified_as_prometheus_documents_them(status, body, deadline, samples):
    a = answer_from(status, json.dumps(body).encode(), 0.3)
    assert (a.deadline, a.too_many_samples, a.ok) == (deadline, samples, status == 200)


def test_a_library_error_is_made_readable_again():
    body = b'{"status":"error","errorType":"timeout","error":"query timed out in query execution"}'
    e = PrometheusApiClientException(f"HTTP Status Code 503 ({body!r})")
    a = from_library_error(e, 1.0)
    assert (a.status, a.error_type, a.error) == (503, "timeout", "query timed out in query execution")
    assert str(a) == "503 timeout after 1.00 s: query timed out in query execution"


def test_a_proxy_page_is_shown_shortened():
    a = answer_from(502, b"<html>Bad Gateway</html>" * 50, 0.1)
    assert a.error_type == "not-json" and len(a.error) <= 200 and not a.ok


class _Server:
    """A local HTTP server answering every GET with (status, body); counts requests."""

    def __init__(self, status: int, body: bytes):
        outer = self
        self.requests = 0

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                outer.requests += 1
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"


@pytest.fixture
def server():
    made = []

    def make(status, body):
        s = _Server(status, body if isinstance(body, bytes) else json.dumps(body).encode())
        made.append(s)
        return s
    yield make
    for s in made:
        s.srv.shutdown()


def test_the_harness_client_never_retries_a_503(server):
    s = server(503, {"status": "error", "errorType": "timeout", "error": "query timed out in query queue"})
    p = Prom(s.url)
    a = p.query("up")
    assert s.requests == 1 and a.error_type == "timeout" and a.in_queue
    with pytest.raises(Exception) as e:   # the library's own method, same session: one request, readable error
        p.custom_query("up")
    assert s.requests == 2 and "503 timeout" in str(e.value)


def test_the_harness_client_does_not_retry_a_refused_connection():
    p = Prom("http://127.0.0.1:1")
    with pytest.raises(requests.exceptions.ConnectionError):
        p.query("up", wait_s=5)


def test_a_large_series_answer_is_counted_as_it_streams(server):
    n = 150_000
    data = [{"__name__": "x_bucket", "le": str(i), "instance": f"node-{i % 7}:9100"} for i in range(n)]
    body = json.dumps({"status": "success", "data": data, "warnings": ["results truncated due to limit"]}).encode()
    assert len(body) > PARSE_BYTES / 2
    s = server(200, body)
    a, count = Prom(s.url).series_count('{le!=""}')
    assert count == n and a.ok and a.nbytes == len(body)
    small = server(200, {"status": "success", "data": data[:10], "warnings": ["results truncated due to limit"]})
    a, count = Prom(small.url).series_count('{le!=""}', limit=10)
    assert count == 10 and a.warnings == ["results truncated due to limit"]


def test_history_shape_counts_what_it_writes():
    shape = Shape(nodes=2, gpus=8, minutes=3, interval_s=60)
    assert shape.series_per_node() == (418, 145) and shape.points == 3
    start, end = window_for(shape, now=1_795_400_000)
    assert start % BLOCK_S == 0 and end - start == 120 and end < start + BLOCK_S <= 1_795_400_000
    lines = [ln for ln in "".join(openmetrics(shape, start, node_names(2))).splitlines() if not ln.startswith("#")]
    series = {ln.rsplit(" ", 2)[0] for ln in lines}
    assert len(series) == shape.series == 836 and len(lines) == shape.samples
    assert sum(1 for s in series if ",le=" in s) == shape.bucket_series == 290
    assert shape.node_labelled_series() == 418 - 96   # dcgm-exporter's series carry Hostname, not node
    assert {f.kind for f in families(8)} == {"counter", "gauge", "histogram"}


def test_promtool_backfills_the_history_exactly(tmp_path):
    """The real promtool (toolchain) turns a 2-node history into a block holding every series and point."""
    shape = Shape(nodes=2, gpus=8, minutes=3, interval_s=60)
    start, _ = window_for(shape, now=1_795_400_000)
    blocks = tmp_path / "blocks"
    blocks.mkdir()
    template = tmp_path / "template.om"
    template.write_text("".join(openmetrics(shape, start, [f"{SHARD_MARK}-{j:03d}" for j in range(2)])))
    backfill_shard(toolchain.ensure(toolchain.PROMETHEUS).path("promtool"), template, "gpu-node-07",
                    tmp_path / "shard", blocks)
    (meta,) = [json.loads(p.read_text()) for p in blocks.glob("*/meta.json")]
    assert meta["stats"]["numSeries"] == shape.series and meta["stats"]["numSamples"] == shape.samples
    assert meta["minTime"] == start * 1000


@pytest.mark.parametrize("max_samples", [200_000, 5_000_000, 10 ** 12])
def test_the_max_samples_query_asks_for_twice_the_limit(max_samples):
    q = max_samples_query(1_000_000.0, 1740, node_names(1000), 322, max_samples)
    points = round((q.at - q.start) / q.step_s) + 1
    assert points <= MAX_POINTS
    assert q.samples >= min(2 * max_samples, 1000 * 322 * MAX_POINTS * 0.99)


def test_seed_queries_cover_every_bucket():
    qs = seed_queries(1000.0, 1740)
    assert [q.id for q in qs] == ["histogram-quantile", "long-range"]
    assert all('{le!=""}' in q.expr for q in qs) and qs[1].is_range and not qs[0].is_range


def test_promql_window_is_exact_and_counts_new_series():
    q = promslo.queries(promslo.selector(("POST",), ("resource",), 'resource="configmaps"'), 100.0, 200.0)
    assert "@ 200.000) - (" in q["quantile"] and "@ 100.000) or (" in q["quantile"]
    assert q["quantile"].startswith("histogram_quantile(0.99, sum by (verb, group, resource, subresource, scope, le)")


def test_memory_bound_is_what_the_limits_allow():
    class P:
        prometheus_rss_factor, prometheus_max_concurrency, prometheus_max_samples = 2.0, 2, 1_000_000
    assert limit_bound(100e6, P, 1000) == 200e6 + 2 * (1_000_000 * 16 + 1000 * 256)


class _FakeProm:
    def __init__(self, result):
        self.result = result

    def settled(self, expr, at=None, within_s=30):
        return Answer(200, 0.01, data={"resultType": "matrix", "result": self.result})


def test_scrape_gaps_find_a_missed_scrape():
    ts = [100, 102, 104, 108, 110]      # 106 missing
    fake = _FakeProm([{"metric": {"job": "prometheus", "instance": "a"}, "values": [[t, "1"] for t in ts]},
                      {"metric": {"job": "etcd", "instance": "b"}, "values": [[t, "1" if t != 104 else "0"]
                                                                              for t in range(100, 111, 2)]}])
    s = scrapes(fake, 101, 110, 2.0)
    assert isinstance(s, Scrapes)
    assert s.max_gap_s["prometheus/a"] == 4 and s.max_gap_s["etcd/b"] == 2
    assert s.failed == {"prometheus/a": 0, "etcd/b": 1}
    assert math.isclose(scrapes(fake, 101, 110, None).interval_s["prometheus/a"], 2.0)


def test_scrape_gaps_span_the_window_from_the_scrape_before_to_the_one_after():
    """A window shorter than the interval: the scrapes around it still count (no sample inside is not 'no data')."""
    fake = _FakeProm([{"metric": {"job": "prometheus", "instance": "a"},
                       "values": [[100, "1"], [102, "1"], [106, "1"]]}])
    s = scrapes(fake, 102.5, 103.0, 2.0)
    assert s.max_gap_s["prometheus/a"] == 4 and s.samples["prometheus/a"] == 0


@pytest.mark.parametrize("answers, sent", [
    (["422"], 1),                          # the limit at once
    (["503", "422"], 2),                   # cut by the timeout first (a starved machine), then the limit
    (["503", "503", "503"], 3),            # cut every time: the last cut answer is judged (and fails)
    (["200"], 1),                          # answered whole: judged at once (and fails)
])
def test_the_max_samples_query_is_sent_again_only_when_a_deadline_cut_it(monkeypatch, answers, sent):
    from clusterproof.prometheus import limits
    from clusterproof.prometheus.client import Answer
    made = {"422": Answer(422, 0.1, "execution", "query processing would load too many samples into memory"),
            "503": Answer(503, 0.45, "timeout", "query timed out in expression evaluation"),
            "200": Answer(200, 0.1)}
    queue = list(answers)
    calls = []
    monkeypatch.setattr(limits, "send_or_no_answer", lambda prom, q, wait, timeout=None: calls.append(q) or
                        made[queue.pop(0)])
    a = limits.send_past_the_deadline(None, "q", 5.0)
    assert len(calls) == sent and a is made[answers[-1]]
