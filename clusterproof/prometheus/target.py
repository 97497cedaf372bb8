"""The run's Prometheus: embedded (started, backfilled, removed) or existing (``--cp-prometheus-url``).

Why one fixture (``prometheus``, in ``clusterproof.fixtures.prometheus``):
suites get a ``PromTarget`` whatever is behind it, as they get ``cluster``.
Here: the target, and how each kind comes to exist and goes away.

- embedded (default): a Prometheus started on loopback by the harness only
  when a collected check asks for it (a session fixture is made on first
  use), with the profile's limits, scraping the cluster, over a backfilled
  history of ``prometheus_backfill_nodes`` nodes (``clusterproof.prometheus.history``);
  stopped and its directory removed at the end of the run, also after
  Ctrl-C (inside the embedded cluster's directory, so a killed run's is
  swept with its cluster).
- existing (``--cp-prometheus-url``, ``--cp-prometheus-token-file``,
  ``--cp-prometheus-ca-file``): read-only by default. Checks that send the
  seed's heavy queries carry the marker ``heavy_query``; against an existing
  Prometheus they are destructive (shared state) and skipped without
  ``--cp-allow-destructive``. An unreachable URL, an endpoint that is not a
  Prometheus and refused credentials end the run before any test with one
  line, exit 4.
"""
from __future__ import annotations

import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass

from clusterproof.core.progress import phase
from clusterproof.core.timeparse import duration_s
from clusterproof.core.waiting import wait_for
from clusterproof.prometheus import history as prom_history
from clusterproof.prometheus.client import Prom, check_reachable
from clusterproof.prometheus.history import History, shape_of
from clusterproof.prometheus.server import Limits, PromServer, own_directory, scrape_job_from_api, scrape_jobs_from_kwok

HEAVY = "heavy_query"


@dataclass
class PromTarget:
    kind: str                       # "embedded" or "existing"
    prom: Prom
    limits: Limits                  # what the profile says the Prometheus must enforce
    server: PromServer | None = None
    history: History | None = None
    version: str = ""
    scrape_interval_s: float | None = None

    @property
    def timeout_s(self) -> float:
        return duration_s(self.limits.query_timeout)


def existing(url: str, token_file: str | None, ca_file: str | None, limits: Limits) -> PromTarget:
    """``--cp-prometheus-url``: a Prometheus others run (checked reachable before any test)."""
    prom = Prom(url, token_file, ca_file)
    return PromTarget("existing", prom, limits, version=check_reachable(prom).get("version", "?"))


@contextmanager
def embedded(cluster, profile, run_id: str, say):
    """The harness's own Prometheus, scraping ``cluster`` over the profile's backfilled history; stopped
    and its directory removed afterwards, also after Ctrl-C."""
    limits, flags = Limits.of(profile), Limits.embedded(profile)   # what is required; what it runs with
    # Abandoned Prometheus directories of killed runs: swept when ``cluster`` came up
    # (``clusterproof.prometheus.server.sweep_abandoned``, handed to ``cluster.backends.sweep_local``).
    server = directory = None
    try:
        if cluster.kwok is not None:
            directory = cluster.kwok.directory / "prometheus"
            directory.mkdir(parents=True, exist_ok=True)
            jobs = scrape_jobs_from_kwok(cluster.kwok.directory)
        else:
            directory = own_directory(run_id)
            jobs = scrape_job_from_api(cluster.api, directory)
        shape = shape_of(profile)
        with phase(f"prometheus: the {shape.nodes:,}-node history (cached, or built once)"):
            history = prom_history.build(shape, say)
        server = PromServer(directory, flags, jobs, profile.prometheus_scrape_interval_s)
        t0 = time.monotonic()
        with phase("prometheus: start the embedded Prometheus over the history, first scrapes"):
            prom_history.link_into(history, server.data_dir)
            server.start()
            prom = server.client()
            wait_scraped(prom, [j["job_name"] for j in jobs], timeout=3 * profile.prometheus_scrape_interval_s + 30)
        say(f"embedded Prometheus {prom.buildinfo().get('version', '?')} at {server.url} "
            f"({' '.join(flags.flags())}, GOMAXPROCS {flags.gomaxprocs or 'all'}), ready in "
            f"{time.monotonic() - t0:.1f} s over a {history.shape.nodes}-node history "
            f"({history.series:,} series; {'cached' if history.cached else f'built in {history.build_s:.0f} s'})")
        yield PromTarget("embedded", prom, limits, server, history, prom.buildinfo().get("version", "?"),
                         profile.prometheus_scrape_interval_s)
    finally:
        if server is not None:
            server.remove()
        elif directory is not None:
            shutil.rmtree(directory, ignore_errors=True)


def wait_scraped(prom: Prom, jobs: list[str], timeout: float) -> None:
    """Every job's target has been scraped successfully at least once (else: which one, and why)."""
    def down() -> list[str]:
        a = prom.get("/api/v1/targets", {"state": "active"}, wait_s=10)
        targets = (a.data or {}).get("activeTargets", []) if a.ok else []
        health = {t["labels"].get("job"): (t.get("health"), t.get("lastError", "")) for t in targets}
        return [f"{j} ({health.get(j, ('missing', ''))[0]}: {health.get(j, ('', ''))[1] or 'no scrape yet'})"
                for j in jobs if health.get(j, ("",))[0] != "up"]
    wait_for(down, until=lambda d: not d, timeout=timeout, interval=0.5,
             what="the embedded Prometheus scraped every component")
