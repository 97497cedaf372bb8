"""Benchmark (not a pass/fail test): Prometheus under the seed's queries, with and without limits, and its restart.

Writes ``reports/bench/prometheus.json``:

- the backfilled history (``clusterproof.prometheus.history``: shape, series, what building it cost);
- the seed's pathological queries (``clusterproof.prometheus.limits``, the suite's own sequence) against a
  Prometheus with the profile's limits, then the same queries against one **without** limits
  (``--query.timeout=10m``, ``--query.max-samples`` 10^12, ``--query.max-concurrency`` 20: the
  seed's configuration), under a memory bound this benchmark enforces: a watchdog samples its RSS
  every 0.1 s and kills it above ``--memory-bound-gib`` (the OOM the seed hit, measured safely);
  peak RSS side by side, with the unbounded series request of each;
- WAL replay: a Prometheus that scraped ``--wal-series`` series ``--wal-scrapes`` times is restarted
  with GOMAXPROCS=1 and with every core, alternately; time to ready and Prometheus' own replay time.

No Kubernetes cluster is needed (the history and a synthetic scrape target stand in for it).

    python -m clusterproof.bench.prometheus [--cp-profile nightly] [--cp-set key=value ...] [--memory-bound-gib 8]
                               [--wal-series 1000000] [--wal-scrapes 20] [--skip-queries] [--skip-wal]
"""
from __future__ import annotations

import dataclasses
import http.server
import json
import os
import re
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

from clusterproof.bench import common
from clusterproof.core.errors import HarnessError
from clusterproof.core.run import new_run_id
from clusterproof.core.timeparse import go_duration_s
from clusterproof.core.waiting import wait_for
from clusterproof.prometheus import history as prom_history
from clusterproof.prometheus import limits as prom_limits
from clusterproof.prometheus.history import shape_of
from clusterproof.prometheus.server import Limits, PromServer, own_directory
from clusterproof.prometheus.target import PromTarget
from clusterproof.provision import toolchain

GIB = 1 << 30
UNLIMITED = Limits("10m", 10 ** 12, 20, 0)


say = common.say


class Watchdog(threading.Thread):
    """Kills the server once its RSS passes ``bound`` bytes; records the peak and when."""

    def __init__(self, server: PromServer, bound: int):
        super().__init__(daemon=True)
        self.server, self.bound, self.stop = server, bound, threading.Event()
        self.peak, self.killed_at_s, self.killed_rss, self.t0 = 0, None, None, time.monotonic()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            rss = self.server.rss_bytes() or 0
            self.peak = max(self.peak, rss)
            if rss > self.bound and self.killed_at_s is None:
                self.killed_at_s, self.killed_rss = time.monotonic() - self.t0, rss
                proc = self.server.process()
                if proc is not None:
                    proc.kill()
                say(f"watchdog: RSS {rss / GIB:.2f} GiB > {self.bound / GIB:g} GiB: Prometheus killed")


def _answer(a) -> dict:
    total, peak = a.samples()
    return {"status": a.status, "error_type": a.error_type, "error": a.error, "elapsed_s": round(a.elapsed_s, 3),
            "bytes": a.nbytes, "samples_read": total, "peak_samples": peak}


def queries(history, profile, limits: Limits, directory: Path, bound: int | None, wait: float | None = None) -> dict:
    """The suite's pathological sequence against one Prometheus over the history, then the unbounded series call."""
    server = PromServer(directory, limits, [], profile.prometheus_scrape_interval_s)
    prom_history.link_into(history, server.data_dir)
    server.start()
    target = PromTarget("embedded", server.client(), limits, server, history, "", profile.prometheus_scrape_interval_s)
    dog = Watchdog(server, bound) if bound else None
    if dog:
        dog.start()
    out: dict = {"flags": limits.flags(), "gomaxprocs": limits.gomaxprocs or os.cpu_count()}
    try:
        say(f"pathological queries, {' '.join(limits.flags())}")
        run = prom_limits.run_pathological(target, profile, wait=wait)
        out.update({
            "idle_rss_bytes": int(run.idle), "peak_rss_bytes": int(run.rss.peak),
            "peak_rss_process_bytes": run.rss.process_peak, "peak_rss_metric_bytes": int(run.rss.metric_peak),
            "seed": {k: {"query": str(s.query), **_answer(s.answer)} for k, s in run.seed.items()},
            "request_timeout": {"asked": run.requested_timeout, **_answer(run.request_timeout.answer)},
            "max_samples": {"query": str(run.max_samples.query), **_answer(run.max_samples.answer)},
            "series_limited": {"series": run.series_limited_count, **_answer(run.series_limited)},
            "burst": {"queries": len(run.burst), "queue_seconds": run.burst_queue_s,
                      "answers": [_answer(a) for a in run.burst]},
            "cheap_after": _answer(run.cheap_after),
            "selected_series": run.selected_series,
            "limit_bound_bytes": int(prom_limits.limit_bound(run.idle, profile, run.selected_series)),
        })
        if server.process() is not None:
            say("the unbounded series request")
            u = prom_limits.series_unbounded(target)
            out["series_unbounded"] = {"series": u.series, "idle_rss_bytes": int(u.idle), "peak_rss_bytes": int(u.peak),
                                       **_answer(u.answer)}
    finally:
        if dog:
            dog.stop.set()
            dog.join()
            out["memory_bound_bytes"] = bound
            out["watchdog_peak_rss_bytes"] = dog.peak
            out["killed"] = None if dog.killed_at_s is None else {
                "after_s": round(dog.killed_at_s, 1), "rss_bytes": dog.killed_rss}
        server.remove()
    return out


class _Target(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *a):
        pass


def wal_replay(profile, directory: Path, series: int, scrapes: int, interval_s: int, rounds: int) -> dict:
    """A WAL of ``series`` x ``scrapes`` samples, then restarts alternating GOMAXPROCS=1 / every core."""
    per = 100
    lines = [f'node_bench_metric{{node="gpu-node-{i // per:05d}",series="{i % per}"}} {i % 997}'
             for i in range(series)]
    _Target.body = ("\n".join(lines) + "\n").encode()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Target)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    job = {"job_name": "wal-bench", "scrape_interval": f"{interval_s}s", "scrape_timeout": f"{interval_s}s",
           "static_configs": [{"targets": [f"127.0.0.1:{httpd.server_address[1]}"]}]}
    server = PromServer(directory, Limits.of(profile), [job], interval_s)
    out: dict = {"series": series, "scrapes": scrapes, "scrape_interval_s": interval_s}
    try:
        say(f"building a WAL: {series:,} series scraped {scrapes} times every {interval_s} s")
        server.start()
        prom = server.client()
        appended = "prometheus_tsdb_head_samples_appended_total"
        wait_for(lambda: prom.own_metric(f'{appended}{{type="float"}}') or prom.own_metric(appended) or 0,
                 until=lambda n: n >= series * scrapes, timeout=scrapes * interval_s * 4 + 300, interval=2,
                 what=f"{series * scrapes:,} samples appended")
        out["head_rss_bytes"] = server.rss_bytes()
        server.stop(grace_s=120)
        httpd.shutdown()
        server.scrape_jobs = []                     # restarts replay the WAL; nothing new is scraped
        out["wal_bytes"] = sum(f.stat().st_size for f in (server.data_dir / "wal").rglob("*") if f.is_file())
        out["chunks_head_bytes"] = sum(f.stat().st_size for f in (server.data_dir / "chunks_head").rglob("*")
                                       if f.is_file())
        runs = []
        for r in range(rounds):
            for procs in (1, 0):
                server.limits = dataclasses.replace(server.limits, gomaxprocs=procs)
                mark = server.log.stat().st_size if server.log.exists() else 0
                t0 = time.monotonic()
                server.start(timeout=1800)
                ready = time.monotonic() - t0
                replay = _replay_times(server.log, mark)
                runs.append({"gomaxprocs": procs or os.cpu_count(), "ready_s": round(ready, 2),
                             "rss_after_ready_bytes": server.rss_bytes(), **replay})
                say(f"restart {r + 1} GOMAXPROCS={procs or os.cpu_count()}: ready in {ready:.1f} s {replay}")
                server.stop(grace_s=120)
        out["runs"] = runs
        for procs in (1, os.cpu_count()):
            for key in ("ready_s", "wal_replay_duration_s"):
                sel = [x[key] for x in runs if x["gomaxprocs"] == procs and key in x]
                if sel:
                    out[f"{key}_gomaxprocs_{procs}"] = {"min": min(sel), "median": statistics.median(sel),
                                                        "max": max(sel)}
    finally:
        httpd.shutdown()
        server.remove()
    return out


def _replay_times(log: Path, offset: int) -> dict:
    """Prometheus' own "WAL replay completed" durations logged since ``offset``."""
    with log.open("rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    line = next((ln for ln in reversed(text.splitlines()) if "WAL replay completed" in ln), "")
    out = {}
    for key in ("wal_replay_duration", "total_replay_duration", "mmap_chunk_replay_duration"):
        m = re.search(rf'{key}="?([-+0-9.a-zµμ]+)', line)   # Go's time.Duration, e.g. 1m2.5s
        if m:
            try:
                out[key + "_s"] = round(go_duration_s(m[1]), 3)
            except ValueError:
                continue
    return out


# The answers the bench keeps of each Prometheus (with and without limits) and what each figure of one is.
ANSWERS = (("seed_histogram_quantile", ("seed", "histogram-quantile")), ("seed_long_range", ("seed", "long-range")),
           ("request_timeout", ("request_timeout",)), ("max_samples", ("max_samples",)),
           ("series_limited", ("series_limited",)), ("series_unbounded", ("series_unbounded",)),
           ("cheap_after", ("cheap_after",)))
ANSWER_UNITS = {"status": "", "elapsed_s": "s", "samples_read": "samples", "peak_samples": "samples",
                "series": "series", "bytes": "B", "idle_rss_bytes": "B", "peak_rss_bytes": "B"}
SERVERS = (("with_limits", "with limits"), ("without_limits", "without limits"))


def _flag_figures(flags: list[str]) -> dict[str, float | None]:
    """The limits a Prometheus ran with, from its flags (``--query.timeout=2s`` ...)."""
    given = dict(f.removeprefix("--").split("=", 1) for f in flags if "=" in f)
    timeout = given.get("query.timeout")
    return {"query_timeout_s": go_duration_s(timeout) if timeout else None,
            "query_max_samples": given.get("query.max-samples"),
            "query_max_concurrency": given.get("query.max-concurrency")}


def figures(data: dict) -> list[common.Figure]:
    """The history's shape; per Prometheus (qualified ``[with limits]`` / ``[without limits]``) its limits, each
    pathological query's answer (status, seconds, samples), the burst, RSS; the WAL replay per GOMAXPROCS."""
    f = lambda name, value, unit: common.figure("prometheus", name, value, unit)  # noqa: E731
    q = common.qualified
    h = data.get("history") or {}
    out = [f(f"history_{k}", h.get(k), unit) for k, unit in (
        ("nodes", "nodes"), ("series", "series"), ("bucket_series", "series"), ("samples", "samples"),
        ("minutes", "min"), ("interval_s", "s"), ("build_s", "s")) if k in h]
    for key, label in SERVERS:
        m = data.get(key)
        if not m:
            continue
        limits = _flag_figures(m.get("flags") or [])
        out += [f(q(k, label), v, "s" if k.endswith("_s") else "") for k, v in limits.items()]
        for name, path in ANSWERS:
            a = m
            for p in path:
                a = (a or {}).get(p)
            if not a:
                continue
            out += [f(q(f"{name}_{k}", label), a[k], unit) for k, unit in ANSWER_UNITS.items() if k in a]
            if a.get("asked"):
                out.append(f(q(f"{name}_asked_s", label), go_duration_s(a["asked"]), "s"))
        b = m.get("burst") or {}
        if b:
            el = [x["elapsed_s"] for x in b.get("answers") or [] if x.get("elapsed_s") is not None]
            st = {x.get("status") for x in b.get("answers") or []}
            out += [f(q("burst_queries", label), b.get("queries"), "queries"),
                    f(q("burst_status", label), st.pop() if len(st) == 1 else None, ""),
                    f(q("burst_elapsed_min_s", label), min(el) if el else None, "s"),
                    f(q("burst_elapsed_max_s", label), max(el) if el else None, "s"),
                    f(q("burst_queue_s", label), b.get("queue_seconds"), "s")]
        out += [f(q(k, label), m[k], "B") for k in ("idle_rss_bytes", "peak_rss_bytes", "limit_bound_bytes",
                                                   "memory_bound_bytes") if m.get(k) is not None]
    w = data.get("wal_replay") or {}
    if w:
        out += [f("wal_series", w.get("series"), "series"), f("wal_scrapes", w.get("scrapes"), "scrapes"),
                f("wal_bytes", w.get("wal_bytes"), "B")]
        for key, stats in w.items():
            for measure in ("wal_replay_duration_s", "ready_s"):
                if key.startswith(f"{measure}_gomaxprocs_"):
                    procs = key.rsplit("_", 1)[1]
                    out += [f(q(f"{measure.removesuffix('_s')}_{stat}_s", f"GOMAXPROCS={procs}"), stats.get(stat), "s")
                            for stat in ("min", "median", "max")]
    return out


def main(argv: list[str]) -> int:
    ap = common.parser(__doc__, "nightly", "prometheus.json")
    ap.add_argument("--memory-bound-gib", type=float, default=8.0)
    ap.add_argument("--wal-series", type=int, default=1_000_000)
    ap.add_argument("--wal-scrapes", type=int, default=20)
    ap.add_argument("--wal-interval-s", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--unlimited-wait-s", type=float, default=600.0,
                    help="how long the client waits for each answer of the Prometheus without limits")
    ap.add_argument("--skip-queries", action="store_true")
    ap.add_argument("--skip-wal", action="store_true")
    args = ap.parse_args(argv)
    if args.kubeconfig:
        raise common.fail(ValueError("clusterproof.bench.prometheus measures its own Prometheus: drop --cp-kubeconfig"))
    profile = common.load(args)
    try:
        history = prom_history.build(shape_of(profile), say)
    except HarnessError as e:
        raise common.fail(e) from None
    work = own_directory(f"bench-{new_run_id()}")
    data: dict = {
        "history": {**dataclasses.asdict(history.shape), "series": history.series,
                    "bucket_series": history.bucket_series, "samples": history.samples,
                    "build_s": round(history.build_s, 1), "was_cached": history.cached,
                    "blocks": len(history.blocks())},
        "load_average_at_start": os.getloadavg(),
    }
    try:
        if not args.skip_queries:
            data["with_limits"] = queries(history, profile, Limits.of(profile), work / "limited", None)
            data["without_limits"] = queries(history, profile, UNLIMITED, work / "unlimited",
                                               int(args.memory_bound_gib * GIB), wait=args.unlimited_wait_s)
        if not args.skip_wal:
            data["wal_replay"] = wal_replay(profile, work / "wal", args.wal_series, args.wal_scrapes,
                                              args.wal_interval_s, args.rounds)
    except HarnessError as e:
        raise common.fail(e) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    head = {**common.header(argv, None, profile, "clusterproof.bench.prometheus"), "overrides": args.overrides,
            "prometheus": {"release": toolchain.prometheus_release(), "module": toolchain.PROMETHEUS_VERSION}}
    common.write(args.out, head, figures(data), data)
    print(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
