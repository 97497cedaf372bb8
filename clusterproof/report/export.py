"""A run's figures in the formats dashboards already read: ClusterLoader2's PerfData, and OpenMetrics.

Why: summary.json is ours, and no dashboard reads it. ``--cp-export
perfdata`` writes ``perfdata.json`` in the run's directory, the PerfData
that ClusterLoader2 writes and perfdash plots (``{"version": "v1",
"dataItems": [{"data": {...}, "unit": ..., "labels": {...}}]}``: the Go type
``k8s.io/kubernetes/test/e2e/perftype.PerfData``, which perfdash decodes
into). ``--cp-export openmetrics`` writes ``openmetrics.txt``, an OpenMetrics
text exposition (prometheus_client's own writer) that Prometheus scrapes and
promtool checks; ``--cp-pushgateway URL`` also pushes the same metrics to a
Pushgateway (prometheus_client's ``push_to_gateway``: the Prometheus text
format the Pushgateway takes, grouped by job ``clusterproof`` and the profile).

How each figure maps (both are built from the run's summary, so they say
what summary.json says):

- **PerfData.** Figures of one check whose names differ only by a percentile
  token (``time to quarantine, p50`` / ``..., p99``) are one dataItem with
  ``Perc50``/``Perc99`` (ClusterLoader2's keys), labelled ``Metric`` = the
  name without the token; any other figure is a dataItem of its own with
  ``Value``, labelled ``Metric`` = its name. Every item also has ``Suite``
  and ``Check``. Seconds become milliseconds (perfdash's latency unit, the
  value times 1,000); other units are kept as written. The run's origin
  (``clusterproof.report.origin``) is the PerfData's own ``labels``.
- **OpenMetrics.** One gauge family per unit, in Prometheus's base units:
  ``clusterproof_figure_seconds`` (s, and ms divided by 1,000),
  ``clusterproof_figure_bytes`` (B, and MiB times 1,048,576),
  ``clusterproof_figure_bytes_per_second``, ``clusterproof_figure_ratio`` (%
  divided by 100); a count keeps its own unit (``clusterproof_figure_pods``,
  ``clusterproof_figure_pods_per_second``), a figure without a unit is
  ``clusterproof_figure``. Labels ``suite``, ``check``, ``figure``. A threshold
  is ``clusterproof_threshold_<unit>`` (label ``op``), its verdict
  ``clusterproof_figure_within_threshold`` (1 or 0); the run is
  ``clusterproof_run_info`` (version, commit, Kubernetes, profile and its hash,
  run id: value 1), ``clusterproof_run_exit_code``,
  ``clusterproof_run_duration_seconds``, ``clusterproof_run_finished_timestamp_seconds``
  and ``clusterproof_checks`` per outcome. No sample carries a timestamp (a
  scrape or a push stamps it; a Pushgateway refuses timestamps), and the run
  id is only on the info metric, so each figure stays one series night after
  night.

What does not map: a figure without a value (not measured) is in neither
export; PerfData has no place for a threshold, its verdict, the better
direction or "headline" (summary.json and the OpenMetrics export carry the
thresholds and verdicts); neither carries the checks' messages. Pure: no
pytest, no domain; the one caller is ``clusterproof.fixtures.report``, at
the end of a run of the suites.
"""
from __future__ import annotations

import calendar
import json
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from clusterproof.core.measurement import Figure
from clusterproof.report import compare, timing

FORMATS = ("perfdata", "openmetrics")
PERFDATA_VERSION = "v1"
PUSH_JOB = "clusterproof"
# "p50", "p99", "p99.9" as a word of a figure's name: one percentile of a distribution.
PERCENTILE = re.compile(r"\bp(\d{2}(?:\.\d+)?)\b")
# PerfData: time in milliseconds (perfdash's latency unit); every other unit as the check wrote it.
PERFDATA_UNITS = {"s": ("ms", 1000.0)}
# OpenMetrics: Prometheus's base units (seconds, bytes, ratios); any other unit becomes a name suffix.
BASE_UNITS = {"s": ("seconds", 1.0), "ms": ("seconds", 1e-3), "MiB": ("bytes", 1048576.0), "B": ("bytes", 1.0),
              "bytes": ("bytes", 1.0), "B/s": ("bytes_per_second", 1.0), "MiB/s": ("bytes_per_second", 1048576.0),
              "%": ("ratio", 0.01)}
PREFIX = "clusterproof"


class ExportError(Exception):
    """Bad export arguments: one line for the user."""


def formats(values: Iterable[str]) -> tuple[str, ...]:
    """``--cp-export`` values (repeatable, or comma-separated) as known format names, in order."""
    out = []
    for value in values:
        for name in filter(None, (v.strip() for v in value.split(","))):
            if name not in FORMATS:
                raise ExportError(f"--cp-export {name!r}: not a format clusterproof writes (use "
                                  f"{' or '.join(FORMATS)}, or both: --cp-export perfdata,openmetrics)")
            out.append(name)
    return tuple(dict.fromkeys(out))


def pushgateway_url(url: str | None) -> str | None:
    """``--cp-pushgateway``: an http(s) URL with a host, or an ExportError."""
    if not url:
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ExportError(f"--cp-pushgateway {url!r}: give the Pushgateway's URL, e.g. http://pushgateway:9091")
    return url.rstrip("/")


def _figures(summary: dict) -> list[Figure]:
    return list(compare.figures_of(summary).values())


def _suite(f: Figure) -> str:
    """The suite a figure belongs to (a suite's time, check ``time``: the suite it names)."""
    return f.name if f.check == timing.TIME_CHECK else timing.suite_of(f.check)


def _origin_labels(run: dict) -> dict[str, str]:
    """The run's facts as label values (PerfData's dataset labels, the OpenMetrics info metric)."""
    keys = {"run_id": "id", "clusterproof_version": "clusterproof", "commit": "commit",
            "kubernetes_server": "kubernetes", "kubernetes_client": "kubernetes_client", "profile": "profile",
            "profile_sha256": "profile_sha256", "backend": "backend"}
    out = {k: str(run.get(v)) for k, v in keys.items() if run.get(v) is not None}
    for k in ("dirty", "simulated"):
        if run.get(k) is not None:
            out[k] = str(bool(run[k])).lower()
    return out


# --- PerfData -------------------------------------------------------------------------------------

def percentile_of(name: str) -> tuple[str | None, str]:
    """('99', 'create pod, apiserver histogram') for 'create pod p99, apiserver histogram';
    (None, name) for a name without a percentile."""
    m = PERCENTILE.search(name)
    if m is None:
        return None, name
    rest = re.sub(r"\s+,", ",", name[:m.start()] + name[m.end():])
    rest = re.sub(r"\s{2,}", " ", rest).strip(" ,")
    return m.group(1), rest or name


@dataclass
class _Item:
    suite: str
    check: str
    metric: str
    unit: str
    data: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"data": self.data, "unit": self.unit,
                "labels": {"Suite": self.suite, "Check": self.check, "Metric": self.metric}}


def perfdata(summary: dict) -> dict:
    """The run's figures as ClusterLoader2 PerfData (mapping: the module's docstring)."""
    items: list[_Item] = []
    groups: dict[tuple[str, str, str], _Item] = {}
    for f in _figures(summary):
        if f.value is None:
            continue
        unit, factor = PERFDATA_UNITS.get(f.unit, (f.unit, 1.0))
        value = f.value * factor
        perc, metric = percentile_of(f.name)
        key = (f.check, metric, unit)
        item = groups.get(key) if perc is not None else None
        if perc is not None and (item is None or f"Perc{perc}" in item.data):
            item = groups[key] = _Item(_suite(f), f.check, metric, unit)
            items.append(item)
        if perc is None:
            items.append(_Item(_suite(f), f.check, f.name, unit, {"Value": value}))
        else:
            item.data[f"Perc{perc}"] = value
    return {"version": PERFDATA_VERSION, "dataItems": [i.to_json() for i in items],
            "labels": _origin_labels(summary.get("run") or {})}


# --- OpenMetrics ----------------------------------------------------------------------------------

def metric_unit(unit: str) -> tuple[str, float]:
    """A figure's unit as an OpenMetrics unit (a metric name's suffix) and the factor to it:
    ('seconds', 0.001) for ms, ('pods_per_second', 1.0) for pods/s, ('', 1.0) for no unit."""
    if unit in BASE_UNITS:
        return BASE_UNITS[unit]
    name = unit.strip().lower().replace("/s", "_per_second").replace("/", "_per_")
    name = re.sub(r"[^a-z0-9_]+", "_", name).strip("_")
    return ("u_" + name if name[:1].isdigit() else name), 1.0


def _family_name(kind: str, unit: str) -> str:
    return f"{PREFIX}_{kind}" + (f"_{unit}" if unit else "")


class FiguresCollector:
    """A prometheus_client collector of one summary's metrics (a registry's only collector)."""

    def __init__(self, summary: dict) -> None:
        self.summary = summary

    def collect(self) -> Iterator:
        from prometheus_client.core import GaugeMetricFamily
        run = self.summary.get("run") or {}
        labels = _origin_labels(run)
        info = GaugeMetricFamily(f"{PREFIX}_run_info", "What produced this run: clusterproof's version and commit, "
                                 "the Kubernetes versions, the profile and its sha256, the run id (value 1)",
                                 labels=list(labels))
        info.add_metric(list(labels.values()), 1.0)
        yield info
        if run.get("pytest_exit") is not None:
            yield GaugeMetricFamily(f"{PREFIX}_run_exit_code", "The run's exit code (docs/exit-codes.md)",
                                    value=float(run["pytest_exit"]))
        if run.get("seconds") is not None:
            yield GaugeMetricFamily(f"{PREFIX}_run_duration_seconds", "How long the run took",
                                    value=float(run["seconds"]), unit="seconds")
        finished = _epoch(run.get("finished"))
        if finished is not None:
            yield GaugeMetricFamily(f"{PREFIX}_run_finished_timestamp_seconds", "When the run ended (Unix time)",
                                    value=finished, unit="seconds")
        outcomes: dict[str, int] = {}
        for chk in (self.summary.get("checks") or {}).values():
            outcomes[chk.get("outcome", "unknown")] = outcomes.get(chk.get("outcome", "unknown"), 0) + 1
        if outcomes:
            checks = GaugeMetricFamily(f"{PREFIX}_checks", "Checks of the run by outcome", labels=["outcome"])
            for outcome, n in sorted(outcomes.items()):
                checks.add_metric([outcome], float(n))
            yield checks
        yield from self._figures()

    def _figures(self) -> Iterator:
        from prometheus_client.core import GaugeMetricFamily
        values: dict[str, GaugeMetricFamily] = {}
        limits: dict[str, GaugeMetricFamily] = {}
        within = GaugeMetricFamily(f"{PREFIX}_figure_within_threshold", "1 when a figure is within the threshold "
                                   "its check holds it to, 0 when beyond", labels=["suite", "check", "figure"])
        for f in _figures(self.summary):
            if f.value is None:
                continue
            unit, factor = metric_unit(f.unit)
            where = [_suite(f), f.check, f.name]
            if unit not in values:
                values[unit] = GaugeMetricFamily(
                    _family_name("figure", unit), f"A figure a clusterproof check measured ({unit or 'no unit'})",
                    labels=["suite", "check", "figure"], unit=unit)
            values[unit].add_metric(where, f.value * factor)
            if f.threshold is None:
                continue
            if unit not in limits:
                limits[unit] = GaugeMetricFamily(
                    _family_name("threshold", unit), f"The threshold a check holds a figure to ({unit or 'no unit'}; "
                    "op: the comparison the figure must pass)", labels=["suite", "check", "figure", "op"], unit=unit)
            limits[unit].add_metric([*where, f.op or ""], f.threshold * factor)
            within.add_metric(where, 1.0 if f.verdict == "within" else 0.0)
        yield from values.values()
        yield from limits.values()
        if within.samples:
            yield within


def _epoch(stamp: str | None) -> float | None:
    try:
        return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))) if stamp else None
    except (TypeError, ValueError):
        return None


def registry(summary: dict):
    """A prometheus_client registry holding the summary's metrics."""
    from prometheus_client import CollectorRegistry
    reg = CollectorRegistry(auto_describe=False)
    reg.register(FiguresCollector(summary))
    return reg


def openmetrics(summary: dict) -> bytes:
    """The summary's metrics as an OpenMetrics text exposition (ends with ``# EOF``)."""
    from prometheus_client.openmetrics.exposition import generate_latest
    return generate_latest(registry(summary))


def push(summary: dict, gateway: str, timeout_s: float = 30) -> None:
    """PUT the summary's metrics to a Pushgateway, job ``clusterproof`` and the run's profile as the group
    (a later run of the same profile replaces them); raises OSError when the gateway does not take them."""
    from prometheus_client import push_to_gateway
    profile = str((summary.get("run") or {}).get("profile") or "unknown")
    push_to_gateway(gateway, job=PUSH_JOB, registry=registry(summary), grouping_key={"profile": profile},
                    timeout=timeout_s)


# --- the run's files ------------------------------------------------------------------------------

def write(summary: dict, wanted: tuple[str, ...], perfdata_path: Path, openmetrics_path: Path,
          gateway: str | None = None) -> list[str]:
    """The exports a run asked for, written beside its summary (and pushed); one line for the terminal each.
    Nothing here changes the run's outcome: a file or a push that fails is said, not raised."""
    lines = []
    figures = _figures(summary)
    left_out = sum(f.value is None for f in figures)
    note = f" ({left_out} figure(s) without a value left out)" if left_out else ""
    if "perfdata" in wanted:
        data = perfdata(summary)
        lines.append(_write(perfdata_path, json.dumps(data, indent=1, allow_nan=False).encode(),
                            f"PerfData, {len(data['dataItems'])} dataItems from {len(figures)} figures{note}"))
    if "openmetrics" in wanted or gateway:
        lines.append(_write(openmetrics_path, openmetrics(summary),
                            f"OpenMetrics, {len(figures) - left_out} figures{note}"))
    if gateway:
        try:
            push(summary, gateway)
            lines.append(f"pushed to the Pushgateway {gateway} (job {PUSH_JOB}, "
                         f"profile {(summary.get('run') or {}).get('profile')})")
        except OSError as e:   # urllib's HTTPError and URLError, a timeout: the run's verdict stands
            lines.append(f"NOT pushed to the Pushgateway {gateway}: {str(e)[:200]}")
    return lines


def _write(path: Path, data: bytes, what: str) -> str:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    except OSError as e:
        return f"{path.name} NOT written ({what}): {e.strerror or e}"
    return f"{path} ({what})"
