"""The seed's pathological Prometheus queries: what load the Prometheus suite applies.

The seed cluster's Prometheus died under a dashboard that asked
``/api/v1/series`` for ``{le!=""}`` (every histogram bucket of the cluster)
while heavy histogram queries piled up. These are those requests, aimed at a
time window that holds data: the backfilled history on the embedded
Prometheus, the last ``window_s`` seconds on an existing one.

Pure: no client, no server (the suite and the benchmark send them).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

EVERY_BUCKET = '{le!=""}'
# Range queries may not return more points per series than this (Prometheus' API refuses more).
MAX_POINTS = 11000


@dataclass(frozen=True)
class Query:
    id: str
    what: str                 # how a reader would say it
    expr: str
    at: float                 # instant queries: evaluation time; range queries: end
    start: float | None = None
    step_s: float | None = None
    samples: int | None = None    # what it asks to load, where the harness knows
    copies: int = 1               # how many times the seed's expression is added up in it (``repeated``)

    @property
    def is_range(self) -> bool:
        return self.start is not None

    def __str__(self) -> str:
        if self.is_range:
            return (f"{self.expr} over {self.at - self.start:g} s at step {self.step_s:g} s "
                    f"({int((self.at - self.start) / self.step_s) + 1} points per series)")
        return self.expr


def seed_queries(at: float, window_s: int) -> list[Query]:
    """The seed's two heavy query shapes over every bucket of the cluster."""
    return [
        Query("histogram-quantile", "a cluster-wide histogram_quantile over every bucket",
              f"histogram_quantile(0.99, sum by (le) (rate({EVERY_BUCKET}[{window_s}s])))", at),
        Query("long-range", "a long range query of that quantile",
              f"histogram_quantile(0.99, sum by (le) (rate({EVERY_BUCKET}[5m])))", at,
              start=at - window_s, step_s=15),
    ]


def repeated(q: Query, copies: int) -> Query:
    """``q``'s expression ``copies`` times over, added up: how the timeout checks size a seed query to a
    history too small for one copy to run as long as the query timeout (``clusterproof.prometheus.limits``).

    Why adding copies, not a longer window or a finer step: PromQL selects and evaluates every selector
    of an expression on its own (no common sub-expression is shared), so the query's own time grows
    with ``copies``, while after each copy the engine keeps only its result (one series: the quantile),
    so its peak samples -- what ``--query.max-samples`` counts -- stay one copy's. A finer step or a
    longer window would grow the samples too, and meet max-samples before the timeout.
    """
    if copies <= 1:
        return q
    return replace(q, what=f"{q.what}, {copies} copies added up", expr=" + ".join([f"({q.expr})"] * copies),
                   copies=copies)


def max_samples_query(at: float, window_s: int, nodes: list[str], series_per_node: int, max_samples: int) -> Query:
    """A high-resolution range query over every series of the fewest nodes that make it load at
    least twice ``max_samples``: it selects few series (cheap to find), so only --query.max-samples,
    not the timeout, can stop it."""
    per_node = series_per_node * MAX_POINTS
    k = min(len(nodes), max(1, math.ceil(2 * max_samples / per_node)))
    points = min(MAX_POINTS, max(2, math.ceil(2 * max_samples / (k * series_per_node))))
    step = math.ceil(1000 * window_s / (points - 1)) / 1000      # ms resolution, never more points
    names = "|".join(nodes[:k])
    return Query("max-samples", f"every series of {k} node(s) ({k * series_per_node:,}) at {points:,} points",
                 f'{{node=~"{names}"}}', at, start=at - window_s, step_s=step,
                 samples=k * series_per_node * points)


def synthetic_max_samples_query(at: float, max_samples: int) -> Query:
    """For a Prometheus whose data the harness does not know: a subquery of ``vector(1)`` holding
    twice ``max_samples`` points (no storage read at all)."""
    return Query("max-samples", f"a subquery of {2 * max_samples:,} points",
                 f"count_over_time(vector(1)[{2 * max_samples}s:1s])", at, samples=2 * max_samples)


def tiny_timeout_probe() -> Query:
    """A modest query that a 1 ms request timeout must cut: no storage read, 60,000 steps of
    ``vector(time())`` (~0.1 s, 120,000 samples at its peak). Not ``vector(1)``: a step-invariant
    expression is evaluated once and copied to every step, with no deadline check in between."""
    return Query("tiny-timeout", "a 60,000-step subquery of vector(time())",
                 "count_over_time(vector(time())[1m:1ms])", 0)
