"""Benchmark (not a pass/fail test): bring the embedded cluster up at full size.

Writes ``reports/bench/bringup.json``: time to all nodes Ready, peak RSS of
each control-plane process during bring-up and idle, the machine's CPUs from
the first create to all Ready and to all schedulable (by process: whether
bring-up was CPU-bound, and who did the work), and the control plane's mean
CPU over an idle window at full size. Targets (2-core machine): 7,500
nodes Ready <= 60 s, idle control plane <= 1 core, apiserver RSS <= 4 GiB;
the JSON records what was measured, whatever it is.

    python -m clusterproof.bench.bringup [--cp-profile nightly] [--cp-set key=value ...] [--idle-seconds 120]
"""
from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from pathlib import Path

import psutil

from clusterproof.bench import common
from clusterproof.cluster import realnodes
from clusterproof.cluster.kwok import NAME_PREFIX, KwokCluster
from clusterproof.core import progress
from clusterproof.core.run import new_run_id
from clusterproof.core.stats import histogram_quantile
from clusterproof.kube import apimetrics

COMPONENTS = ("kube-apiserver", "etcd", "kwok-controller", "kube-controller-manager", "kube-scheduler")
HARNESS, MACHINE_BUSY = "harness (this process)", "machine busy"     # the other keys of a ``Usage.cpu`` sample


class Usage(threading.Thread):
    """Samples the cluster's processes every 0.5 s (pids appear as kwokctl starts them): each one's peak
    RSS, and ``cpu``: (monotonic time, CPU-s of each component, of this harness process, and of the whole
    machine busy) for ``cpu_in_window``."""

    def __init__(self, pid_dir: Path):
        super().__init__(daemon=True)
        self.pid_dir, self.peak, self.stop = pid_dir, {c: 0 for c in COMPONENTS}, threading.Event()
        self.cpu: list[tuple[float, dict[str, float]]] = []
        self.own = psutil.Process()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            cpu = {}
            for c in COMPONENTS:
                try:
                    p = psutil.Process(int((self.pid_dir / f"{c}.pid").read_text()))
                    self.peak[c] = max(self.peak[c], p.memory_info().rss)
                    cpu[c] = process_cpu_s(p)
                except (OSError, ValueError, psutil.Error):
                    continue
            m = psutil.cpu_times()
            cpu[HARNESS] = process_cpu_s(self.own)
            cpu[MACHINE_BUSY] = m.user + m.nice + m.system + m.irq + m.softirq   # guest time is within user
            self.cpu.append((time.monotonic(), cpu))


def cpu_in_window(samples: list[tuple[float, dict[str, float]]], start: float, end: float, cpus: int) -> dict:
    """What the machine's CPUs did between two moments of bring-up (pure), from ``Usage.cpu``: CPU-s by
    component and of the harness, the machine's busy CPU-s, and the shortest the window could have been
    with that work on ``cpus`` fully busy and nothing waiting. A window whose CPUs were (nearly) all busy
    is CPU-bound: only less work per node, or more cores, shortens it. The samples bracketing the window
    are used (0.5 s apart); a component that had not started by ``start`` counts its whole life."""
    before = [s for s in samples if s[0] <= start]
    after = [s for s in samples if s[0] >= end]
    if not before or not after:
        return {}
    (t0, a), (t1, b) = before[-1], after[0]
    used = {k: round(v - a.get(k, 0.0), 1) for k, v in b.items()}
    busy = used.pop(MACHINE_BUSY, 0.0)
    wall = t1 - t0
    return {"seconds": round(wall, 1), "cpu_seconds_by_process": used,
            "machine_busy_cpu_seconds": busy, "machine_busy_share": round(busy / (cpus * wall), 2) if wall else None,
            "cpu_bound_seconds": round(busy / cpus, 1)}


# kube-controller-manager's node lifecycle controller lifts the not-ready taint in nodeUpdateWorkerSize
# workers, a constant upstream (pkg/controller/nodelifecycle: 8; no flag on any real cluster either). Each
# item of its queue is one node: a GET of the node (resourceVersion 0, the watch cache) and a PATCH of its
# taints, and a GET and a PATCH of its labels if the beta OS/arch pair is missing (reconcileNodeLabels).
NODE_LIFECYCLE_WORKERS = 8
NODE_LIFECYCLE_QUEUE = 'name="node_lifecycle_controller"'
KCM_SAMPLE_EVERY_S = 5.0


def taint_lift_bound(before: str, after: str) -> dict:
    """The apiserver's view (pure): its median GET and PATCH of a node during bring-up, and the rate the
    node lifecycle controller's workers would reach if each item took just those two medians. The
    controller's own view (``node_lifecycle_queue``) says what each item took."""
    hist = apimetrics.delta(apimetrics.histograms(after), apimetrics.histograms(before))

    def median(verb: str) -> tuple[float | None, int]:
        buckets: dict[float, float] = {}
        for (v, group, resource, sub, scope), b in hist.items():
            if v == verb and not group and resource == "nodes" and not sub and scope == "resource":
                for le, c in b.items():
                    buckets[le] = buckets.get(le, 0.0) + c
        if not buckets:
            return None, 0
        return round(histogram_quantile(0.5, buckets), 4), int(buckets[math.inf])
    get_s, gets = median("GET")
    patch_s, patches = median("PATCH")
    bound = NODE_LIFECYCLE_WORKERS / (get_s + patch_s) if get_s and patch_s else None
    return {"workers": NODE_LIFECYCLE_WORKERS, "get_node_median_s": get_s, "get_node_calls": gets,
            "patch_node_median_s": patch_s, "patch_node_calls": patches,
            "rate_bound_nodes_per_second": round(bound, 1) if bound else None,
            "why": "the node lifecycle controller's 8 workers each GET and PATCH a node to lift its not-ready "
                   "taint: at the apiserver's median latencies during bring-up they would reach this rate"}


def kcm_sample(text: str) -> dict[str, float]:
    """From kube-controller-manager's /metrics (pure): its node lifecycle queue's depth and work, and its
    client's request durations by verb (every controller's, summed over hosts)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        key, value = line.rsplit(" ", 1)
        name = key.split("{", 1)[0]
        if NODE_LIFECYCLE_QUEUE in key and name in ("workqueue_depth", "workqueue_work_duration_seconds_sum",
                                                    "workqueue_work_duration_seconds_count"):
            out[name] = float(value)
        elif name in ("rest_client_request_duration_seconds_sum", "rest_client_request_duration_seconds_count"):
            verb = key.split('verb="', 1)[1].split('"', 1)[0] if 'verb="' in key else ""
            out[f"{name}:{verb}"] = out.get(f"{name}:{verb}", 0.0) + float(value)
    return out


def node_lifecycle_queue(samples: list[tuple[float, dict[str, float]]]) -> dict:
    """The node lifecycle controller's own account of bring-up (pure), from ``kcm_sample``s taken every few
    seconds: over the span in which its queue held at least as many nodes as it has workers (all of them
    could be busy), how many were busy on average, what one item took, and what kube-controller-manager's
    client waited for a GET and a PATCH meanwhile."""
    full = [(t, s) for t, s in samples if s.get("workqueue_depth", 0) >= NODE_LIFECYCLE_WORKERS]
    out: dict = {"workers": NODE_LIFECYCLE_WORKERS, "samples": len(samples),
                 "peak_queue_depth": int(max((s.get("workqueue_depth", 0) for _, s in samples), default=0)),
                 "saturated_seconds": round(full[-1][0] - full[0][0], 1) if len(full) > 1 else 0.0}
    if len(full) < 2:
        return out
    (t0, a), (t1, b) = full[0], full[-1]
    d = lambda k: b.get(k, 0.0) - a.get(k, 0.0)  # noqa: E731
    work, items = d("workqueue_work_duration_seconds_sum"), d("workqueue_work_duration_seconds_count")

    def client_mean(verb: str) -> float | None:
        n = d(f"rest_client_request_duration_seconds_count:{verb}")
        return round(d(f"rest_client_request_duration_seconds_sum:{verb}") / n, 4) if n else None
    out.update({
        "busy_workers_mean": round(work / (t1 - t0), 2),
        "items_per_second": round(items / (t1 - t0), 1),
        "item_mean_s": round(work / items, 4) if items else None,
        "kcm_client_get_mean_s": client_mean("GET"),
        "kcm_client_patch_mean_s": client_mean("PATCH"),
        "why": "kube-controller-manager's own metrics: while its node lifecycle queue held more nodes than its "
               "8 workers (a constant upstream), this many were busy on average and each item (one node: GET "
               "and PATCH of its taints) took this long, because its client's GETs and PATCHes waited this "
               "long on the control plane (means, every controller's requests)"})
    return out


class KcmQueue(threading.Thread):
    """Samples kube-controller-manager's metrics (``kcm_sample``) every ``KCM_SAMPLE_EVERY_S`` once it
    answers, until stopped."""

    def __init__(self, cluster: KwokCluster):
        super().__init__(daemon=True)
        self.cluster, self.samples, self.stop = cluster, [], threading.Event()

    def run(self) -> None:
        while not self.stop.wait(KCM_SAMPLE_EVERY_S):
            text = self.cluster.controller_manager_metrics()
            if text is not None:
                self.samples.append((time.monotonic(), kcm_sample(text)))


def process_cpu_s(p: psutil.Process) -> float:
    """A process's own CPU-seconds (user + system) since it started."""
    t = p.cpu_times()
    return t.user + t.system


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    return {c: process_cpu_s(psutil.Process(pid)) for c, pid in pids.items()}


# The flat figures of a bring-up and their units (the per-process ones are qualified by the process).
UNITS = {"nodes": "nodes", "seconds_to_all_ready": "s", "seconds_to_all_schedulable": "s",
         "seconds_create_all_nodes": "s", "seconds_control_plane_start": "s",
         "apiserver_peak_rss_bytes": "B", "etcd_peak_rss_bytes": "B", "kwok_peak_rss_bytes": "B",
         "kube_controller_manager_peak_rss_bytes": "B", "kube_scheduler_peak_rss_bytes": "B",
         "control_plane_cpu_cores_idle": "cores", "idle_window_seconds": "s",
         "control_plane_cores_through_bringup": "cores", "kcm_api_qps": "QPS"}


def figures(data: dict) -> list[common.Figure]:
    """A bring-up's figures from what the bench measured: times, peak RSS, CPU (per process qualified by
    it: ``control_plane_cpu_cores_idle[etcd]``), the node lifecycle controller's bound and queue, the
    heartbeat's lease writes. A part a bench of its time did not measure gives no figure."""
    f = lambda name, value, unit: common.figure("bringup", name, value, unit)  # noqa: E731
    q = common.qualified
    out = [f(k, data[k], unit) for k, unit in UNITS.items() if k in data]
    for key, unit in (("control_plane_cpu_cores_idle_by_component", "cores"),
                      ("control_plane_cpu_seconds_through_bringup_by_component", "CPU-s"),
                      ("control_plane_cores_through_bringup_by_component", "cores")):
        out += [f(q(key.removesuffix("_by_component"), c), v, unit) for c, v in (data.get(key) or {}).items()]
    if data.get("nodes") and data.get("seconds_to_all_schedulable"):
        out.append(f("nodes_per_s_to_all_schedulable", round(data["nodes"] / data["seconds_to_all_schedulable"], 1),
                     "nodes/s"))
    for window in ("all_ready", "all_schedulable"):
        w = data.get(f"cpu_to_{window}")
        if not w:
            continue
        out += [f(f"machine_busy_percent_to_{window}", round(100 * w["machine_busy_share"]), "%"),
                f(f"cpu_bound_seconds_to_{window}", w["cpu_bound_seconds"], "s"),
                f(f"machine_busy_cpu_seconds_to_{window}", w["machine_busy_cpu_seconds"], "CPU-s")]
        out += [f(q(f"cpu_seconds_to_{window}", p), v, "CPU-s") for p, v in w["cpu_seconds_by_process"].items()]
    nlc = data.get("node_lifecycle_controller") or {}
    out += [f(f"node_lifecycle_{k}", nlc[k], unit) for k, unit in (
        ("get_node_median_s", "s"), ("patch_node_median_s", "s"), ("rate_bound_nodes_per_second", "nodes/s"))
        if nlc.get(k) is not None]
    nlq = data.get("node_lifecycle_queue") or {}
    if nlq.get("busy_workers_mean") is not None:
        out += [f(f"node_lifecycle_queue_{k}", nlq[k], unit) for k, unit in (
            ("workers", "workers"), ("busy_workers_mean", "workers"), ("saturated_seconds", "s"),
            ("peak_queue_depth", "nodes"), ("item_mean_s", "s"), ("items_per_second", "nodes/s"),
            ("kcm_client_get_mean_s", "s"), ("kcm_client_patch_mean_s", "s")) if k in nlq]
    hb = data.get("heartbeat") or {}
    out += [f(k, hb[k], unit) for k, unit in (("heartbeat_factor", ""), ("lease_writes_per_second", "writes/s"),
                                              ("real_kubelet_lease_writes_per_second", "writes/s")) if k in hb]
    for node, r in (data.get("real_nodes") or {}).items():
        out += [f(q(k, node), r[k], unit) for k, unit in (
            ("seconds_cluster_start_to_ready", "s"), ("cpu_cores_idle", "cores"), ("rss_mib", "MiB"),
            ("processes", "processes")) if k in r]
    return out


def main(argv: list[str]) -> int:
    ap = common.parser(__doc__, "nightly", "bringup.json")
    ap.add_argument("--idle-seconds", type=float, default=120.0)
    ap.add_argument("--with-coscheduling", action="store_true",
                    help="also start the Coscheduling scheduler and controller (as the gang suite's runs do)")
    args = ap.parse_args(argv)
    if args.kubeconfig:
        raise common.fail(ValueError("clusterproof.bench.bringup measures the embedded cluster's bring-up: "
                                     "drop --cp-kubeconfig"))
    profile = common.load(args)
    run_id = new_run_id()
    kc = KwokCluster(f"{NAME_PREFIX}{run_id}", 1, 40)   # the cluster common.cluster starts: its directory
    sampler, kcm = Usage(kc.directory / "pids"), KcmQueue(kc)
    sampler.start()
    kcm.start()
    try:
        with common.cluster(args, profile, args.with_coscheduling, run_id) as c:
            real = c.real.nodes if c.real else []
            pids = {k: v for k, v in c.kwok.pids().items() if not realnodes.is_component(k)}
            kcm.stop.set()           # bring-up is over: the queue's drain of no-op items is not part of it
            cpu_bringup = cpu_seconds(pids)  # since each process started: start-up + bring-up
            alive_s = {k: time.time() - psutil.Process(pid).create_time() for k, pid in pids.items()}
            common.say(f"idle at full size for {args.idle_seconds:g} s")
            cpu0, t0 = cpu_seconds(pids), time.monotonic()
            real0 = realnodes.sample_usage(real)
            with progress.heartbeat("the end of the idle window", timeout=args.idle_seconds):
                time.sleep(args.idle_seconds)  # the measurement window itself, not a synchronisation
            cpu1, elapsed = cpu_seconds(pids), time.monotonic() - t0
            real1 = realnodes.sample_usage(real)
            head = common.header(argv, c, profile, "clusterproof.bench.bringup")
    finally:
        sampler.stop.set()
        kcm.stop.set()
    idle_cores = {k: (cpu1[k] - cpu0[k]) / elapsed for k in cpu0}
    lease_s = profile.node_lease_duration_s * profile.heartbeat_factor
    b, cpus = c.bringup, os.cpu_count() or 1
    data = {
        "nodes": b.nodes,
        "seconds_to_all_ready": round(b.seconds_to_all_ready_condition, 1),
        "seconds_to_all_schedulable": round(b.seconds_to_all_ready, 1),
        "seconds_create_all_nodes": round(b.seconds_create, 1),
        "seconds_control_plane_start": round(b.seconds_cluster_start, 1),
        "ready_means": "all_ready: every node reports Ready=True; all_schedulable: and the "
                       "node lifecycle controller has lifted its not-ready taint",
        "apiserver_peak_rss_bytes": sampler.peak["kube-apiserver"],
        "etcd_peak_rss_bytes": sampler.peak["etcd"],
        "kwok_peak_rss_bytes": sampler.peak["kwok-controller"],
        "kube_controller_manager_peak_rss_bytes": sampler.peak["kube-controller-manager"],
        "kube_scheduler_peak_rss_bytes": sampler.peak["kube-scheduler"],
        "control_plane_cpu_cores_idle": round(sum(idle_cores.values()), 3),
        "control_plane_cpu_cores_idle_by_component": {k: round(v, 3) for k, v in idle_cores.items()},
        "idle_window_seconds": round(elapsed, 1),
        "control_plane_cpu_seconds_through_bringup_by_component":
            {k: round(v, 1) for k, v in cpu_bringup.items()},
        # Cores each used from its start to all nodes schedulable; their sum against the machine's CPUs
        # says whether bring-up was CPU-bound (then no setting of one component makes it faster).
        "control_plane_cores_through_bringup_by_component":
            {k: round(v / alive_s[k], 2) for k, v in cpu_bringup.items() if alive_s.get(k)},
        "control_plane_cores_through_bringup": round(sum(v / alive_s[k] for k, v in cpu_bringup.items()
                                                         if alive_s.get(k)), 2),
        # The machine's CPUs from the first create to all Ready=True, and to all schedulable: whether each
        # window was CPU-bound, and which process did the work (the targets: 60 s and 90 s).
        "cpu_to_all_ready": cpu_in_window(sampler.cpu, b.first_create_at,
                                          b.first_create_at + b.seconds_to_all_ready_condition, cpus),
        "cpu_to_all_schedulable": cpu_in_window(sampler.cpu, b.first_create_at,
                                                b.first_create_at + b.seconds_to_all_ready, cpus),
        "node_lifecycle_controller": taint_lift_bound(b.metrics_before, b.metrics_after),
        "node_lifecycle_queue": node_lifecycle_queue(kcm.samples),
        "heartbeat": {
            "heartbeat_factor": profile.heartbeat_factor,
            "node_lease_duration_seconds": lease_s,
            "lease_renew_interval_seconds": lease_s / 4,
            "lease_writes_per_second": round(b.nodes / (lease_s / 4), 1),
            "real_kubelet_lease_writes_per_second": round(b.nodes / 10, 1),
            "kcm_node_monitor_grace_period_seconds": 40 * profile.heartbeat_factor,
        },
        "kcm_api_qps": profile.kcm_api_qps,
        # Each real node (kubelet + containerd + its shims, no workload pods): what it costs beside kwok.
        "real_nodes": {name: {
            "seconds_cluster_start_to_ready": c.real.seconds_to_ready[name],
            "cpu_cores_idle": round((real1[name]["cpu_s"] - real0[name]["cpu_s"]) / elapsed, 3),
            "rss_mib": real1[name]["rss_mib"],
            "processes": real1[name]["processes"]} for name in real0} if c.real else {},
    }
    common.write(args.out, head, figures(data), data)
    print(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
