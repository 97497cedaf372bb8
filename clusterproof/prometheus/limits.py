"""The seed's pathological queries sent to a Prometheus, measured: answers, time, memory, scrapes.

Shared by suites/test_prometheus_limits.py (the ``pathological`` fixture)
and clusterproof/bench/prometheus.py, so the suite's checks and the benchmark's figures
are the same numbers. What is sent is ``clusterproof/prometheus/queries.py``; this module
orders it and measures (RSS sampled before as the idle figure, then
throughout; ``up`` read back afterwards).

Order: each seed query alone (sized to the history, below); the seed quantile
again with a request ``timeout=`` far above the server's limit; the
max-samples query; the series API with ``limit``; then ``burst_factor`` x
max-concurrency seed quantiles at once; then a cheap query. The unbounded
series request is not in this window (``series_unbounded``): nothing limits
it, and the bound on memory is about what the limits are meant to bound.

A limit check judges only a query that reached its limit (``reach``,
``judge_cut``). Prometheus answers a query that ran to its end with its own
time (``stats=all``: ``execTotalTime``, the time it ran under the engine's
deadline, queue included); a query cut by the deadline answers with a
deadline error. So an answer is one of:

- cut by the deadline: judged (within the timeout + slack, or late: red);
- refused by ``--query.max-samples``: another limit stopped it before the
  timeout could act -- it says nothing about the timeout (skip, saying so;
  the max-samples check judges that limit);
- answered, its own time past the timeout + slack: the query reached the
  deadline and ran on -- the limit does not hold (red);
- answered within the timeout + slack: it never ran long enough to need
  cutting, whatever the server's timeout is -- "big enough" is measured, not
  assumed. The history was too small for it: the harness sizes the query to
  the history (``sized_to_the_timeout``: the seed's expression added up
  ``copies`` times, from the own time it measured, so that uncut it would run
  ``SIZE_TARGET`` x (timeout + slack)); still under the limit at
  ``MAX_COPIES`` copies (a history of almost nothing), the check skips,
  naming ``prometheus_backfill_nodes``.

A Prometheus without a working timeout is therefore red on any history the
sizing can fill (its sized query runs ~2x past the timeout and is answered),
and a healthy one is never red for a query too light to reach its limit.
"""
from __future__ import annotations

import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from clusterproof.core import measurement
from clusterproof.prometheus.client import Answer, Prom
from clusterproof.prometheus.history import node_names
from clusterproof.prometheus.queries import (
    EVERY_BUCKET,
    Query,
    max_samples_query,
    repeated,
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
# Sizing a seed query to the history (``sized_to_the_timeout``): enough copies that, uncut, it would run this many
# times the timeout + slack (a margin for a machine that runs the copies faster than the first, warm caches);
# at most MAX_COPIES copies (from an own time of timeout + slack / 32: below that the history holds almost
# nothing), in at most SIZING_ROUNDS more queries.
SIZE_TARGET = 2.0
MAX_COPIES = 64
SIZING_ROUNDS = 3

# How an answer stands to the query timeout (``reach``).
CUT, RAN_PAST, UNDER, OTHER_LIMIT, FAILED = "cut", "ran-past", "under", "max-samples", "failed"


@dataclass
class Sent:
    query: Query
    answer: Answer
    # the same query with fewer copies, answered under the limit before this one was sent (``sized_to_the_timeout``)
    lighter: list["Sent"] = field(default_factory=list)


def own_time_s(a: Answer) -> float | None:
    """The time the engine ran the query under its deadline (``execTotalTime`` of ``stats=all``; queue
    included), where Prometheus answered it whole; None otherwise."""
    t = (a.stats.get("timings") or {}).get("execTotalTime") if a.ok else None
    return float(t) if isinstance(t, (int, float)) else None


def reach(a: Answer, timeout_s: float, slack_s: float) -> str:
    """Where an answer stands to a query timeout of ``timeout_s`` (the module's docstring says why):
    ``CUT``, ``OTHER_LIMIT`` (max-samples), ``RAN_PAST`` (answered, or no answer at all, past timeout + slack),
    ``UNDER`` (answered within them: never reached the limit) or ``FAILED`` (any other error). Pure."""
    if a.deadline:
        return CUT
    if a.too_many_samples:
        return OTHER_LIMIT
    if a.status == 0:            # the client gave up long after the deadline (``send_or_no_answer``)
        return RAN_PAST
    if not a.ok:
        return FAILED
    own = own_time_s(a)
    return RAN_PAST if (a.elapsed_s if own is None else own) > timeout_s + slack_s else UNDER


def copies_for(sent: Sent, timeout_s: float, slack_s: float) -> int:
    """How many copies of the seed expression would run ``SIZE_TARGET`` x (timeout + slack) uncut, from what
    ``sent`` (answered under the limit) took; at most ``MAX_COPIES``. Pure."""
    own = own_time_s(sent.answer) or sent.answer.elapsed_s
    per_copy = max(own, 1e-3) / sent.query.copies
    return min(MAX_COPIES, math.ceil(SIZE_TARGET * (timeout_s + slack_s) / per_copy))


def sized_to_the_timeout(prom: Prom, seed: Query, first: Answer | Sent, timeout_s: float, slack_s: float,
                         wait: float, asked: str | None = None) -> Sent:
    """The seed query, sized to the history: while its answer came under the limit, the seed expression is
    added up more times (``clusterproof.prometheus.queries.repeated``) and sent again; the last answer
    stands (and is judged), the lighter ones ride along in ``Sent.lighter``. ``first``: the seed's answer,
    or a ``Sent`` of the seed already repeated; ``asked``: the ``timeout=`` each query asks for."""
    sent = first if isinstance(first, Sent) else Sent(seed, first)
    for _ in range(SIZING_ROUNDS):
        if reach(sent.answer, timeout_s, slack_s) != UNDER:
            break
        copies = copies_for(sent, timeout_s, slack_s)
        if copies <= sent.query.copies:
            break
        q = repeated(seed, copies)
        sent = Sent(q, send_or_no_answer(prom, q, wait, asked), [*sent.lighter, sent])
    return sent


@dataclass(frozen=True)
class Judgement:
    """A timeout check's verdict on one answer: "pass", "skip" (cannot judge) or "fail", with its line."""
    outcome: str
    message: str


def _sizing_note(sent: Sent) -> str:
    return "".join(f"; with {s.query.copies} cop{'y' if s.query.copies == 1 else 'ies'} it answered in "
                   f"{s.answer.elapsed_s:.2f} s" for s in sent.lighter)


def judge_cut(sent: Sent, timeout_s: float, slack_s: float, required: str, server_timeout: str,
              too_light: str) -> Judgement:
    """A seed query must be cut by the query timeout within ``timeout_s`` + ``slack_s``. ``required``: the
    timeout the profile asks for; ``server_timeout``: the server's own ``--query.timeout``; ``too_light``: what
    would make the query heavy enough, said when it cannot judge. Pure."""
    a, bound, what = sent.answer, timeout_s + slack_s, sent.query.what
    kind = reach(a, timeout_s, slack_s)
    if kind == CUT:
        if a.elapsed_s <= bound:
            return Judgement("pass", f"{what} was cut after {a.elapsed_s:.2f} s: {a}")
        return Judgement("fail", f"{what} was cut ({a.status} {a.error_type}: {a.error}) only after "
                                 f"{a.elapsed_s:.2f} s, more than the query timeout {timeout_s:g} s + "
                                 f"{slack_s:g} s slack")
    if kind == OTHER_LIMIT:
        return Judgement("skip", (
            f"cannot judge the query timeout: {what} was refused by --query.max-samples ({a}) before the "
            f"timeout could act -- another limit (test_a_query_over_max_samples_gets_422 judges it), so this "
            f"query says nothing about the timeout here; {too_light}"))
    if kind == UNDER:
        own = own_time_s(a)
        took = f"its own time {own:.3f} s" if own is not None else f"{a.elapsed_s:.2f} s"
        return Judgement("skip", (
            f"cannot judge the query timeout: {what} answered whole within the {required} timeout + "
            f"{slack_s:g} s slack ({took}{_sizing_note(sent)}): it never ran long enough to need cutting; "
            f"{too_light}"))
    if kind == FAILED:
        return Judgement("fail", f"{what} failed with neither a deadline error nor an answer: {a}")
    own = own_time_s(a)
    total, _ = a.samples()
    ran = (f"it ran {own:.2f} s by Prometheus' own count" if own is not None else
           f"it ran more than {a.elapsed_s:.0f} s (no answer by then)" if a.status == 0 else
           f"it ran {a.elapsed_s:.2f} s") + (f" and read {total:,} samples" if total else "")
    return Judgement("fail", (
        f"{what} was not cut by the query timeout ({required} required; --query.timeout={server_timeout} on the "
        f"server): {a}; {ran}"))


def too_light(target, profile, selected_series: int) -> str:
    """What would give the timeout checks a query heavy enough to judge, on this kind of Prometheus."""
    if target.history is not None:
        h = target.history
        now = profile.prometheus_backfill_nodes or f"0, i.e. the profile's nodes, {profile.nodes}"
        return (f"the embedded Prometheus' history of {h.shape.nodes:,} nodes ({h.bucket_series:,} bucket series) "
                f"is too small for it: raise prometheus_backfill_nodes (now {now}; the smoke profile's 1,000 "
                "nodes take seconds here)")
    return (f"the Prometheus at {target.prom.url} holds {selected_series:,} {EVERY_BUCKET} series over the last "
            f"{profile.prometheus_backfill_minutes} minutes (prometheus_backfill_minutes), too few for it: judge "
            "its timeout where it holds a cluster's worth of histograms, or judge the embedded Prometheus "
            "(no --cp-prometheus-url)")


MIB = 1 << 20


@dataclass
class Pathological(measurement.Base):
    """The pathological queries against the limits, measured by ``run_pathological`` (which starts and stops its
    RSS sampler around them: ``Base``'s start and dispose)."""
    seed: dict[str, Sent]           # each seed query, sized to the history (``sized_to_the_timeout``)
    request_timeout: Sent           # the seed quantile as sized, asking for a timeout far above the limit
    max_samples: Sent
    series_limited: Answer
    series_limited_count: int
    burst: list[Answer]
    burst_queue_s: float | None     # time the burst's queries spent in the engine's queue (its own figure)
    idle_process: int | None        # RSS from the OS before the queries
    idle_metric: float | None       # process_resident_memory_bytes before the queries
    selected_series: int            # series a seed query selects ({le!=""} x its copies), as far as known
    rss: PeakRss
    t_start: float                  # wall clock
    t_end: float
    cheap_after: Answer
    requested_timeout: str = ""
    bucket_series: int = 0          # {le!=""} series in the Prometheus (one copy's selection)

    @property
    def idle(self) -> float:
        return max(self.idle_process or 0, self.idle_metric or 0)

    def gather(self) -> list[measurement.Figure]:
        f = measurement.figure
        return [f(f"seed {name}: elapsed", s.answer.elapsed_s, "s") for name, s in self.seed.items()] + [
            f("request timeout far above the limit: elapsed", self.request_timeout.answer.elapsed_s, "s"),
            f("max-samples query: elapsed", self.max_samples.answer.elapsed_s, "s"),
            f("series with a limit: returned", self.series_limited_count, "series"),
            f("burst: queries sent at once", len(self.burst), "queries"),
            f("burst: time in the query queue", self.burst_queue_s, "s"),
            f("burst: slowest answer", max((a.elapsed_s for a in self.burst), default=None), "s"),
            f("idle RSS (process)", (self.idle_process or 0) / MIB, "MiB"),
            f("idle RSS (process_resident_memory_bytes)", (self.idle_metric or 0) / MIB, "MiB"),
            f("peak RSS (process)", self.rss.process_peak / MIB, "MiB"),
            f("peak RSS (process_resident_memory_bytes)", self.rss.metric_peak / MIB, "MiB"),
            f("count(up) right after: elapsed", self.cheap_after.elapsed_s, "s")]


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


def send_past_the_deadline(prom: Prom, q: Query, wait: float, attempts: int = 6, pause_s: float = 1.0) -> Answer:
    """``send_or_no_answer`` for the query that must reach ``--query.max-samples``: an answer cut by the
    query timeout first proves nothing either way -- the query never got to load its samples -- so it is
    sent again, up to ``attempts`` times, ``pause_s`` apart; the last answer stands (and is judged). On an
    idle machine the first answer is the 422; on a starved one (the smoke profile's 250 ms timeout, a second
    cluster running beside it) the first attempt was measured cut at 0.45 s (2026-11-26, the read-only guest
    run in a fresh-clone ``./proof test``). A burst of work beside (another cluster's bring-up) lasts
    seconds, and attempts sent back to back land in the same burst: they are spread over about
    ``attempts * pause_s``."""
    a = send_or_no_answer(prom, q, wait)
    for _ in range(attempts - 1):
        if not a.deadline:
            break
        time.sleep(pause_s)   # a bounded pause between re-sends (not synchronisation): let a burst beside pass
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
    t, slack = target.timeout_s, profile.prometheus_timeout_slack_s
    with PeakRss(server, prom) as rss:
        sent = {q.id: sized_to_the_timeout(prom, q, send_or_no_answer(prom, q, wait), t, slack, wait) for q in seeds}
        heavy = sent[seeds[0].id].query     # the seed quantile, as many copies as this history needs
        # Sent again asking for a far longer timeout: sized again if this time it ran under the limit (the
        # seed's first answer may have been cut on a busy machine and this one, with warm caches, not)
        request_timeout = sized_to_the_timeout(
            prom, seeds[0], Sent(heavy, send_or_no_answer(prom, heavy, wait, timeout=asked)), t, slack, wait, asked)
        max_samples = Sent(over, send_past_the_deadline(prom, over, wait))
        limited, limited_n = prom.series_count(EVERY_BUCKET, limit=profile.prometheus_series_limit, wait_s=wait)
        n = burst_factor * profile.prometheus_max_concurrency
        queue_before = prom.own_metric(QUEUE_TIME)
        with ThreadPoolExecutor(n) as pool:
            burst = list(pool.map(lambda _: send_or_no_answer(prom.clone(), heavy, wait), range(n)))
        queue_after = prom.own_metric(QUEUE_TIME)
    t_end = time.time()
    cheap = prom.query("count(up)", wait_s=wait)
    queued_s = (queue_after - queue_before) if queue_before is not None and queue_after is not None else None
    copies = max(s.query.copies for s in sent.values())
    return Pathological(sent, request_timeout, max_samples, limited, limited_n, burst, queued_s, idle_process,
                        idle_metric, selected * copies, rss, t_start, t_end, cheap, asked, selected)


@dataclass
class Unbounded(measurement.Base):
    """The seed's unlimited series request (``series_unbounded`` samples RSS around it)."""
    answer: Answer
    series: int
    idle: float
    peak: float

    def gather(self) -> list[measurement.Figure]:
        f = measurement.figure
        return [f("series returned", self.series, "series"), f("answer size", self.answer.nbytes / MIB, "MiB"),
                f("elapsed", self.answer.elapsed_s, "s"), f("RSS growth", (self.peak - self.idle) / MIB, "MiB")]


def series_unbounded(target, wait: float = 600.0) -> Unbounded:
    """The seed's series request as the dashboard sent it: ``{le!=""}``, no limit."""
    prom = target.prom
    with PeakRss(target.server, prom) as rss:
        idle = rss.server.rss_bytes() if rss.server is not None else prom.own_metric("process_resident_memory_bytes")
        answer, n = prom.series_count(EVERY_BUCKET, wait_s=wait)
    return Unbounded(answer, n, float(idle or 0), rss.peak)


@dataclass
class Scrapes(measurement.Base):
    """Per job: the largest gap between successive ``up`` samples in a window, and failed scrapes (read after the
    window from what Prometheus stored: nothing to start or dispose of)."""
    interval_s: dict[str, float] = field(default_factory=dict)
    max_gap_s: dict[str, float] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    samples: dict[str, int] = field(default_factory=dict)
    answer: Answer | None = None

    def gather(self) -> list[measurement.Figure]:
        f = measurement.figure
        return [g for job, gap in self.max_gap_s.items()
                for g in (f(f"{job}: longest gap between scrapes", gap, "s"),
                          f(f"{job}: failed scrapes", self.failed.get(job, 0), "scrapes"))]


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
