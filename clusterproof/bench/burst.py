"""Benchmark (not a pass/fail test): the burst's figures, and how close locust comes to the API server's limit.

Writes ``reports/bench/burst.json``: pods created, the create rate the locust
generator achieved, p50/p99 create latency (locust), scheduling throughput,
pod startup p50/p99, 429s, the scheduler and its client QPS -- and the same
burst created by a second, independent client (a plain Python thread pool
of urllib3 POSTs with the same ServiceAccount token and the same number of
requests in flight). Both create rates are measured the same way (pods seen
created on one pod watch, first to last); ``create_rate_ratio`` =
locust / thread pool, target >= 0.9 (the generator is not the bottleneck).

    python -m clusterproof.bench.burst [--cp-profile smoke] [--cp-set key=value ...] [--cp-kubeconfig PATH]
    python -m clusterproof.bench.burst --workers 1,2,4     # reports/bench/burst_workers.json

With ``--workers``: the same burst on locust's distributed mode, once per worker count, the
harness's master and that many ``clusterproof load-worker`` processes started on this machine
(over loopback; the same users in all), and the create rate per count -- where adding generator
processes stops raising it, the API server (or, on one machine, the cores it shares with the
generator) is the limit.

Then one gang of ``burst_job_size`` pods goes through Coscheduling (started
by the harness on the embedded cluster, as in the gang suite) and its
admission latency (last create -> all bound) is recorded.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes import client

from clusterproof.bench import common
from clusterproof.burst import plan
from clusterproof.burst.measure import create_window_rate, run_phase, scheduler_state
from clusterproof.burst.plan import PHASE_LABEL
from clusterproof.cluster import coscheduling
from clusterproof.core import loadworker
from clusterproof.core.errors import HarnessError
from clusterproof.core.locust import ROOT
from clusterproof.core.ports import free_port
from clusterproof.core.processes import own_session_dying_with_parent, stop_group
from clusterproof.core.run import RUN_LABEL
from clusterproof.core.stats import percentile
from clusterproof.core.waiting import WaitTimeout
from clusterproof.gang import gangs as g
from clusterproof.kube.client import raw_request
from clusterproof.kube.pod_spec import pod_body
from clusterproof.kube.pods import delete_run_pods
from clusterproof.kube.podtimeline import JOB_LABEL, PodTimeline
from clusterproof.kube.tokens import create_load_identity
from clusterproof.provision import toolchain


def threadpool_burst(api, profile, namespace: str, run_id: str, token_file: Path) -> dict:
    """The second client: ``burst_users`` threads POSTing the same pods, one request each in flight."""
    cfg = client.Configuration()
    cfg.host, cfg.ssl_ca_cert = api.configuration.host, api.configuration.ssl_ca_cert
    cfg.verify_ssl = api.configuration.verify_ssl
    cfg.api_key = {"BearerToken": token_file.read_text().strip()}
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    cfg.connection_pool_maxsize = profile.burst_users
    sa_api = client.ApiClient(cfg)
    path = f"/api/v1/namespaces/{namespace}/pods"
    # Warm the connections first, as the locust users do.
    with ThreadPoolExecutor(profile.burst_users) as pool:
        list(pool.map(lambda _: raw_request(sa_api, "GET", path, {"limit": "1"}).data, range(profile.burst_users)))
    # The same pods load/burst.py creates.
    phase = plan.burst(profile)
    bodies = [pod_body(f"{job}-{i:05d}", run_id, gpus=profile.node_gpus,
                       labels={JOB_LABEL: job, PHASE_LABEL: phase.name}, node_selector={profile.pool_label: "shared"},
                       restart_policy="Never")
              for job in phase.job_names() for i in range(phase.job_size)]
    latencies, errors = [], []

    def create(body):
        t = time.monotonic()
        try:
            raw_request(sa_api, "POST", path, body=body).data
            latencies.append(time.monotonic() - t)
        except client.ApiException as e:
            errors.append(e.status)

    timeline = PodTimeline(api, namespace, f"{RUN_LABEL}={run_id}").start()
    try:
        t0 = time.monotonic()
        with ThreadPoolExecutor(profile.burst_users) as pool:
            list(pool.map(create, bodies))
        wall = time.monotonic() - t0
        try:
            timeline.wait_running(len(bodies), timeout=profile.burst_timeout_s,
                                  stall_timeout=profile.burst_stall_timeout_s)
        except WaitTimeout:
            pass
    finally:
        timeline.stop()
    pick = lambda q: round(percentile(latencies, q), 4) if latencies else None  # noqa: E731
    return {"client": f"python ThreadPoolExecutor({profile.burst_users}) + urllib3 (kubernetes ApiClient, raw POST)",
            "pods_created": len(latencies), "errors": errors[:20], "responses_429": errors.count(429),
            "create_qps": round(create_window_rate(timeline.snapshot()), 1),
            "create_qps_wall": round(len(latencies) / wall, 1) if wall else 0.0,
            "create_latency_p50_s": pick(50), "create_latency_p99_s": pick(99)}


def gang_admission(c, profile, ns: str, run_id: str, say) -> dict:
    """One gang of ``burst_job_size`` whole-node pods on the shared pool: last create -> all bound.

    On the embedded cluster the harness's Coscheduling (a component of the
    cluster) schedules it; on an existing one ``gang_scheduler_name`` (or the
    reason why not).
    """
    name = profile.gang_scheduler_name
    if c.kwok is None and not name:
        return {"skipped": "existing cluster and gang_scheduler_name is empty"}
    try:
        backend = g.Backend("coscheduling", name or coscheduling.OWN_SCHEDULER, "", 0)
        say(f"gang: {profile.burst_job_size} pods, scheduler {backend.scheduler_name}")
        [gang] = g.create_gangs(c.api, backend, ns, run_id, {"bench-gang": profile.burst_job_size},
                                g.Placement({profile.pool_label: "shared"}), profile.node_gpus,
                                timeout_s=profile.gang_scale_timeout_s)
        done = g.watch_until_bound(c.api, gang, profile.gang_scale_timeout_s)
        return {"scheduler": backend.scheduler_name,
                "scheduler_build": (f"scheduler-plugins {toolchain.SCHEDULER_PLUGINS_VERSION} (Coscheduling)"
                                    if not name else "existing"),
                "gang_size": profile.burst_job_size, "admission_latency_s": round(done - gang.created_last_at, 2),
                "note": "last pod create returned -> last bind seen on a pod watch"}
    finally:
        delete_run_pods(c.api, ns, run_id, timeout=300)


def worker_counts(value: str) -> list[int]:
    try:
        counts = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise HarnessError(f"--workers {value!r}: worker counts, e.g. 1,2,4")
    return counts


def burst_on_workers(c, profile, ns: str, workers: int, work: Path) -> dict:
    """One burst with ``workers`` local ``load-worker`` processes joining the harness's master over loopback."""
    port = free_port()
    names = [f"bench-{k}" for k in range(1, workers + 1)]
    p = profile.model_copy(update={"burst_locust_workers": workers, "burst_locust_worker_names": names,
                                   "burst_locust_processes": 1, "load_master_bind": "127.0.0.1",
                                   "load_master_port": port, "load_workers_wait_s": 60.0})
    work.mkdir(parents=True, exist_ok=True)
    procs = []
    try:
        for name in names:
            with open(work / f"{name}.log", "w") as log:
                procs.append(subprocess.Popen(loadworker.command(f"127.0.0.1:{port}", "burst", name), cwd=ROOT,
                                              stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              env={**os.environ, "PYTHONPATH": str(ROOT)},
                                              preexec_fn=own_session_dying_with_parent))
        run = run_phase(c.api, p, plan.burst(p), ns, c.run_id, work / "locust")
    finally:
        for proc in procs:
            stop_group(proc, grace_s=5)
    f = run.figures.to_dict()
    return {"workers": workers, "create_qps": f["create_qps"], "create_latency_p50_s": f["create_latency_p50_s"],
            "create_latency_p99_s": f["create_latency_p99_s"],
            "create_latency_server_p99_s": f.get("create_latency_server_p99_s"),
            "pods_created": f["create_requests"] - f["create_failures"], "responses_429": f["responses_429"],
            "pods_by_creator": f.get("pods_by_creator"), "incomplete": run.incomplete, "interrupted": run.interrupted}


def generator_limit(rows: list[dict], gain: float = 1.1) -> str:
    """Where more generator processes stop raising the create rate (pure): the first count whose rate is
    below ``gain`` x the previous count's."""
    for prev, row in zip(rows, rows[1:]):
        if prev["create_qps"] and row["create_qps"] < gain * prev["create_qps"]:
            return (f"the generator stops being the limit at {prev['workers']} worker(s): {row['workers']} workers "
                    f"created {row['create_qps']} pods/s against {prev['create_qps']} (not "
                    f"{(gain - 1) * 100:.0f} % more); the API server's own create p99 went "
                    f"{prev['create_latency_server_p99_s']} -> {row['create_latency_server_p99_s']} s")
    last = rows[-1]
    return (f"the create rate still rose up to {last['workers']} workers ({last['create_qps']} pods/s): the "
            "generator is the limit throughout; try more workers")


# The figures of one burst on n workers (``--workers``), qualified by the count, and their units.
WORKER_UNITS = {"create_qps": "pods/s", "create_latency_p50_s": "s", "create_latency_p99_s": "s",
                "create_latency_server_p99_s": "s", "pods_created": "pods", "responses_429": "responses"}


def workers_figures(data: dict) -> list[common.Figure]:
    """Each worker count's best burst (``create_qps[2 workers]``, ...)."""
    return [common.figure("burst_workers", common.qualified(key, f"{r['workers']} workers"), r.get(key), unit)
            for r in data.get("per_worker_count") or [] for key, unit in WORKER_UNITS.items()]


def figures(data: dict) -> list[common.Figure]:
    """The burst's figures from its runs: the best locust run's (the run with the highest create rate, as each
    shares the cores with the whole control plane), the second client's best, their ratio (target >= 0.9),
    the gang's admission latency and the settings they were measured at."""
    f = lambda name, value, unit, *a, **k: common.figure("burst", name, value, unit, *a, **k)  # noqa: E731
    runs = data.get("runs") or []
    loc = max((x["locust"] for x in runs), key=lambda x: x["create_qps"]) if runs else {}
    tp = data.get("second_client") or {}
    b, sc, gang = data.get("burst") or {}, data.get("scheduler") or {}, data.get("gang") or {}
    ratio = round(loc["create_qps"] / tp["create_qps"], 3) if loc and tp.get("create_qps") else None
    out = [f("burst_jobs", b.get("jobs"), "jobs"), f("burst_job_size", b.get("job_size"), "pods"),
           f("burst_users", b.get("users"), "users"),
           f("pods_created", loc["create_requests"] - loc["create_failures"] if loc else None, "pods"),
           f("create_qps", loc.get("create_qps"), "pods/s", headline=True),
           f("create_qps_second_client", tp.get("create_qps"), "pods/s"),
           f("create_rate_ratio", ratio, "", data.get("create_rate_ratio_target", 0.9), ">=", better="higher")]
    for key in ("create_latency_p50_s", "create_latency_p99_s", "create_latency_server_p50_s",
                "create_latency_server_p99_s"):
        out.append(f(key, loc.get(key), "s"))
    out += [f("scheduler_client_qps", sc.get("client_qps"), "QPS"),
            f("scheduler_client_burst", sc.get("client_burst"), ""),
            f("scheduling_throughput_pods_per_s", loc.get("scheduling_throughput_pods_per_s"), "pods/s")]
    for key in ("pod_startup_p50_s", "pod_startup_p99_s", "created_to_bound_p99_s", "bound_to_running_p99_s"):
        out.append(f(key, loc.get(key), "s"))
    out += [f(common.qualified("first_create_to_job_bound_s", j["job"]), j.get("first_create_to_all_bound_s"), "s")
            for j in loc.get("jobs") or []]
    out += [f("responses_429", loc.get("responses_429"), "responses"),
            f("gang_size", gang.get("gang_size"), "pods"),
            f("gang_admission_latency_s", gang.get("admission_latency_s"), "s")]
    return out


def workers_main(args, profile, argv: list[str]) -> int:
    counts = worker_counts(args.workers)
    if profile.burst_users < max(counts):
        raise HarnessError(f"--workers {args.workers}: burst_users ({profile.burst_users}) must be >= every count")
    out = args.out if args.out != common.OUT_DIR / "burst.json" else common.OUT_DIR / "burst_workers.json"
    runs: dict[int, list[dict]] = {w: [] for w in counts}
    with common.cluster(args, profile) as c, common.namespace(c, "burst") as ns, \
            tempfile.TemporaryDirectory(prefix="cp-bench-burst-") as tmp:
        # Interleaved (1, 2, 4, 1, 2, 4, ...), best of each count kept: the machine's other load comes and goes.
        for r in range(args.repeat):
            for w in counts:
                common.say(f"burst {r + 1}/{args.repeat} on {w} locust worker(s): {plan.burst(profile).pods} pods, "
                           f"{profile.burst_users} users")
                runs[w].append(burst_on_workers(c, profile, ns, w, Path(tmp) / f"w{w}-{r}"))
                delete_run_pods(c.api, ns, c.run_id, timeout=300)
        rows = [max(runs[w], key=lambda x: x["create_qps"]) for w in counts]
        verdict = generator_limit(rows)
        head = common.header(argv, c, profile, "clusterproof.bench.burst")
        data = {"burst": {"jobs": profile.burst_jobs, "job_size": profile.burst_job_size, "users": profile.burst_users,
                          "workers": "clusterproof load-worker processes on this machine (loopback)"},
                "per_worker_count": rows, "limit": verdict, "repeat": args.repeat,
                "all_runs": {str(w): [x["create_qps"] for x in runs[w]] for w in counts},
                "note": f"{os.cpu_count()} cores shared by the generator and the whole control plane"}
    common.write(out, head, workers_figures(data), data)
    common.say(verdict)
    return 0


def main(argv: list[str]) -> int:
    ap = common.parser(__doc__, "smoke", "burst.json")
    ap.add_argument("--repeat", type=int, default=1, help="bursts per client (alternating), best kept")
    ap.add_argument("--workers", default="", help="worker counts, e.g. 1,2,4: the create rate per count "
                                                  "(reports/bench/burst_workers.json)")
    args = ap.parse_args(argv)
    profile = common.load(args)
    if args.workers:
        try:
            return workers_main(args, profile, argv)
        except HarnessError as e:
            print(f"clusterproof: {e}", file=sys.stderr)
            return 4
    runs = []
    with common.cluster(args, profile, coscheduling=True) as c, common.namespace(c, "burst") as ns, \
            tempfile.TemporaryDirectory(prefix="cp-bench-burst-") as tmp:
        work, run_id, say = Path(tmp), c.run_id, common.say
        for r in range(args.repeat):
            say(f"burst {r + 1}/{args.repeat}: locust, {plan.burst(profile).pods} pods")
            b = run_phase(c.api, profile, plan.burst(profile), ns, run_id, work / f"locust-{r}")
            delete_run_pods(c.api, ns, run_id, timeout=300)
            say(f"burst {r + 1}/{args.repeat}: thread pool")
            ident = create_load_identity(c.api, ns, run_id, work / f"id-{r}")
            tp = threadpool_burst(c.api, profile, ns, run_id, ident.token_file)
            delete_run_pods(c.api, ns, run_id, timeout=300)
            runs.append({"locust": {**b.figures.to_dict(), "incomplete": b.incomplete, "interrupted": b.interrupted},
                         "threadpool": tp})
        gang = gang_admission(c, profile, ns, run_id, say)
        head = common.header(argv, c, profile, "clusterproof.bench.burst")
        # Best of each client, as each run shares two cores with the whole control plane.
        loc = max((x["locust"] for x in runs), key=lambda f: f["create_qps"])
        tp = max((x["threadpool"] for x in runs), key=lambda f: f["create_qps"])
        data = {
            "scheduler": {"binary": "kube-scheduler " + c.kwok.kubernetes_version if c.kwok else "existing",
                          "client_qps": profile.scheduler_api_qps if c.kwok else None,
                          "client_burst": profile.scheduler_api_burst if c.kwok else None,
                          "state": scheduler_state(c.api)},
            "burst": {"jobs": profile.burst_jobs, "job_size": profile.burst_job_size,
                      "users": profile.burst_users, "locust_processes": profile.burst_locust_processes,
                      "identity": "ServiceAccount token (APF flow schema service-accounts)"},
            "gang": gang,
            "second_client": tp,
            "create_rate_ratio_target": 0.9,
            "create_rate_ratio_per_run": [round(x["locust"]["create_qps"] / x["threadpool"]["create_qps"], 3)
                                          if x["threadpool"]["create_qps"] else None for x in runs],
            "runs": runs,
        }
    figs = figures(data)
    common.write(args.out, head, figs, data)
    ratio = next(x.value for x in figs if x.name == "create_rate_ratio")
    common.say(f"locust {loc['create_qps']} pods/s vs thread pool {tp['create_qps']} pods/s "
               f"(ratio {ratio}), scheduling {loc['scheduling_throughput_pods_per_s']} pods/s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
