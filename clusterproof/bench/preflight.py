"""Benchmark (not a pass/fail test): GPU preflight at scale -- time to quarantine, checker cost, API load.

Writes ``reports/bench/preflight.json`` (and ``preflight.png``, the time from
join to decision per node, with its data in the JSON):

- the checker's own cost, without a cluster: ``--machines`` simulated
  machines (default 7,500, 2 % of them faulty) checked by one process
  against the mock NVML library, against one process per machine (measured
  on a sample and projected) -- why the agent checks in-process;
- on an embedded cluster of ``nodes`` (``--cp-set nodes=1000``): the suite's two
  phases (``clusterproof/preflight/phases.py``) with the reference agent --
  ``preflight_join_nodes`` nodes join (``preflight_fault_fraction`` faulty):
  time from join to quarantine / release (distribution); then
  ``preflight_inservice_faults`` nodes go bad in service: time to cordon and
  drain per node, the waves the cap makes;
- the API load of preflight and remediation: the agent's own requests by
  verb and resource (it counts them), per node decided and per node
  remediated, and the apiserver's request counters over the same windows
  (``apiserver_request_total``, everything the control plane did).

    python -m clusterproof.bench.preflight [--cp-profile smoke] [--cp-set key=value ...] [--machines 7500]
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from clusterproof.bench import common
from clusterproof.core.attachment import drop
from clusterproof.core.stats import seconds
from clusterproof.kube import apimetrics
from clusterproof.preflight.contract import Marks
from clusterproof.preflight.mock_nvml import FAULTS, FaultFile, checker_env, library_dir, plan_faults, run_checker
from clusterproof.preflight.phases import go_bad_in_service, settle_join
from clusterproof.preflight.run import PreflightRun, remove_waiting_workloads, setup_simulated, teardown
from clusterproof.report.plots import Plot, Series

REQUESTS = "apiserver_request_total"
QUANTILES = (50, 90, 99)    # each time distribution of the join and in-service phases


def checker_cost(machines: int, sample: int = 20) -> dict:
    """One process for all machines vs one process per machine (a sample, projected)."""
    lib = library_dir()
    with tempfile.TemporaryDirectory(prefix="cp-bench-preflight-") as tmp:
        names = [f"m-{i:05d}" for i in range(machines)]
        ff = FaultFile(Path(tmp) / "faults.json")
        ff.set({n: k for n, k in plan_faults(names, 0.02).items() if k})
        env = checker_env(ff.path, lib)
        t0 = time.monotonic()
        run = run_checker(names, env, "--expect-gpus", "8", "--xid-window-ms", "0", timeout=3600)
        batch = time.monotonic() - t0
        wrong = [n for n in names if run.verdicts.get(n, {}).get("code") != ff.expected_code(n)]
        t0 = time.monotonic()
        for n in names[:sample]:
            run_checker([n], env, "--expect-gpus", "8", "--xid-window-ms", "0")
        per_process = (time.monotonic() - t0) / sample
    return {"machines": machines, "faulty": sum(1 for n in names if ff.expected_code(n)),
            "one_process_s": round(batch, 2), "per_machine_ms": round(1000 * batch / machines, 3),
            "wrong_verdicts": len(wrong),
            "process_per_machine_s": round(per_process, 3), "process_per_machine_sample": sample,
            "process_per_machine_projected_s": round(per_process * machines, 1),
            "note": "xid window 0 (the agent holds each verdict for the window instead of sleeping it)"}


def request_counts(text: str) -> dict[str, float]:
    """apiserver_request_total summed by 'VERB resource[/subresource]'."""
    out: dict[str, float] = {}
    for (verb, resource, sub), v in apimetrics.counters(text, REQUESTS, ("verb", "resource", "subresource")).items():
        key = f"{verb} {resource}" + (f"/{sub}" if sub else "")
        out[key] = out.get(key, 0.0) + v
    return out


def delta(after: dict, before: dict, top: int = 15) -> dict:
    d = {k: int(v - before.get(k, 0)) for k, v in after.items() if v - before.get(k, 0) > 0}
    return dict(sorted(d.items(), key=lambda kv: -kv[1])[:top]) | {"total": sum(d.values())}


def agent_delta(after: dict, before: dict) -> dict:
    d = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}
    return dict(sorted(d.items(), key=lambda kv: -kv[1])) | {"total": sum(d.values())}


def figures(data: dict) -> list[common.Figure]:
    """The checker's cost, the join's and the in-service phase's figures (each time distribution as its p50,
    p99 and count: ``join_to_quarantine_p99_s``, ``join_to_quarantine_n``), and their API load."""
    f = lambda name, value, unit: common.figure("preflight", name, value, unit)  # noqa: E731
    c, j, s = data.get("checker") or {}, data.get("join") or {}, data.get("in_service") or {}
    out = [f(f"checker_{k}", c.get(k), unit) for k, unit in (
        ("machines", "machines"), ("faulty", "machines"), ("one_process_s", "s"), ("per_machine_ms", "ms"),
        ("wrong_verdicts", "verdicts"), ("process_per_machine_s", "s"), ("process_per_machine_sample", "machines"),
        ("process_per_machine_projected_s", "s"))]
    out += [f(f"join_{k}", j.get(k), unit) for k, unit in (
        ("nodes", "nodes"), ("faulty", "nodes"), ("created_and_ready_s", "s"), ("all_decided_s", "s"),
        ("agent_requests_per_decided_node", "requests"), ("agent_check_ms", "ms"))]
    out += [f("join_fault_kinds", len(j.get("fault_kinds") or []), "kinds"),
            f("join_apiserver_requests", (j.get("apiserver_requests") or {}).get("total"), "requests")]
    out += [f(f"in_service_{k}", s.get(k), unit) for k, unit in (
        ("faults", "nodes"), ("cap", "nodes"), ("most_out_at_once", "nodes"), ("replicas_under_pdb", "pods"),
        ("fewest_ready", "pods"), ("evictions_refused_429", "evictions"),
        ("agent_requests_per_remediated_node", "requests"), ("sweep_nodes_last", "nodes"), ("sweep_s_last", "s"))]
    out += [f(common.qualified("in_service_wave_nodes", i), n, "nodes") for i, n in enumerate(s.get("waves") or [], 1)]
    out.append(f("in_service_apiserver_requests", (s.get("apiserver_requests") or {}).get("total"), "requests"))
    for phase, name, key in (("join", "join_to_quarantine", "time_to_quarantine"),
                             ("join", "join_to_release", "time_to_release"),
                             ("in_service", "fault_to_cordoned", "time_to_cordon"),
                             ("in_service", "fault_to_drained", "time_to_drained")):
        d = (data.get(phase) or {}).get(key) or {}
        out += [f(f"{name}_p50_s", d.get("p50_s"), "s"), f(f"{name}_p99_s", d.get("p99_s"), "s"),
                f(f"{name}_n", d.get("n"), "nodes")]
    return out


def main(argv: list[str]) -> int:
    ap = common.parser(__doc__, "smoke", "preflight.json")
    ap.add_argument("--machines", type=int, default=7500, help="simulated machines for the checker's own cost")
    args = ap.parse_args(argv)
    if args.kubeconfig:
        raise common.fail(ValueError("clusterproof.bench.preflight plays the agent on simulated nodes: "
                                     "drop --cp-kubeconfig"))
    profile, say = common.load(args), common.say
    say(f"checker: {args.machines} simulated machines in one process vs a process each")
    cost = checker_cost(args.machines)
    say(f"checker: {cost['one_process_s']} s in one process ({cost['per_machine_ms']} ms each); a process per "
        f"machine {cost['process_per_machine_s']} s each -> {cost['process_per_machine_projected_s']} s")
    with common.cluster(args, profile) as c:
        api, run_id = c.api, c.run_id
        run = PreflightRun(Marks.from_profile(profile), True, agent_kind="harness", description="bench")
        try:
            m0 = request_counts(apimetrics.scrape(api, (REQUESTS,)))
            t0 = time.monotonic()
            setup_simulated(api, c, run, profile, run_id, None, say)
            created_s = time.monotonic() - t0
            join = settle_join(api, run, profile.preflight_quarantine_timeout_s)
            join_s = time.monotonic() - t0
            say(f"join: {len(join.decided_s)} nodes decided, {len(join.problems)} problem(s)")
            joined = {"nodes": len(run.names), "faulty": sum(1 for n in run.names if run.faults.expected_code(n)),
                      "fault_kinds": sorted({k for k in run.plan.values() if k in FAULTS})}
            remove_waiting_workloads(api, run, run_id)
            s1, m1 = run.agent.status(), request_counts(apimetrics.scrape(api, (REQUESTS,)))
            with common.namespace(c, "preflight") as ns:
                t1 = time.monotonic()
                ins = go_bad_in_service(api, run, profile, ns, run_id)
                ins_s = time.monotonic() - t1
            s2, m2 = run.agent.status(), request_counts(apimetrics.scrape(api, (REQUESTS,)))
        finally:
            teardown(api, run, run_id, drop)
        say(f"in service: waves {[len(w) for w in ins.waves]}, {len(ins.problems)} problem(s)")
        decided = len(join.decided_s)
        join_agent = agent_delta(s1["requests"], {})
        ins_agent = agent_delta(s2["requests"], s1["requests"])
        sweeps = s2.get("sweeps") or []
        head = common.header(argv, c, profile, "clusterproof.bench.preflight")
        data = {
            "gpus": "simulated: go-nvml mock DGX H100 machines through the project's libnvidia-ml.so.1 (real pynvml)",
            "checker": cost,
            "join": {**joined, "xid_window_ms": profile.preflight_xid_window_ms,
                     "created_and_ready_s": round(created_s, 1), "all_decided_s": round(join_s, 1),
                     "time_to_quarantine": seconds(join.quarantine_s, QUANTILES),
                     "time_to_release": seconds(join.release_s, QUANTILES),
                     "problems": join.problems[:20],
                     "agent_checks": s1.get("checks"),
                     "agent_check_ms": (round(1000 * s1["check_seconds"] / s1["checks"], 3)
                                        if s1.get("checks") else None),
                     "agent_requests": join_agent,
                     "agent_requests_per_decided_node": round(join_agent["total"] / decided, 2) if decided else None,
                     "apiserver_requests": delta(m1, m0)},
            "in_service": {"faults": len(ins.victims), "cap": profile.preflight_max_unavailable,
                           "replicas_under_pdb": ins.replicas, "waves": [len(w) for w in ins.waves],
                           "most_out_at_once": ins.most_out, "fewest_ready": ins.fewest_ready,
                           "time_to_cordon": seconds(ins.cordon_s, QUANTILES),
                           "time_to_drained": seconds(ins.drained_s, QUANTILES),
                           "phase_s": round(ins_s, 1),
                           "active_period_s": profile.preflight_active_period_s,
                           "sweep_s_last": sweeps[-1]["seconds"] if sweeps else None,
                           "sweep_nodes_last": sweeps[-1]["nodes"] if sweeps else None,
                           "evictions_refused_429": sum(d["refused_429"] for d in s2.get("drains", {}).values()),
                           "problems": ins.problems[:20],
                           "agent_requests": ins_agent,
                           "agent_requests_per_remediated_node": round(ins_agent["total"] / len(ins.victims), 1)
                           if ins.victims else None,
                           "apiserver_requests": delta(m2, m1)},
            "decision_s_per_node": {n: round(t, 3) for n, t in sorted(join.decided_s.items())},
        }
    common.write(args.out, head, figures(data), data)
    order = {n: i for i, n in enumerate(run.names)}
    faulty_at_join = {n for n in run.names if run.plan.get(n) in FAULTS and n not in ins.victims}
    plot = Plot(f"GPU preflight: join to decision, {len(run.names)} joining nodes ({profile.nodes}-node cluster)",
                "node (join order)", "time from join to decision (s)",
                [Series(label, [(order[n], t) for n, t in join.decided_s.items()
                                if (n in faulty_at_join) == faulty])
                 for label, faulty in (("faulty: quarantined", True), ("healthy: released", False))],
                {f"bound (preflight_quarantine_timeout_s = {profile.preflight_quarantine_timeout_s} s)":
                 profile.preflight_quarantine_timeout_s})
    args.out.with_suffix(".png").write_bytes(plot.png())
    say(f"quarantine p99 {data['join']['time_to_quarantine']['p99_s']} s, release p99 "
        f"{data['join']['time_to_release']['p99_s']} s, agent {join_agent['total']} requests for {decided} nodes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
