"""API-call latency SLO figures from Prometheus: PromQL over a window, as ClusterLoader2 computes them.

Why a second source: ``clusterproof.kube.apimetrics`` reads one kube-apiserver's own
``/metrics`` (one replica behind a load balancer); a Prometheus that scrapes
every replica sums them all, and keeps the figures after the run. The SLO
is the same: p99 of ``apiserver_request_duration_seconds`` per (verb,
resource, scope) over the window, here ``histogram_quantile`` in PromQL.

The window is exact, not extrapolated: bucket counts at its end minus those
at its start (``x @ end - x @ start``; a series born inside the window
counts from zero), so over the same two scrapes it equals the difference
of two ``/metrics`` snapshots. ``increase(x[w])`` would extrapolate to the
window's edges. A counter that went down (an apiserver restarted inside the
window) makes the window unusable: ``CounterReset``.

Queries go through prometheus-api-client's ``custom_query`` (``Prom``:
retries off, errors readable).
"""
from __future__ import annotations

from clusterproof.core.waiting import wait_for
from clusterproof.kube.apimetrics import DURATION, Latency
from clusterproof.prometheus.client import Prom, PromQueryError

BY = "verb, group, resource, subresource, scope"


class CounterReset(Exception):
    pass


def _window(metric: str, selector: str, start: float, end: float) -> str:
    x = f"{metric}{{{selector}}}"
    return f"(({x} @ {end:.3f}) - ({x} @ {start:.3f}) or ({x} @ {end:.3f}))"


def selector(verbs: tuple[str, ...], scopes: tuple[str, ...] | None = None, extra: str = "") -> str:
    parts = [f'verb=~"{"|".join(verbs)}"']
    if scopes:
        parts.append(f'scope=~"{"|".join(scopes)}"')
    if extra:
        parts.append(extra)
    return ",".join(parts)


def queries(sel: str, start: float, end: float, q: float = 0.99) -> dict[str, str]:
    """The PromQL of one window: per (verb, group, resource, subresource, scope) its quantile, count and
    the lowest bucket delta (negative: a counter reset)."""
    buckets = _window(f"{DURATION}_bucket", sel, start, end)
    return {"quantile": f"histogram_quantile({q}, sum by ({BY}, le) ({buckets}))",
            "count": f"sum by ({BY}) ({_window(f'{DURATION}_count', sel, start, end)})",
            "min": f"min({buckets})"}


def _key(m: dict) -> tuple:
    return tuple(m.get(k, "") for k in ("verb", "group", "resource", "subresource", "scope"))


def _resource(group: str, resource: str, sub: str) -> str:
    return "/".join(x for x in (f"{resource}.{group}" if group else resource, sub) if x)


def latencies(prom: Prom, start: float, end: float, verbs: tuple[str, ...], scopes: tuple[str, ...] | None = None,
              extra: str = "", q: float = 0.99) -> list[Latency]:
    """p``q`` per (verb, resource, scope) over [start, end], every replica Prometheus scrapes summed."""
    pq = queries(selector(verbs, scopes, extra), start, end, q)
    low = _settled(prom, pq["min"])
    if low and float(low[0]["value"][1]) < 0:
        raise CounterReset(f"a kube-apiserver's {DURATION} went down between {start:.0f} and {end:.0f} "
                           "(it restarted): the window cannot be measured")
    counts = {_key(r["metric"]): float(r["value"][1]) for r in _settled(prom, pq["count"])}
    out = []
    for r in _settled(prom, pq["quantile"]):
        k = _key(r["metric"])
        n = counts.get(k, 0.0)
        if n <= 0:
            continue
        verb, group, resource, sub, scope = k
        p = float(r["value"][1])
        out.append(Latency(verb, _resource(group, resource, sub), scope, int(round(n)), p))
    return sorted(out, key=lambda x: (x.verb, x.resource, x.scope))


def _settled(prom: Prom, expr: str, within_s: float = 30.0) -> list:
    """prometheus-api-client's ``custom_query``, asked again in the open while Prometheus cuts it at its
    deadline (a small --query.timeout on a busy machine), for at most ``within_s``."""
    def ask():
        try:
            return prom.custom_query(expr)
        except PromQueryError as e:
            if not e.answer.deadline:
                raise
            return e
    got = wait_for(ask, until=lambda r: not isinstance(r, PromQueryError), timeout=within_s, interval=0.2,
                   what=f"Prometheus answering {expr}")
    return got


def last_scrape(prom: Prom) -> float:
    """When Prometheus last scraped an apiserver's request histogram (unix s; 0 if never)."""
    r = _settled(prom, f"max(timestamp({DURATION}_count))")
    return float(r[0]["value"][1]) if r else 0.0


def scrape_after(prom: Prom, t: float, timeout: float) -> float:
    """Wait for a scrape of the apiserver that started after ``t`` (same clock); return its time."""
    return wait_for(lambda: last_scrape(prom), until=lambda ts: ts > t, timeout=timeout, interval=0.25,
                    what=f"Prometheus scraped the apiserver after {t:.3f}")
