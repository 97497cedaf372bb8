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


def flood_figures(run, profile) -> dict:
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
                                **{phase: fm.latency_figures(run.probe_in(phase))
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


def main(argv: list[str]) -> int:
    args = common.parser(__doc__, "smoke", "apf.json").parse_args(argv)
    if args.kubeconfig:
        raise common.fail(ValueError("clusterproof.bench.apf floods and joins nodes on the embedded cluster: "
                                     "drop --cp-kubeconfig"))
    profile = common.load(args)
    with common.cluster(args, profile) as c, tempfile.TemporaryDirectory(prefix="cp-bench-apf-") as work:
        config = apf.read_config(c.api)
        with flooded(c.api, profile, c.run_id, config, Path(work), common.say, c.namespaces, drop) as run:
            flood = flood_figures(run, profile)
            figures = plots(run, profile)
        joins = {m: r.figures() for m, r in join_both(c.api, profile, c.run_id, Path(work), common.say,
                                                                   c.namespaces).items()}
        head = common.header(argv, c, profile, "clusterproof.bench.apf")
    result = {
        **head, "overrides": args.overrides,
        "component_identities": profile.component_identities,
        "classification_after_bringup": c.apf.describe(IDENTITIES) if c.apf else {},
        "flood": flood, "node_join": joins,
    }
    common.write(args.out, result)
    args.out.with_suffix(".png").write_bytes(figures[0].png())
    print(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
