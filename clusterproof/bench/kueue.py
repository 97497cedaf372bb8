"""Benchmark (not a pass/fail test): Kueue admission at scale -- a burst of JobSets over many ClusterQueues.

Writes ``reports/bench/kueue.json``: on an embedded cluster of ``nodes`` (``--cp-profile nightly``: 7,500, for the
published figure) running Kueue and JobSet as the suite does (``clusterproof.cluster.kueue``, started once the
cluster is up), ``kueue_bench_queues`` ClusterQueues, each with a LocalQueue in one namespace and quota for its
share of the burst; then ``kueue_bench_workloads`` JobSets of ``kueue_bench_pods`` whole-node ranks, created at
once (``kueue_bench_create_concurrency`` at a time), spread round-robin over the queues. Every JobSet fits its
queue's quota and the free nodes of the untainted shared pool (its flavor selects them), so the figures are
Kueue's admission speed, not a wait for quota:

- from each JobSet's create (when the create returned) to its Workload ``Admitted`` (as a watch of Workloads
  saw it): p50, p99, max (thresholds ``kueue_bench_admit_p99_s``);
- admitted workloads per second from the first create to the last admission (``kueue_bench_min_admitted_per_s``);
- from the first create until every rank of every JobSet is bound (the whole pipeline: JobSet controller,
  Job controller, kube-scheduler), and how many Workloads Kueue evicted on the way. Kueue runs
  waitForPodsReady with its own default timeout, 5 min (``kueue_bench_pods_ready_timeout_s``), not the
  suite's 60 s: at 7,500 nodes a burst's tail takes minutes to be bound, and 60 s evicted it over and over.

Where the CPU went, in each phase (first create to last admission; then to every rank bound): CPU-seconds by
component (Kueue, JobSet, kube-apiserver, etcd, ...) and of the harness, and how busy the machine's cores were
-- on two cores a phase whose cores were all busy is held by the work in it, and the largest share names whose.

A second instrument checks the first: the objects' own timestamps, written by the API server (the JobSet's
``creationTimestamp``) and by Kueue (its Workload's ``Admitted`` ``lastTransitionTime``), to the second. Their
p99 may differ from the harness's by the 1 s resolution; more than that is a finding (a watch that lagged, a
create that returned late), said on the terminal and kept in the JSON.

Kueue's own performance CI (its repository's test/performance/scheduler, the baseline its README keeps) admits
50,000 workloads over 1,000 ClusterQueues in about 1,179 s (threshold 1,416 s), about 42 workloads/s, and its
topology run 15,000 workloads on 640 nodes in about 401 s (about 37/s). How the set-ups differ: that runner
creates Workloads directly (no JobSet, Job or pod is made), against an API server and etcd with no kubelet,
scheduler or controller-manager, on a CI machine of many cores, and finishes each workload after a set run
time so that quota turns over; here every workload is a JobSet whose ranks are created and bound on two cores
shared with the whole control plane, and nothing finishes (the burst is admitted once). The README quotes the
figures side by side.

    python -m clusterproof.bench.kueue [--cp-profile smoke|nightly] [--cp-set key=value ...]
"""
from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil

from clusterproof.bench import common
from clusterproof.cluster import apiwork, kueue
from clusterproof.cluster.node_plan import node_plan
from clusterproof.core.stats import seconds
from clusterproof.gang import kueue_jobs as kq
from clusterproof.gang.gangs import Placement
from clusterproof.kube.informer import Informer
from clusterproof.provision import toolchain

KUEUE_CI = {"workloads": 50_000, "cluster_queues": 1_000, "seconds": 1_179, "threshold_s": 1_416,
            "topology_workloads": 15_000, "topology_nodes": 640, "topology_seconds": 401}


def figures(data: dict) -> list[common.Figure]:
    """Admission latency (p50/p99/max; p99 also by the objects' own timestamps), admissions per second, the time to
    every rank bound, and the burst's size."""
    f = lambda name, value, unit, *a, **k: common.figure("kueue", name, value, unit, *a, **k)  # noqa: E731
    b, lat, th = data.get("burst") or {}, data.get("admission") or {}, data.get("thresholds") or {}
    by_objects = data.get("admission_by_timestamps") or {}
    cpu = (data.get("cpu") or {}).get("admission") or {}
    by_process, busy = cpu.get("cpu_s_by_process") or {}, cpu.get("busy_share")
    return [f("workloads", b.get("workloads"), "workloads"), f("cluster_queues", b.get("cluster_queues"), "queues"),
            f("pods", b.get("pods"), "pods"), f("nodes", b.get("nodes"), "nodes"),
            f("admitted", lat.get("n"), "workloads"),
            f("admit_p50_s", lat.get("p50_s"), "s"),
            f("admit_p99_s", lat.get("p99_s"), "s", th.get("admit_p99_s"), headline=True),
            f("admit_max_s", lat.get("max_s"), "s"),
            f("admit_p99_by_timestamps_s", by_objects.get("p99_s"), "s"),
            f("admitted_per_s", b.get("admitted_per_s"), "workloads/s", th.get("min_admitted_per_s"), ">=",
              better="higher", headline=True),
            f("all_bound_s", b.get("all_bound_s"), "s"),
            f("evicted", b.get("evicted"), "workloads", 0),
            f("admission_machine_busy_percent", busy if busy is None else round(100 * busy, 1), "%"),
            *[f(common.qualified("admission_cpu_s", name), by_process.get(name), "CPU-s")
              for name in ("kueue", "kube-apiserver", "etcd", "jobset", "harness")]]


def main(argv: list[str]) -> int:
    ap = common.parser(__doc__, "smoke", "kueue.json")
    args = ap.parse_args(argv)
    if args.kubeconfig:
        raise common.fail(ValueError("clusterproof.bench.kueue creates ClusterQueues and starts the embedded "
                                     "cluster's Kueue: drop --cp-kubeconfig"))
    profile, say = common.load(args), common.say
    # Kueue's own waitForPodsReady timeout for the burst (kueue_bench_pods_ready_timeout_s), not the suite's.
    profile = profile.model_copy(update={"kueue_pods_ready_timeout_s": profile.kueue_bench_pods_ready_timeout_s})
    n_wl, pods, n_q = profile.kueue_bench_workloads, profile.kueue_bench_pods, profile.kueue_bench_queues
    gpus, cpus = profile.node_gpus, psutil.cpu_count() or 1
    shared = next(pool for pool in node_plan(profile) if pool.name == "shared")
    if n_wl * pods > shared.count:
        raise common.fail(ValueError(f"{n_wl} workloads of {pods} whole-node ranks need {n_wl * pods} nodes, the "
                                     f"profile's shared pool has {shared.count}: lower kueue_bench_workloads or "
                                     "raise nodes"))
    with common.cluster(args, profile, kueue=True) as c:
        api, run_id = c.api, c.run_id
        t = time.monotonic()
        kueue.start(api, c.kwok, "Fail")
        say(f"Kueue {toolchain.KUEUE_VERSION} and JobSet {toolchain.JOBSET_VERSION} started in "
            f"{time.monotonic() - t:.1f} s")
        with common.namespace(c, "kueue", labels={kueue.MANAGED_LABEL: "true"}) as ns:
            per_queue = -(-n_wl // n_q)
            place = Placement(dict(shared.labels))    # the untainted pool: ranks tolerate no team's taint
            queues = [kq.make_queues(api, run_id, ns, f"bench-{i:04d}", place, per_queue * pods * gpus)
                      for i in range(n_q)]
            created: dict[str, float] = {}
            admitted: dict[str, float] = {}
            lock = threading.Lock()

            def seen(_kind: str, w: dict) -> None:
                owner = jobset_of(w)
                if owner and kq.condition(w, "Admitted").get("status") == "True":
                    with lock:
                        admitted.setdefault(owner, time.time())
            informer = Informer(api, f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads", on_event=seen).start()
            # The ranks, watched from before the first create: counting them bound costs the API server nothing
            # (a list of every rank each second, as this bench first did, was work of its own in the figure).
            ranks = Informer(api, f"/api/v1/namespaces/{ns}/pods", {"labelSelector": kq.JOBSET_NAME_LABEL}).start()
            try:
                def submit(i: int) -> None:
                    name = f"wl-{i:05d}"
                    kq.submit(api, ns, kq.jobset(name, run_id, queues[i % n_q].local_queue, pods, gpus))
                    created[name] = time.time()
                say(f"creating {n_wl} JobSets of {pods} ranks over {n_q} ClusterQueues")
                cpu0 = cpu_reading(c.kwok.pids())
                t0 = time.time()
                with ThreadPoolExecutor(max_workers=profile.kueue_bench_create_concurrency) as pool:
                    list(pool.map(submit, range(n_wl)))
                t_created = time.time()
                informer.run(until=lambda: len(admitted) >= n_wl, deadline=time.monotonic()
                             + profile.kueue_bench_timeout_s, what=f"{n_wl} Workloads admitted")
                cpu1 = cpu_reading(c.kwok.pids())
                t_admitted = max(admitted.values())
                say(f"{len(admitted)} admitted {t_admitted - t0:.1f} s after the first create "
                    f"(creates took {t_created - t0:.1f} s)")
                per_workload = {n: admitted[n] - created[n] for n in sorted(created) if n in admitted}
                latencies = list(per_workload.values())
                by_objects = seconds(admission_by_timestamps(api, ns, informer.snapshot()))
                say(f"create -> Admitted p99 {seconds(latencies)['p99_s']} s as the harness saw it, "
                    f"{by_objects['p99_s']} s by the objects' own timestamps (1 s resolution)")
                bound = _wait_bound(ranks, n_wl * pods, profile.kueue_bench_timeout_s)
                t_bound, cpu2 = time.time(), cpu_reading(c.kwok.pids())
                evicted = sum(1 for w in informer.snapshot() if kq.condition(w, "Evicted"))   # ever, any reason
            finally:
                informer.stop()
                ranks.stop()
            data = {
                "kueue": toolchain.KUEUE_VERSION, "jobset": toolchain.JOBSET_VERSION,
                "burst": {"workloads": n_wl, "pods": n_wl * pods, "pods_per_workload": pods, "cluster_queues": n_q,
                          "nodes": profile.nodes, "create_s": round(t_created - t0, 2),
                          "admitted_per_s": round(len(admitted) / (t_admitted - t0), 2),
                          "all_admitted_s": round(t_admitted - t0, 2), "all_bound_s": round(t_bound - t0, 2),
                          "bound": bound, "evicted": evicted,
                          "pods_ready_timeout_s": profile.kueue_pods_ready_timeout_s},
                "admission": seconds(latencies),
                "admission_by_timestamps": {**by_objects, "resolution_s": 1},
                "cpu": {"cpus": cpus, "admission": cpu_window(cpu0, cpu1, cpus),
                        "binding": cpu_window(cpu1, cpu2, cpus)},
                "thresholds": {"admit_p99_s": profile.kueue_bench_admit_p99_s,
                               "min_admitted_per_s": profile.kueue_bench_min_admitted_per_s},
                "kueue_ci": KUEUE_CI,
                "admit_s_per_workload": {n: round(v, 3) for n, v in per_workload.items()},
            }
            kq.delete_jobsets(api, ns, list(created), timeout=profile.kueue_bench_timeout_s)
            for q in queues:
                q.delete(api)
        head = common.header(argv, c, profile, "clusterproof.bench.kueue")
    common.write(args.out, head, figures(data), data)
    return 0


MACHINE = "machine (busy)"


def cpu_reading(pids: dict[str, int]) -> dict[str, float]:
    """Now: each component's CPU-seconds, the harness's, the machine's busy CPU-seconds, and the time."""
    t = psutil.cpu_times()
    return {**apiwork.components_cpu_s(pids), "harness": apiwork.harness_cpu_s(),
            MACHINE: t.user + t.nice + t.system + t.irq + t.softirq + t.steal, "_at": time.time()}


def cpu_window(a: dict[str, float], b: dict[str, float], cpus: int) -> dict:
    """Between two ``cpu_reading``s (pure): the seconds, the CPU-s of each process (largest first), and the share
    of the machine's ``cpus`` cores that was busy."""
    wall = b["_at"] - a["_at"]
    used = {k: round(b[k] - a.get(k, 0.0), 1) for k in b if k not in ("_at", MACHINE)}
    busy = b[MACHINE] - a[MACHINE]
    return {"seconds": round(wall, 1), "busy_share": round(busy / (wall * cpus), 3) if wall > 0 else None,
            "cpu_s_by_process": dict(sorted(used.items(), key=lambda kv: -kv[1]))}


def jobset_of(workload: dict) -> str | None:
    """The JobSet a Workload stands for (its owner), if any."""
    return next((o["name"] for o in workload["metadata"].get("ownerReferences") or [] if o.get("kind") == "JobSet"),
                None)


def admission_by_timestamps(api, ns: str, workloads: list[dict]) -> list[float]:
    """Each admitted JobSet's ``creationTimestamp`` (the API server's) to its Workload's ``Admitted``
    ``lastTransitionTime`` (Kueue's), in whole seconds: the second instrument. ``workloads``: the Workloads
    as the bench's informer holds them (only the JobSets are listed)."""
    from clusterproof.core.timeparse import parse_time
    from clusterproof.kube.client import list_all
    made = {j["metadata"]["name"]: parse_time(j["metadata"]["creationTimestamp"])
            for j in list_all(api, f"{kq.JOBSET_API}/namespaces/{ns}/jobsets")}
    out = []
    for w in workloads:
        owner, admitted = jobset_of(w), kq.condition(w, "Admitted")
        if owner in made and admitted.get("status") == "True":
            out.append((parse_time(admitted["lastTransitionTime"]) - made[owner]).total_seconds())
    return out


def _wait_bound(ranks: Informer, want: int, timeout: float) -> int:
    """Every rank of the burst bound, as the ranks' informer has them (no request to the API server)."""
    from clusterproof.core.waiting import wait_for

    def bound() -> int:
        return sum(1 for p in ranks.snapshot() if p["spec"].get("nodeName"))
    return wait_for(bound, until=lambda b: b >= want, timeout=timeout, interval=1.0,
                    what=f"all {want} ranks of the burst bound")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
