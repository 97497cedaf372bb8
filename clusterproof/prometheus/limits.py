"""The seed's pathological queries sent to a Prometheus, measured: answers, time, memory, scrapes.

Shared by suites/test_prometheus_limits.py (the ``pathological`` fixture)
and clusterproof/bench/prometheus.py, so the suite's checks and the benchmark's figures
are the same numbers. What is sent is ``clusterproof/prometheus/queries.py``; this module
orders it and measures (RSS sampled before as the idle figure, then
throughout; ``up`` read back afterwards).

Order: each seed query alone; the seed quantile again with a request
``timeout=`` far above the server's limit; the max-samples query; the series
API with ``limit``; then ``burst_factor`` x max-concurrency seed quantiles at
once; then a cheap query. The unbounded series request is not in this
window (``series_unbounded``): nothing limits it, and the bound on memory
is about what the limits are meant to bound.
"""
from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from clusterproof.prometheus.client import Answer, Prom
from clusterproof.prometheus.history import node_names
from clusterproof.prometheus.queries import (
    EVERY_BUCKET,
    Query,
    max_samples_query,
    seed_queries,
    synthetic_max_samples_query,
)
from clusterproof.prometheus.server import PeakRss

# The client waits this much longer than the server's limit + slack before it gives up on an
# answer (and at most WAIT_CAP_S): enough to see what a Prometheus without limits does.
WAIT_MARGIN_S = 30.0
WAIT_CAP_S = 120.0
BYTES_PER_SAMPLE = 16      # a float sample in a query's memory (timestamp + value)
# A selected series while the storage expands it (its labels and chunk references). Measured with the
# 7,500-node history: two queries each expanding 1.09 M bucket series grew RSS by 150-450 MB, i.e.
# 70-200 B per series per query; the /api/v1/series answer costs ~1 KB per series.
BYTES_PER_SERIES = 256
# Time queries waited for a --query.max-concurrency slot, as Prometheus (2.x and 3.x) counts it.
QUEUE_TIME = 'prometheus_engine_query_duration_seconds_sum{slice="queue_time"}'


@dataclass
class Sent:
    query: Query
    answer: Answer


@dataclass
class Pathological:
    seed: dict[str, Sent]
    request_timeout: Sent           # the seed quantile, asking for a timeout far above the limit
    max_samples: Sent
    series_limited: Answer
    series_limited_count: int
    burst: list[Answer]
    burst_queue_s: float | None     # time the burst's queries spent in the engine's queue (its own figure)
    idle_process: int | None        # RSS from the OS before the queries
    idle_metric: float | None       # process_resident_memory_bytes before the queries
    selected_series: int            # series the seed queries select ({le!=""}), as far as known
    rss: PeakRss
    t_start: float                  # wall clock
    t_end: float
    cheap_after: Answer
    requested_timeout: str = ""

    @property
    def idle(self) -> float:
        return max(self.idle_process or 0, self.idle_metric or 0)


def window(target, profile) -> tuple[float, int]:
    """(evaluation time, window in s) that holds data: the history on the embedded Prometheus,
    the last ``prometheus_backfill_minutes`` on an existing one."""
    if target.history is not None:
        return float(target.history.end), target.history.end - target.history.start
    return time.time(), profile.prometheus_backfill_minutes * 60


def wait_s(target, slack_s: float) -> float:
    return min(WAIT_CAP_S, target.timeout_s + slack_s + WAIT_MARGIN_S)


def send(prom: Prom, q: Query, wait: float, timeout: str | None = None) -> Answer:
    if q.is_range:
        return prom.query_range(q.expr, q.start, q.at, q.step_s, timeout=timeout, wait_s=wait, stats=True)
    return prom.query(q.expr, at=q.at or None, timeout=timeout, wait_s=wait, stats=True)


def send_or_no_answer(prom: Prom, q: Query, wait: float, timeout: str | None = None) -> Answer:
    """``send``, with a client-side give-up (no answer within ``wait``) as an answer of its own."""
    t0 = time.monotonic()
    try:
        return send(prom, q, wait, timeout)
    except Exception as e:   # requests' timeouts and connection errors: Prometheus did not answer
        return Answer(0, time.monotonic() - t0, "no-answer", f"{type(e).__name__}: no answer within {wait:g} s"
                      if "timed out" in str(e).lower() or "Timeout" in type(e).__name__ else f"{type(e).__name__}: {e}")


def send_past_the_deadline(prom: Prom, q: Query, wait: float, attempts: int = 3) -> Answer:
    """``send_or_no_answer`` for the query that must reach ``--query.max-samples``: an answer cut by the
    query timeout first proves nothing either way -- the query never got to load its samples -- so it is
    sent again, up to ``attempts`` times; the last answer stands (and is judged). On an idle machine the
    first answer is the 422; on a starved one (the smoke profile's 250 ms timeout, a second cluster
    running beside it) the first attempt was measured cut at 0.45 s (2026-11-26, the read-only guest run
    in a fresh-clone ``./proof test``)."""
    a = send_or_no_answer(prom, q, wait)
    for _ in range(attempts - 1):
        if not a.deadline:
            break
        a = send_or_no_answer(prom, q, wait)
    return a


def run_pathological(target, profile, burst_factor: int = 3, wait: float | None = None) -> Pathological:
    """``wait``: how long the client waits for each answer (default: the limit + slack + a margin)."""
    prom, server = target.prom, target.server
    at, win = window(target, profile)
    wait = wait or wait_s(target, profile.prometheus_timeout_slack_s)
    seeds = seed_queries(at, win)
    if target.history is not None:
        h = target.history
        over = max_samples_query(at, win, node_names(h.shape.nodes), h.shape.node_labelled_series(),
                                 profile.prometheus_max_samples)
    else:
        over = synthetic_max_samples_query(at, profile.prometheus_max_samples)
    asked = f"{max(60.0, 100 * target.timeout_s):g}s"
    if target.history is not None:
        selected = target.history.bucket_series
    else:   # an existing Prometheus: ask it (bounded by its own timeout; 0 if it cannot say)
        a = prom.query(f"count({EVERY_BUCKET})", wait_s=wait)
        selected = int(float(a.data["result"][0]["value"][1])) if a.ok and a.data["result"] else 0
    idle_process = server.rss_bytes() if server is not None else None
    idle_metric = prom.own_metric("process_resident_memory_bytes")
    t_start = time.time()
    with PeakRss(server, prom) as rss:
        sent = {q.id: Sent(q, send_or_no_answer(prom, q, wait)) for q in seeds}
        request_timeout = Sent(seeds[0], send_or_no_answer(prom, seeds[0], wait, timeout=asked))
        max_samples = Sent(over, send_past_the_deadline(prom, over, wait))
        limited, limited_n = prom.series_count(EVERY_BUCKET, limit=profile.prometheus_series_limit, wait_s=wait)
        n = burst_factor * profile.prometheus_max_concurrency
        queue_before = prom.own_metric(QUEUE_TIME)
        with ThreadPoolExecutor(n) as pool:
            burst = list(pool.map(lambda _: send_or_no_answer(prom.clone(), seeds[0], wait),
                                  range(n)))
        queue_after = prom.own_metric(QUEUE_TIME)
    t_end = time.time()
    cheap = prom.query("count(up)", wait_s=wait)
    queued_s = (queue_after - queue_before) if queue_before is not None and queue_after is not None else None
    return Pathological(sent, request_timeout, max_samples, limited, limited_n, burst, queued_s, idle_process,
                        idle_metric, selected, rss, t_start, t_end, cheap, asked)


@dataclass
class Unbounded:
    answer: Answer
    series: int
    idle: float
    peak: float


def series_unbounded(target, wait: float = 600.0) -> Unbounded:
    """The seed's series request as the dashboard sent it: ``{le!=""}``, no limit."""
    prom = target.prom
    with PeakRss(target.server, prom) as rss:
        idle = rss.server.rss_bytes() if rss.server is not None else prom.own_metric("process_resident_memory_bytes")
        answer, n = prom.series_count(EVERY_BUCKET, wait_s=wait)
    return Unbounded(answer, n, float(idle or 0), rss.peak)


@dataclass
class Scrapes:
    """Per job: the largest gap between successive ``up`` samples in a window, and failed scrapes."""
    interval_s: dict[str, float] = field(default_factory=dict)
    max_gap_s: dict[str, float] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    samples: dict[str, int] = field(default_factory=dict)
    answer: Answer | None = None


def scrapes(prom: Prom, t_start: float, t_end: float, interval_s: float | None, before_s: float = 60) -> Scrapes:
    """``up`` as Prometheus stored it around [t_start, t_end]: per target, the largest gap between the last
    scrape before the window, every scrape in it, and the first after it (call once a scrape after ``t_end``
    exists). ``interval_s`` None: each target's median gap (an existing Prometheus' own setting)."""
    now = time.time()
    a = prom.settled(f"up[{int(now - t_start + before_s) + 1}s]", at=now)
    out = Scrapes(answer=a)
    for series in (a.data or {}).get("result", []) if a.ok else []:
        job = series["metric"].get("job", "?") + "/" + series["metric"].get("instance", "?")
        pts = sorted((float(t), float(v)) for t, v in series["values"])
        ts = [t for t, _ in pts]
        before, after = [t for t in ts if t <= t_start], [t for t in ts if t >= t_end]
        lo, hi = (before[-1] if before else ts[0]), (after[0] if after else now)
        edges = [t for t in ts if lo <= t <= hi] + ([] if after else [now])
        all_gaps = [y - x for x, y in zip(ts, ts[1:])]
        iv = interval_s or (statistics.median(all_gaps) if all_gaps else None)
        if iv is None:
            continue
        out.interval_s[job] = iv
        out.max_gap_s[job] = max([y - x for x, y in zip(edges, edges[1:])] or [0.0])
        out.failed[job] = sum(1 for t, v in pts if t_start <= t <= t_end and v != 1)
        out.samples[job] = sum(1 for t in ts if t_start <= t <= t_end)
    return out


def limit_bound(idle_bytes: float, profile, selected_series: int) -> float:
    """What the limits let the pathological queries hold: ``prometheus_rss_factor`` x idle (GOGC=100
    lets the Go heap double) + max-concurrency running queries, each holding at most max-samples
    samples and the series it selects while the storage expands them (``BYTES_PER_SERIES``)."""
    per_query = profile.prometheus_max_samples * BYTES_PER_SAMPLE + selected_series * BYTES_PER_SERIES
    return profile.prometheus_rss_factor * idle_bytes + profile.prometheus_max_concurrency * per_query
