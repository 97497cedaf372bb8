"""Unit tests of the Prometheus helpers: pure functions, and the client against tiny local HTTP servers."""
from __future__ import annotations

import http.server
import json
import math
import threading

import pytest
import requests
from prometheus_api_client import PrometheusApiClientException

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
from clusterproof.provision import toolchain


@pytest.mark.parametrize("text,seconds", [("250ms", 0.25), ("2s", 2), ("10m", 600), ("1h30m", 5400), ("1.5", 1.5),
                                          ("1d", 86400)])
@pytest.mark.unit
def test_prometheus_durations(text, seconds):
    assert duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["soon", "", "2x", "1m2", "s"])
@pytest.mark.unit
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
@pytest.mark.unit
def test_answers_are_classified_as_prometheus_documents_them(status, body, deadline, samples):
    a = answer_from(status, json.dumps(body).encode(), 0.3)
    assert (a.deadline, a.too_many_samples, a.ok) == (deadline, samples, status == 200)


@pytest.mark.unit
def test_a_library_error_is_made_readable_again():
    body = b'{"status":"error","errorType":"timeout","error":"query timed out in query execution"}'
    e = PrometheusApiClientException(f"HTTP Status Code 503 ({body!r})")
    a = from_library_error(e, 1.0)
    assert (a.status, a.error_type, a.error) == (503, "timeout", "query timed out in query execution")
    assert str(a) == "503 timeout after 1.00 s: query timed out in query execution"


@pytest.mark.unit
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


@pytest.mark.unit
def test_the_harness_client_never_retries_a_503(server):
    s = server(503, {"status": "error", "errorType": "timeout", "error": "query timed out in query queue"})
    p = Prom(s.url)
    a = p.query("up")
    assert s.requests == 1 and a.error_type == "timeout" and a.in_queue
    with pytest.raises(Exception) as e:   # the library's own method, same session: one request, readable error
        p.custom_query("up")
    assert s.requests == 2 and "503 timeout" in str(e.value)


@pytest.mark.unit
def test_the_harness_client_does_not_retry_a_refused_connection():
    p = Prom("http://127.0.0.1:1")
    with pytest.raises(requests.exceptions.ConnectionError):
        p.query("up", wait_s=5)


@pytest.mark.cluster
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


@pytest.mark.unit
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


@pytest.mark.cluster
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
@pytest.mark.unit
def test_the_max_samples_query_asks_for_twice_the_limit(max_samples):
    q = max_samples_query(1_000_000.0, 1740, node_names(1000), 322, max_samples)
    points = round((q.at - q.start) / q.step_s) + 1
    assert points <= MAX_POINTS
    assert q.samples >= min(2 * max_samples, 1000 * 322 * MAX_POINTS * 0.99)


@pytest.mark.unit
def test_seed_queries_cover_every_bucket():
    qs = seed_queries(1000.0, 1740)
    assert [q.id for q in qs] == ["histogram-quantile", "long-range"]
    assert all('{le!=""}' in q.expr for q in qs) and qs[1].is_range and not qs[0].is_range


@pytest.mark.unit
def test_promql_window_is_exact_and_counts_new_series():
    q = promslo.queries(promslo.selector(("POST",), ("resource",), 'resource="configmaps"'), 100.0, 200.0)
    assert "@ 200.000) - (" in q["quantile"] and "@ 100.000) or (" in q["quantile"]
    assert q["quantile"].startswith("histogram_quantile(0.99, sum by (verb, group, resource, subresource, scope, le)")


@pytest.mark.unit
def test_memory_bound_is_what_the_limits_allow():
    class P:
        prometheus_rss_factor, prometheus_max_concurrency, prometheus_max_samples = 2.0, 2, 1_000_000
    assert limit_bound(100e6, P, 1000) == 200e6 + 2 * (1_000_000 * 16 + 1000 * 256)


class _FakeProm:
    def __init__(self, result):
        self.result = result

    def settled(self, expr, at=None, within_s=30):
        return Answer(200, 0.01, data={"resultType": "matrix", "result": self.result})


@pytest.mark.unit
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


@pytest.mark.unit
def test_scrape_gaps_span_the_window_from_the_scrape_before_to_the_one_after():
    """A window shorter than the interval: the scrapes around it still count (no sample inside is not 'no data')."""
    fake = _FakeProm([{"metric": {"job": "prometheus", "instance": "a"},
                       "values": [[100, "1"], [102, "1"], [106, "1"]]}])
    s = scrapes(fake, 102.5, 103.0, 2.0)
    assert s.max_gap_s["prometheus/a"] == 4 and s.samples["prometheus/a"] == 0


@pytest.mark.parametrize("answers, sent", [
    (["422"], 1),                          # the limit at once
    (["503", "422"], 2),                   # cut by the timeout first (a starved machine), then the limit
    (["503"] * 6, 6),                      # cut every time: the last cut answer is judged (and fails)
    (["200"], 1),                          # answered whole: judged at once (and fails)
])
@pytest.mark.unit
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
    a = limits.send_past_the_deadline(None, "q", 5.0, pause_s=0)
    assert len(calls) == sent and a is made[answers[-1]]


# --- judging a timeout check: a query that never reached its limit judges nothing -------------------------------

T, SLACK = 0.25, 0.5        # the smoke/base profile's prometheus_query_timeout and prometheus_timeout_slack_s


def _answered(elapsed_s: float, own_s: float | None, samples: int = 4_350_000) -> Answer:
    stats = {"samples": {"totalQueryableSamples": samples, "peakSamples": 29_013}}
    if own_s is not None:
        stats["timings"] = {"execTotalTime": own_s, "execQueueTime": 0.0001}
    return Answer(200, elapsed_s, data={"resultType": "vector", "result": [], "stats": stats})


CUT_422 = Answer(422, 0.27, "execution", "expanding series: context deadline exceeded")
CUT_503 = Answer(503, 0.26, "timeout", "query timed out in expression evaluation")
MAX_SAMPLES = Answer(422, 0.12, "execution", "query processing would load too many samples into memory in query "
                                             "execution")


@pytest.mark.parametrize("answer, kind", [
    (CUT_422, "cut"), (CUT_503, "cut"),
    (MAX_SAMPLES, "max-samples"),                         # another limit stopped it: not "not cut"
    (_answered(0.26, 0.19), "under"),                     # the new user's case: 0.19-0.26 s against 250 ms
    (_answered(0.30, None), "under"),                     # no stats: the client's time, same bound
    (_answered(0.74, 0.74), "under"),                     # within the slack a cut may take too
    (_answered(3.2, 3.1), "ran-past"),                    # Prometheus without a useful --query.timeout
    (Answer(0, 55.0, "no-answer", "ReadTimeout: no answer within 55 s"), "ran-past"),
    (Answer(400, 0.01, "bad_data", "parse error"), "failed"),
])
@pytest.mark.unit
def test_an_answer_is_placed_against_the_timeout(answer, kind):
    from clusterproof.prometheus.limits import reach
    assert reach(answer, T, SLACK) == kind


def _sent(answer, copies=1, lighter=()):
    from clusterproof.prometheus.limits import Sent
    from clusterproof.prometheus.queries import repeated
    return Sent(repeated(seed_queries(1000.0, 1740)[0], copies), answer, list(lighter))


def _judge(sent, server="250ms"):
    from clusterproof.prometheus.limits import judge_cut
    return judge_cut(sent, T, SLACK, "250ms", server, "raise prometheus_backfill_nodes (now 0)")


@pytest.mark.unit
def test_a_query_answered_under_the_limit_cannot_judge_it_and_names_the_key():
    j = _judge(_sent(_answered(0.26, 0.19)))
    assert j.outcome == "skip", j
    assert "cannot judge the query timeout" in j.message and "prometheus_backfill_nodes" in j.message, j.message
    assert "not cut" not in j.message and "0.190 s" in j.message, j.message


@pytest.mark.unit
def test_a_query_refused_by_max_samples_is_said_to_meet_another_limit_not_called_uncut():
    j = _judge(_sent(MAX_SAMPLES))
    assert j.outcome == "skip", j
    assert "--query.max-samples" in j.message and "another limit" in j.message and "not cut" not in j.message, \
        j.message


@pytest.mark.unit
def test_a_query_that_ran_past_the_timeout_is_red_naming_the_server_flag_and_what_it_read():
    j = _judge(_sent(_answered(3.2, 3.1)), server="10m")
    assert j.outcome == "fail", j
    for part in ("was not cut by the query timeout", "--query.timeout=10m", "it ran 3.10 s", "4,350,000 samples"):
        assert part in j.message, j.message


@pytest.mark.parametrize("answer, outcome", [(CUT_422, "pass"), (Answer(503, 0.9, "timeout", "query timed out in "
                                                                         "query execution"), "fail")])
@pytest.mark.unit
def test_a_cut_query_passes_only_within_the_timeout_and_slack(answer, outcome):
    assert _judge(_sent(answer)).outcome == outcome


@pytest.mark.unit
def test_repeated_copies_add_up_the_seed_expression():
    from clusterproof.prometheus.queries import repeated
    q = seed_queries(1000.0, 1740)[0]
    assert repeated(q, 1) is q
    r = repeated(q, 3)
    assert r.copies == 3 and r.expr == " + ".join([f"({q.expr})"] * 3) and "3 copies" in r.what
    assert (r.at, r.start, r.step_s, r.id) == (q.at, q.start, q.step_s, q.id)


@pytest.mark.parametrize("own_s, copies", [(0.19, 8), (0.75, 2), (0.0001, 64)])
@pytest.mark.unit
def test_copies_are_sized_to_run_twice_the_timeout_and_slack(own_s, copies):
    from clusterproof.prometheus.limits import copies_for
    assert copies_for(_sent(_answered(own_s, own_s)), T, SLACK) == copies


class _History:
    """A Prometheus over a small history: each copy of the seed expression costs ``per_copy_s``; with a timeout
    (``None``: none) it cuts a query whose own time would pass it."""

    def __init__(self, per_copy_s: float, timeout_s: float | None):
        self.per_copy_s, self.timeout_s, self.sent = per_copy_s, timeout_s, []

    def send(self, prom, q, wait, timeout=None):
        self.sent.append(q.copies)
        own = q.copies * self.per_copy_s
        if self.timeout_s is not None and own > self.timeout_s:
            return Answer(422, self.timeout_s + 0.01, "execution", "expanding series: context deadline exceeded")
        return _answered(own + 0.01, own)


@pytest.mark.parametrize("per_copy_s, timeout_s, copies, outcome", [
    (0.19, T, [1, 8], "pass"),                 # the new user's 200-node history: sized, then cut in time
    (0.19, None, [1, 8], "fail"),              # the same history without a query timeout: still red
    (2.5, T, [1], "pass"),                     # a big history: the seed alone is cut
    (2.5, None, [1], "fail"),
    (0.0005, T, [1, 64], "skip"),              # a history of nothing: 64 copies still under the limit
])
@pytest.mark.unit
def test_a_seed_query_is_sized_to_the_history_and_judged_only_where_it_reached_the_limit(
        monkeypatch, per_copy_s, timeout_s, copies, outcome):
    from clusterproof.prometheus import limits
    history = _History(per_copy_s, timeout_s)
    monkeypatch.setattr(limits, "send_or_no_answer", history.send)
    seed = seed_queries(1000.0, 1740)[0]
    sent = limits.sized_to_the_timeout(None, seed, history.send(None, seed, 60), T, SLACK, 60)
    assert history.sent == copies and sent.query.copies == copies[-1]
    assert [s.query.copies for s in sent.lighter] == copies[:-1]
    j = _judge(sent, server="10m" if timeout_s is None else "250ms")
    assert j.outcome == outcome, j.message
    if outcome == "skip":
        assert "with 1 copy it answered" in j.message and "prometheus_backfill_nodes" in j.message, j.message


@pytest.mark.unit
def test_a_query_cut_once_and_answered_under_the_limit_when_sent_again_is_sized_again(monkeypatch):
    """The request-timeout check sends the seed (as sized) again: its first answer was cut on a busy machine,
    the second, with warm caches, came under the limit (0.233 s against 250 ms, measured in CI). It is sized
    again from that answer, so the check judges a query that reaches the limit instead of skipping."""
    from clusterproof.prometheus import limits
    history = _History(0.19, T)
    monkeypatch.setattr(limits, "send_or_no_answer", history.send)
    seed = seed_queries(1000.0, 1740)[0]
    cut_first = limits.Sent(seed, Answer(503, T + 0.01, "timeout", "query timed out in expression evaluation"))
    assert limits.sized_to_the_timeout(None, seed, cut_first, T, SLACK, 60).query.copies == 1   # cut: stands
    again = limits.Sent(seed, history.send(None, seed, 60, timeout="60s"))                     # warm: under
    sent = limits.sized_to_the_timeout(None, seed, again, T, SLACK, 60, asked="60s")
    assert sent.query.copies == 8 and [s.query.copies for s in sent.lighter] == [1]
    assert _judge(sent, server="250ms").outcome == "pass"
