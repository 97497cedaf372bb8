"""Benchmark (not a pass/fail test): API Priority and Fairness under a locust flood and a node-join storm.

Brings the embedded cluster up (every component with its own identity,
clusterproof/cluster/identities.py), then measures exactly what suites/test_api_overload.py
checks, with the same code (``clusterproof.apf.overload.flooded``,
``clusterproof.apf.joinstorm.join_both``), and writes ``reports/bench/apf.json``:

- the flood: requests and 429s per client kind (honouring Retry-After or
  retrying at once), 429s per second per flow schema (the apiserver's
  counters), the Retry-After values seen, objects lost;
- the well-behaved client (another flow): latency before, during and after
  the flood, and how long the recovery took;
- node heartbeats: the most overdue lease renewal during the flood;
- the node-join storm, paced and all at once: join latency and 429s, time to
  all Ready, the well-behaved client's latency meanwhile, existing nodes
  that turned NotReady.

and ``reports/bench/apf.png`` (429s per second by flow schema).

    python -m clusterproof.bench.apf [--cp-profile smoke] [--cp-set nodes=1000 ...]
"""
from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path

from clusterproof.apf import flood as fm
from clusterproof.apf.joinstorm import join_both
from clusterproof.apf.overload import flooded, plots
from clusterproof.bench import common
from clusterproof.cluster.identities import IDENTITIES
from clusterproof.core.attachment import drop
from clusterproof.kube import flowcontrol as apf


def flood_data(run, profile) -> dict:
    span = max(1e-9, run.phases.flood_end - run.phases.flood)
    per_fs: dict[str, float] = {}
    for (fs, _pl, _reason), v in run.rejected_delta().items():
        per_fs[fs] = per_fs.get(fs, 0.0) + v
    kinds = {}
    for kind in ("honouring", "impatient"):
        k = run.summary.get(kind, {})
        r429 = k.get("responses", {}).get("status 429", 0)
        kinds[kind] = {"planned": k.get("planned"), "created": k.get("created"),
                       "exist_at_end": len(run.existing_pods.get(kind, [])), "responses": k.get("responses"),
                       "responses_429": r429,
                       "responses_429_per_created_pod": round(r429 / max(1, k.get("created", 0)), 2),
                       "retry_after_s": k.get("retry_after_s"),
                       "seconds_flood_start_to_last_create": k.get("last_create_s")}
    late = max((s.late_s for s in run.leases if run.phases.flood <= s.t <= run.phases.end), default=None)
    return {
        "flow": {"flow_schema": run.flow.schema, "priority_level": run.flow.level, "type": run.flow.level_type,
                 "nominal_concurrency_shares": profile.apf_flood_shares,
                 "limit_response": "Reject" if not profile.apf_flood_queues else "Queue"},
        "users": profile.apf_flood_users, "noise_seconds": profile.apf_flood_s,
        "flood_seconds": round(span, 1), "clients": kinds,
        "rejected_per_second_by_flow_schema": {fs: round(v / span, 1) for fs, v in sorted(per_fs.items())},
        "rejected_by_flow_schema": {fs: int(v) for fs, v in sorted(per_fs.items())},
        "apiserver_5xx": {"/".join(k): int(v) for k, v in run.server_errors().items()},
        "well_behaved_client": {"flow": f"{run.probe_class[0]} -> {run.probe_class[1]}",
                                **{phase: fm.latency_figures(run.probe_in(phase)).to_dict()
                                   for phase in ("baseline", "flood", "recovery")}},
        "seconds_flood_end_to_recovered": (None if run.phases.recovered is None
                                           else round(run.phases.recovered - run.phases.flood_end, 1)),
        "recovery": run.recovery_note,
        "probe_pods_started": sum(p.startup_server_s is not None for p in run.probe_pods),
        "probe_pod_startup_p99_s": max((p.startup_server_s for p in run.probe_pods
                                        if p.startup_server_s is not None), default=None),
        "most_overdue_lease_renewal_s": late,
        "nodes_not_ready": run.flapped,
    }


# "kube-controller-manager -> workload-high: 194 requests; ..." (the cluster's APF description of a component)
_CLASSIFIED = re.compile(r"([^;]+?) -> ([^:;]+): (\d+) requests")
PHASES = ("baseline", "flood", "recovery")


def figures(data: dict) -> list[common.Figure]:
    """The flood's and the join storm's figures (a client kind, a phase of the well-behaved client or a join
    mode qualifies its figures: ``created[honouring]``, ``well_behaved_p99_s[flood]``,
    ``join_latency_p99_s[storm]``) and the requests APF classified per component after bring-up."""
    f = lambda name, value, unit: common.figure("apf", name, value, unit)  # noqa: E731
    q = common.qualified
    fl = data.get("flood") or {}
    flow = fl.get("flow") or {}
    own = flow.get("flow_schema")
    rejected, per_s = fl.get("rejected_by_flow_schema") or {}, fl.get("rejected_per_second_by_flow_schema") or {}
    out = [f("flood_users", fl.get("users"), "users"), f("flood_noise_s", fl.get("noise_seconds"), "s"),
           f("flood_seconds", fl.get("flood_seconds"), "s"),
           f("flood_level_shares", flow.get("nominal_concurrency_shares"), "shares"),
           f("flood_level_rejects", flow.get("limit_response") == "Reject", "bool"),
           f("flood_429_own_flow_schema", rejected.get(own, 0), "responses"),
           f("flood_429_per_s_own_flow_schema", per_s.get(own, 0.0), "1/s"),
           f("flood_429_other_flow_schemas", sum(v for k, v in rejected.items() if k != own), "responses"),
           f("flood_apiserver_5xx", sum((fl.get("apiserver_5xx") or {}).values()), "responses")]
    for kind, c in (fl.get("clients") or {}).items():
        out += [f(q("planned", kind), c.get("planned"), "pods"), f(q("created", kind), c.get("created"), "pods"),
                f(q("responses_429_per_created_pod", kind), c.get("responses_429_per_created_pod"), ""),
                f(q("seconds_flood_start_to_last_create", kind), c.get("seconds_flood_start_to_last_create"), "s")]
    seen: dict[int, int] = {}
    for c in (fl.get("clients") or {}).values():
        for r, n in (c.get("retry_after_s") or {}).items():
            seen[int(r)] = seen.get(int(r), 0) + n
    out += [f(q("retry_after_responses", f"{r} s"), seen[r], "responses") for r in sorted(seen)]
    wb = fl.get("well_behaved_client") or {}
    out += [f(q("well_behaved_p99_s", ph), (wb.get(ph) or {}).get("p99_s"), "s") for ph in PHASES if ph in wb]
    out += [f("well_behaved_429", sum((wb.get(ph) or {}).get("responses_429", 0) for ph in PHASES), "responses"),
            f("probe_pods_started", fl.get("probe_pods_started"), "pods"),
            f("probe_pod_startup_p99_s", fl.get("probe_pod_startup_p99_s"), "s"),
            f("most_overdue_lease_renewal_s", fl.get("most_overdue_lease_renewal_s"), "s"),
            f("nodes_not_ready", len(fl.get("nodes_not_ready") or []), "nodes"),
            f("seconds_flood_end_to_recovered", fl.get("seconds_flood_end_to_recovered"), "s")]
    for mode, j in (data.get("node_join") or {}).items():
        wbj = j.get("well_behaved_client") or {}
        out += [f(q(k, mode), j.get(k.removeprefix("join_") if k == "join_nodes" else k), unit) for k, unit in (
            ("join_nodes", "nodes"), ("join_latency_p50_s", "s"), ("join_latency_p99_s", "s"),
            ("seconds_to_register_all", "s"), ("seconds_to_all_ready", "s"), ("join_429", "responses"),
            ("join_5xx", "responses"))]
        out += [f(q("existing_nodes_not_ready", mode), len(j.get("existing_nodes_not_ready") or []), "nodes"),
                f(q("join_well_behaved_p99_s", mode), wbj.get("p99_s"), "s"),
                f(q("join_well_behaved_mutating_p99_s", mode), wbj.get("mutating_p99_s"), "s")]
        for cls, n in (j.get("join_classification") or {}).items():
            name = cls.replace("flowschemas/", "").replace("prioritylevelconfigurations/", "")
            out.append(f(q(f"join_requests_classified {name}", mode), n, "requests"))
    for component, text in (data.get("classification_after_bringup") or {}).items():
        out += [f(f"requests_classified {component}: {fs.strip()} -> {pl.strip()}", int(n), "requests")
                for fs, pl, n in _CLASSIFIED.findall(text)]
    return out


def main(argv: list[str]) -> int:
    args = common.parser(__doc__, "smoke", "apf.json").parse_args(argv)
    if args.kubeconfig:
        raise common.fail(ValueError("clusterproof.bench.apf floods and joins nodes on the embedded cluster: "
                                     "drop --cp-kubeconfig"))
    profile = common.load(args)
    with common.cluster(args, profile) as c, tempfile.TemporaryDirectory(prefix="cp-bench-apf-") as work:
        config = apf.read_config(c.api)
        with flooded(c.api, profile, c.run_id, config, Path(work), common.say, c.namespaces, drop) as run:
            flood = flood_data(run, profile)
            plotted = plots(run, profile)
        joins = {m: r.figures().to_dict() for m, r in join_both(c.api, profile, c.run_id, Path(work), common.say,
                                                                   c.namespaces).items()}
        head = {**common.header(argv, c, profile, "clusterproof.bench.apf"), "overrides": args.overrides}
    data = {
        "component_identities": profile.component_identities,
        "classification_after_bringup": c.apf.describe(IDENTITIES) if c.apf else {},
        "flood": flood, "node_join": joins,
    }
    common.write(args.out, head, figures(data), data)
    args.out.with_suffix(".png").write_bytes(plotted[0].png())
    print(json.dumps(data, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
