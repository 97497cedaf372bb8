"""Benchmark (not a pass/fail test): the capacity knee -- the highest steady create rate at which the SLOs hold.

Steps the steady phase of the burst suite (clusterproof/burst/plan.py) through rising
create rates on one cluster; each step creates whole-node pods at its rate for
``--seconds`` (a sustained rate, not a spike: a scheduler slower than the rate
falls further behind with every second; capped at the shared pool's size) and
records, from the apiserver's own histogram and the pods' own
timestamps, pod-create p99 and pod-startup p99 (the watch-observed startup
and locust's client-side figures beside them). The knee is the highest rate
at which both SLOs hold (mutating calls p99 <= 1 s, pod startup p99 <= 5 s);
the nightly profile's ``burst_steady_rate`` is chosen below it (docs/suites/burst_pod_creation.md).

    python -m clusterproof.bench.knee [--cp-profile nightly] [--rates 10,20,40] [--seconds 30] [--cp-kubeconfig PATH]

Writes ``reports/bench/knee.json`` and the plot ``reports/bench/knee.png``.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from clusterproof.bench import common
from clusterproof.burst import plan
from clusterproof.burst.measure import clear_phase, run_phase, schedulable_shared_nodes
from clusterproof.report.plots import Plot, Series

KEEP = ("create_qps", "create_latency_server_p99_s", "create_latency_p99_s", "pod_startup_server_p50_s",
        "pod_startup_server_p99_s", "pod_startup_p99_s", "watch_lag_created_p99_s", "watch_lag_running_p99_s",
        "created_to_bound_p99_s", "scheduling_throughput_pods_per_s", "pods_running", "responses_429")


def holds(step: dict, profile) -> bool:
    create, startup = step.get("create_latency_server_p99_s"), step.get("pod_startup_server_p99_s")
    return (create is not None and startup is not None and step["pods_running"] == step["pods"]
            and create <= profile.slo_mutating_p99_s and startup <= profile.slo_pod_startup_p99_s)


# Each step's figures and their units (the step's own: qualified by its rate).
UNITS = {"pods": "pods", "create_qps": "pods/s", "create_latency_server_p99_s": "s", "create_latency_p99_s": "s",
         "pod_startup_server_p50_s": "s", "pod_startup_server_p99_s": "s", "pod_startup_p99_s": "s",
         "watch_lag_created_p99_s": "s", "watch_lag_running_p99_s": "s", "created_to_bound_p99_s": "s",
         "scheduling_throughput_pods_per_s": "pods/s", "pods_running": "pods", "responses_429": "responses",
         "slos_hold": "bool"}


def figures(data: dict) -> list[common.Figure]:
    """The knee, and each step's figures qualified by its rate (``create_latency_server_p99_s[40 pods/s]``);
    the two p99s the knee is judged on carry their SLO as threshold."""
    slos = data.get("slos") or {}
    bound = {"create_latency_server_p99_s": slos.get("mutating_p99_s"),
             "pod_startup_server_p99_s": slos.get("pod_startup_p99_s")}
    out = [common.figure("knee", "knee_pods_per_s", data.get("knee_pods_per_s"), "pods/s", headline=True)]
    for s in data.get("steps") or []:
        for key, unit in UNITS.items():
            if key in s:
                out.append(common.figure("knee", common.qualified(key, f"{s['rate']:g} pods/s"), s[key], unit,
                                         bound.get(key)))
    return out


def plot(steps: list[dict], profile, seconds: float) -> Plot:
    def line(label, key):
        return Series(label, [(s["rate"], s[key]) for s in steps if s.get(key) is not None], style="line")
    return Plot(
        title=f"Capacity knee at {profile.nodes:,} nodes: p99 latency vs steady create rate ({seconds:g} s per step)",
        xlabel="target create rate (pods/s)", ylabel="p99 latency (s)",
        series=[line("pod startup p99, object timestamps", "pod_startup_server_p99_s"),
                line("pod startup p99, as the watch saw it", "pod_startup_p99_s"),
                line("pod create p99, apiserver histogram", "create_latency_server_p99_s"),
                line("pod create p99, locust client side", "create_latency_p99_s")],
        thresholds={f"pod startup SLO ({profile.slo_pod_startup_p99_s:g} s)": profile.slo_pod_startup_p99_s,
                    f"mutating call SLO ({profile.slo_mutating_p99_s:g} s)": profile.slo_mutating_p99_s})


def main(argv: list[str]) -> int:
    ap = common.parser(__doc__, "nightly", "knee.json")
    ap.add_argument("--rates", default="10,20,40,60,80,95", help="pods/s, rising")
    ap.add_argument("--seconds", type=float, default=30, help="how long each step creates pods at its rate")
    args = ap.parse_args(argv)
    profile = common.load(args)
    try:
        rates = [float(r) for r in args.rates.split(",")]
    except ValueError as e:
        raise common.fail(e) from None
    steps = []
    with common.cluster(args, profile) as c, common.namespace(c, "knee") as ns, \
            tempfile.TemporaryDirectory(prefix="cp-bench-knee-") as tmp:
        broken_in_a_row, shared = 0, schedulable_shared_nodes(c.api, profile)
        for i, rate in enumerate(rates):
            pods = min(shared, int(rate * args.seconds))
            phase = plan.steady(profile, rate=rate, pods=pods)
            common.say(f"step {i + 1}/{len(rates)}: {pods} pods at {rate:g} pods/s")
            run = run_phase(c.api, profile, phase, ns, c.run_id, Path(tmp) / f"step-{i}")
            clear_phase(c.api, ns, c.run_id, phase)
            step = {"rate": rate, "pods": pods, "seconds": round(pods / rate, 1),
                    **{k: run.figures.to_dict().get(k) for k in KEEP},
                    "incomplete": run.incomplete, "interrupted": run.interrupted}
            step["slos_hold"] = holds(step, profile)
            steps.append(step)
            common.say(f"  create p99 {step['create_latency_server_p99_s']} s (apiserver), startup p99 "
                       f"{step['pod_startup_server_p99_s']} s (timestamps) / {step['pod_startup_p99_s']} s (watch): "
                       f"{'SLOs hold' if step['slos_hold'] else 'SLO broken'}")
            broken_in_a_row = 0 if step["slos_hold"] else broken_in_a_row + 1
            if broken_in_a_row == 2:   # past the knee twice: higher rates only break it more
                break
        head = common.header(argv, c, profile, "clusterproof.bench.knee")
    held = [s["rate"] for s in steps if s["slos_hold"]]
    data = {
        "slos": {"mutating_p99_s": profile.slo_mutating_p99_s, "pod_startup_p99_s": profile.slo_pod_startup_p99_s},
        "knee_pods_per_s": max(held) if held else None,
        "knee_means": "the highest step rate at which pod-create p99 (apiserver histogram) and pod-startup p99 "
                      "(creationTimestamp -> Ready) both held, every pod Running",
        "steps": steps,
    }
    common.write(args.out, head, figures(data), data)
    args.out.with_suffix(".png").write_bytes(plot(steps, profile, args.seconds).png())
    common.say(f"knee {data['knee_pods_per_s']} pods/s; plot {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
