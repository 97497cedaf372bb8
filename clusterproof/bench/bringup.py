"""Benchmark (not a pass/fail test): bring the embedded cluster up at full size.

Writes ``reports/bench/bringup.json``: time to all nodes Ready, peak RSS of
each control-plane process during bring-up and idle, and the control plane's
mean CPU over an idle window at full size. Targets (2-core machine): 7,500
nodes Ready <= 60 s, idle control plane <= 1 core, apiserver RSS <= 4 GiB;
the JSON records what was measured, whatever it is.

    python -m clusterproof.bench.bringup [--profile nightly] [--set key=value ...] [--idle-seconds 120]
"""
from __future__ import annotations

import json
import math
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


class PeakRss(threading.Thread):
    """Samples the RSS of the cluster's processes every 0.5 s (pids appear as kwokctl starts them)."""

    def __init__(self, pid_dir: Path):
        super().__init__(daemon=True)
        self.pid_dir, self.peak, self.stop = pid_dir, {c: 0 for c in COMPONENTS}, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            for c in COMPONENTS:
                try:
                    rss = psutil.Process(int((self.pid_dir / f"{c}.pid").read_text())).memory_info().rss
                except (OSError, ValueError, psutil.Error):
                    continue
                self.peak[c] = max(self.peak[c], rss)


# kube-controller-manager's node lifecycle controller lifts the not-ready taint in nodeUpdateWorkerSize
# workers, a constant upstream (pkg/controller/nodelifecycle: 8; no flag on any real cluster either), each
# doing a GET of the node (resourceVersion 0, the watch cache) and a PATCH of its taints.
NODE_LIFECYCLE_WORKERS = 8


def taint_lift_bound(before: str, after: str) -> dict:
    """What caps the rate at which new nodes become schedulable (pure): the apiserver's median GET and
    PATCH of a node during bring-up, and the rate the node lifecycle controller's workers can reach
    at those latencies (one GET and one PATCH per node, ``NODE_LIFECYCLE_WORKERS`` at a time)."""
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
                   "taint: at the apiserver's median latencies during bring-up they reach at most this rate"}


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    out = {}
    for c, pid in pids.items():
        t = psutil.Process(pid).cpu_times()
        out[c] = t.user + t.system
    return out


def main(argv: list[str]) -> int:
    ap = common.parser(__doc__, "nightly", "bringup.json")
    ap.add_argument("--idle-seconds", type=float, default=120.0)
    ap.add_argument("--with-coscheduling", action="store_true",
                    help="also start the Coscheduling scheduler and controller (as the gang suite's runs do)")
    args = ap.parse_args(argv)
    if args.kubeconfig:
        raise common.fail(ValueError("clusterproof.bench.bringup measures the embedded cluster's bring-up: "
                                     "drop --kubeconfig"))
    profile = common.load(args)
    run_id = new_run_id()
    sampler = PeakRss(KwokCluster(f"{NAME_PREFIX}{run_id}", 1, 40).directory / "pids")
    sampler.start()
    try:
        with common.cluster(args, profile, args.with_coscheduling, run_id) as c:
            real = c.real.nodes if c.real else []
            pids = {k: v for k, v in c.kwok.pids().items() if not realnodes.is_component(k)}
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
    idle_cores = {k: (cpu1[k] - cpu0[k]) / elapsed for k in cpu0}
    lease_s = profile.node_lease_duration_s * profile.heartbeat_factor
    b = c.bringup
    f = lambda name, value, unit: common.figure("bringup", name, value, unit)  # noqa: E731
    figs = [f("nodes", b.nodes, "nodes"),
            f("seconds_to_all_ready", round(b.seconds_to_all_ready_condition, 1), "s"),
            f("seconds_to_all_schedulable", round(b.seconds_to_all_ready, 1), "s"),
            f("seconds_create_all_nodes", round(b.seconds_create, 1), "s"),
            f("seconds_control_plane_start", round(b.seconds_cluster_start, 1), "s")]
    result = {
        **common.values(figs),
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
        "node_lifecycle_controller": taint_lift_bound(b.metrics_before, b.metrics_after),
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
        **head,
    }
    common.write(args.out, result, figs)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
