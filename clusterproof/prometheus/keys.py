"""The Prometheus query-limits suite's profile keys (suites/test_prometheus_limits.py); defaults in base.yaml."""
from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from clusterproof.core.keygroup import KeyGroup, NonNeg, NonNegFloat, Pos
from clusterproof.core.timeparse import duration_s


def _prom_duration(v: str) -> str:
    if duration_s(v) <= 0:
        raise ValueError(f"{v!r} must be a positive duration")
    return v


def _prom_duration_or_empty(v: str) -> str:
    return v and _prom_duration(v)


class PrometheusKeys(KeyGroup):
    prometheus_query_timeout: Annotated[str, AfterValidator(_prom_duration)]
    prometheus_embedded_query_timeout: Annotated[str, AfterValidator(_prom_duration_or_empty)]
    prometheus_max_samples: Pos
    prometheus_max_concurrency: Pos
    prometheus_gomaxprocs: NonNeg
    prometheus_timeout_slack_s: NonNegFloat
    prometheus_scrape_interval_s: Pos
    prometheus_backfill_nodes: NonNeg
    prometheus_backfill_minutes: Annotated[int, Field(ge=2, le=118)]
    prometheus_backfill_interval_s: Pos
    prometheus_series_limit: Pos
    prometheus_rss_factor: Annotated[float, Field(ge=1)]

    @staticmethod
    def rules(p) -> None:
        """A history of at least two points."""
        if p.prometheus_backfill_minutes * 60 < 2 * p.prometheus_backfill_interval_s:
            raise ValueError(f"prometheus_backfill_minutes={p.prometheus_backfill_minutes} holds fewer than two "
                             f"points at prometheus_backfill_interval_s={p.prometheus_backfill_interval_s}; raise "
                             "the minutes or lower the interval")


KEYS = PrometheusKeys
