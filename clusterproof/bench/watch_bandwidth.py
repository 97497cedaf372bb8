"""Benchmark (not a pass/fail test): watch bytes per endpoint change, both APIs, both encodings, at each size.

Runs the watch-bandwidth suite's measurement (``clusterproof.watch.measure``:
a per-node Service grown through ``watch_sizes``, ``watch_watchers`` watchers
per API and encoding, churn at ``watch_churn_rate``) on one cluster and
records, per size: bytes per change per watcher (as framed on the stream and
on the TCP socket), the apiserver's own ``apiserver_watch_events_sizes``
beside the harness's count, the Endpoints/EndpointSlice ratio and the
projection to ``watch_projection_nodes`` nodes; pods/s to grow and delete
the Service. Then, at the largest size, how many watchers this machine
sustains: ``--watchers`` per API and encoding (4x that many streams), each
step churned the same way -- every watcher must receive every event; the
spread between the first and the last watcher's receipt, the harness's own
CPU and the apiserver's CPU are recorded.

    python -m clusterproof.bench.watch_bandwidth [--cp-profile smoke]
                                    [--cp-set nodes=1000 --cp-set watch_sizes=100,500,1000]
                                    [--watchers 25,50,100,200] [--cp-kubeconfig PATH]

Writes ``reports/bench/watch_bandwidth.json`` and the projection plot
``reports/bench/watch_bandwidth.png``.
"""
from __future__ import annotations

import os
import sys
import time

import psutil

from clusterproof.bench import common
from clusterproof.core.waiting import WaitTimeout
from clusterproof.watch import measure as wb
from clusterproof.watch.figures import projection_plot, summary
from clusterproof.watch.wire import ENCODINGS


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def capacity_step(api, profile, target, svc, watchers: int, apiserver: list[int], say) -> dict:
    """One step of the sweep: ``watchers`` per API and encoding at the Service's current size."""
    p = profile.model_copy(update={"watch_watchers": watchers})
    me = [os.getpid()]
    c0, a0, t0 = cpu_seconds(me), cpu_seconds(apiserver), time.monotonic()
    try:
        s = wb.measure(api, p, target, svc, svc.size, say)
    except (WaitTimeout, AssertionError) as e:      # the harness could not keep up: that is the finding
        return {"watchers_per_group": watchers, "streams": 4 * watchers, "kept_up": False, "error": str(e)[:300]}
    wall = time.monotonic() - t0
    groups = s.groups.values()
    bytes_in = sum(g.bytes_per_watcher * g.watchers for g in groups)
    return {
        "watchers_per_group": watchers, "streams": 4 * watchers,
        "kept_up": not any(g.dropped or g.diverged for g in groups),
        "dropped": sum(len(g.dropped) for g in groups), "diverged": sum(len(g.diverged) for g in groups),
        "churn_changes": s.churn_changes, "window_s": round(s.window_s, 1),
        "received_bytes": bytes_in, "received_mb_per_s": round(bytes_in / s.window_s / 1e6, 2),
        "delivery_spread_p99_s": {g.name: g.spread_p99_s for g in groups},
        "harness_cpu_s": round(cpu_seconds(me) - c0, 1), "apiserver_cpu_s": round(cpu_seconds(apiserver) - a0, 1),
        "wall_s": round(wall, 1),
    }


GROUPS = ("endpointslices/protobuf", "endpointslices/json", "endpoints/protobuf", "endpoints/json")


def figures(data: dict) -> list[common.Figure]:
    """Per size (qualified ``[1,000 endpoints]``): bytes per churn change per watcher of each API and encoding,
    the Endpoints/EndpointSlice ratio, the harness's largest difference from the apiserver's own count,
    whether Endpoints was truncated; the projection (``projected_egress <series>[7,500 nodes]``); each step of
    the watcher sweep (``[400 streams]``); the churn's pod rates."""
    f = lambda name, value, unit: common.figure("watch_bandwidth", name, value, unit)  # noqa: E731
    q = common.qualified
    out = [f(k, data.get(k), unit) for k, unit in (("pods_created_per_s", "pods/s"), ("pods_deleted_per_s", "pods/s"),
                                                   ("watchers_per_api_and_encoding", "watchers")) if k in data]
    for s in data.get("sizes") or []:
        size = f"{s['endpoints']:,} endpoints"
        g = s.get("groups") or {}
        out += [f(q(f"bytes_per_churn_change {k}", size), (g.get(k) or {}).get("bytes_per_churn_change"), "B")
                for k in GROUPS if k in g]
        agree = [a.get("relative_difference") for a in (s.get("apiserver_agreement") or {}).values()
                 if a.get("relative_difference") is not None]
        trunc = (s.get("endpoints_object") or {}).get("annotations", {}).get("endpoints.kubernetes.io/over-capacity")
        out += [f(q("endpoints_to_endpointslice_bytes protobuf", size),
                  (s.get("endpoints_to_endpointslice_bytes") or {}).get("protobuf"), ""),
                f(q("apiserver_agreement_largest_difference", size), 100 * max(agree) if agree else None, "%"),
                f(q("endpoints_truncated", size), trunc == "truncated", "bool")]
    changes = (data.get("settings") or {}).get("watch_projection_changes_per_node_hour")
    if changes is not None:
        out.append(f("projection_changes_per_node_hour", changes, "changes"))
    for series, pts in (data.get("projection_bytes_per_s") or {}).items():
        out += [f(q(f"projected_egress {series}", f"{int(n):,} nodes"), b, "B/s") for n, b in pts]
    cap = data.get("watcher_capacity") or {}
    for st in cap.get("steps") or []:
        step = f"{st['streams']:,} streams"
        spread = [v for v in (st.get("delivery_spread_p99_s") or {}).values() if v is not None]
        out += [f(q("watchers_per_group", step), st.get("watchers_per_group"), "watchers"),
                f(q("kept_up", step), st.get("kept_up"), "bool"),
                f(q("received_mb_per_s", step), st.get("received_mb_per_s"), "MB/s"),
                f(q("delivery_spread_p99_s_worst", step), max(spread) if spread else None, "s"),
                f(q("harness_cpu_s", step), st.get("harness_cpu_s"), "CPU-s"),
                f(q("apiserver_cpu_s", step), st.get("apiserver_cpu_s"), "CPU-s"),
                f(q("window_s", step), st.get("window_s"), "s")]
    if cap.get("max_streams_kept_up") is not None:
        out.append(f("max_streams_kept_up", cap["max_streams_kept_up"], "streams"))
    return out


def main(argv: list[str]) -> int:
    ap = common.parser(__doc__, "smoke", "watch_bandwidth.json")
    ap.add_argument("--watchers", default="25,50,100,200", help="watchers per API and encoding, for the sweep")
    args = ap.parse_args(argv)
    profile, say = common.load(args), common.say
    try:
        sweep = [int(w) for w in args.watchers.split(",") if w]
    except ValueError as e:
        raise common.fail(e) from None
    steps = []
    with common.cluster(args, profile) as c, common.namespace(c, "watch") as ns:
        apiserver = [c.kwok.pids().get("kube-apiserver")] if c.kwok else []
        target = wb.own_target(ns)

        def capacity(svc):
            for w in sweep:
                say(f"capacity: {w} watchers per API and encoding ({4 * w} streams) at {svc.size} endpoints")
                steps.append(capacity_step(c.api, profile, target, svc, w, [p for p in apiserver if p], say))
                say(f"  {steps[-1]}")
                if not steps[-1]["kept_up"]:
                    break
        run = wb.run_all(c.api, profile, target, c.run_id, say, at_largest=capacity if sweep else None,
                         owned=c.kwok is not None)
        head = common.header(argv, c, profile, "clusterproof.bench.watch_bandwidth")
    kept = [s["watchers_per_group"] for s in steps if s["kept_up"]]
    data = {
        "settings": {k: profile[k] for k in ("watch_sizes", "watch_watchers", "watch_churn", "watch_churn_rate",
                                             "watch_churn_kinds", "watch_max_endpoints_per_slice",
                                             "watch_projection_nodes", "watch_projection_changes_per_node_hour")},
        "encodings": list(ENCODINGS),
        "bytes_mean": "bytes as framed on the watch stream (JSON line with newline, protobuf frame with its 4-byte "
                      "length); wire_bytes_per_watcher: bytes on the TCP socket (TLS, HTTP chunking)",
        **summary(run, profile),
        "watcher_capacity": {"max_watchers_per_group_kept_up": max(kept) if kept else None,
                             "max_streams_kept_up": 4 * max(kept) if kept else None, "steps": steps},
    }
    common.write(args.out, head, figures(data), data)
    args.out.with_suffix(".png").write_bytes(projection_plot(run, profile).png())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
