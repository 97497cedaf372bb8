"""Benchmark (not a pass/fail test): what one whole run of the suites took and cost, from that run's own records.

    ./proof run [--cp-set component_go_env={}]        # the nightly: 7,500 nodes (out/runs/<run id>/)
    python -m clusterproof.bench.nightly out/runs/<run id> [--out reports/bench/nightly.json]

Why a bench of a run: the nightly is the product's main job, and its time on two cores is the sum of
what each suite makes the control plane do. To compare two settings (the embedded components' Go
runtime, a removal of work) the same way every time, two nightlies run back to back on one machine
and each is read into a bench file; the docs put them side by side. Nothing is re-measured here: the
figures are the run's own -- its summary.json (the wall clock, each suite's time, every check's
outcome, the bring-up's Ready and schedulable times) and its api-work.json (each module's
CPU-seconds per component and each component's peak resident memory, read from ``/proc`` by
``clusterproof.cluster.apiwork``) -- and the Go runtime it ran with is the one its report's
environment records.

Figures: the suites' wall clock (pytest, bring-up included; against issue 39's 15-minute target), the
bring-up and each suite's time and CPU-seconds (control plane and harness), the checks' outcomes, the
CPU-seconds of the suites by component (and the harness with its locust) and how busy the machine's
cores were over them, and each component's peak resident memory over the run.
"""
from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

from clusterproof.bench import common
from clusterproof.cluster.apiwork import HARNESS
from clusterproof.config.profile import load_profile
from clusterproof.core import exitcodes
from clusterproof.core.errors import ArgumentParser, HarnessError
from clusterproof.core.measurement import Figure
from clusterproof.report.allure import RUN_ENV_FILE

MODULE = "clusterproof.bench.nightly"
BENCH = "nightly"
TARGET_S = 15 * 60          # issue 39: the nightly in 15 minutes on two cores
BRINGUP = "embedded cluster bring-up"
TIME = "time :: "           # the summary's figure of a suite's wall clock: "time :: <suite>"
SCALE = "suites/test_cluster_scale.py::test_mutating_api_calls_meet_the_latency_slo :: "
READY, SCHEDULABLE = "first node create -> all Ready=True", "first node create -> all schedulable"
GO_RUNTIME = "go.runtime"   # the report environment's key (clusterproof.cluster.backends)


def read_run(run: Path) -> dict:
    """What the bench keeps of a finished run (its data): the run's record, the summary's figures it reads,
    the outcomes, each module's work, the Go runtime. A missing record is bad input (one line)."""
    try:
        summary = json.loads((run / "summary.json").read_text())
        work = json.loads((run / "api-work.json").read_text())["modules"]
    except (OSError, ValueError, KeyError) as e:
        raise HarnessError(f"{run} is not a finished run of the suites with its records (summary.json, "
                           f"api-work.json): {e}; give out/runs/<run id> of a ./proof run") from None
    env = {}
    recorded = run / "allure-results" / RUN_ENV_FILE     # the report's environment as JSON
    if recorded.is_file():
        env = json.loads(recorded.read_text())
    figures = summary.get("figures") or {}
    kept = {k: f["value"] for k, f in figures.items() if k.startswith(TIME) or k.startswith(SCALE)}
    return {"run": summary["run"], "outcomes": dict(Counter(c["outcome"] for c in summary["checks"].values())),
            "figures": kept, "modules": work, "go_runtime": env.get(GO_RUNTIME),
            "cpus": os.cpu_count()}     # the records do not say the run's cores: read a run where it ran


def figures(data: dict) -> list[Figure]:
    """The bench's figures from its data (pure)."""
    def f(name, value, unit, threshold=None, op="<=", better=None, headline=False):
        return common.figure(BENCH, name, value, unit, threshold, op, better, headline)
    run, kept, modules = data["run"], data["figures"], data["modules"]
    out = [f("suites_s", run["seconds"], "s", TARGET_S, headline=True),
           f("bringup_s", kept.get(TIME + BRINGUP), "s", better="lower"),
           f("ready_s", kept.get(SCALE + READY), "s", better="lower"),
           f("schedulable_s", kept.get(SCALE + SCHEDULABLE), "s", better="lower")]
    for outcome in ("passed", "failed", "error", "xfailed", "skipped"):
        out.append(f(common.qualified("checks", outcome), data["outcomes"].get(outcome, 0), "checks", better="none"))
    for key, value in kept.items():
        if key.startswith(TIME) and key != TIME + BRINGUP:
            out.append(f(common.qualified("suite_s", key[len(TIME):]), value, "s", better="lower"))
    cpu: Counter = Counter()
    peak: dict[str, float] = {}
    for m in modules:
        cpu.update(m.get("cpu_s") or {})
        out.append(f(common.qualified("suite_cpu_s", m["suite"]), sum((m.get("cpu_s") or {}).values()), "CPU-s",
                     better="lower"))
        for name, mib in (m.get("peak_rss_mib") or {}).items():
            peak[name] = max(peak.get(name, 0), mib)
    control = sum(v for k, v in cpu.items() if k != HARNESS)
    seconds = sum(m["seconds"] for m in modules)
    out += [f("modules_s", seconds, "s", better="lower"),
            f("control_plane_cpu_s", control, "CPU-s", better="lower"),
            f(common.qualified("cpu_s", HARNESS), cpu.get(HARNESS, 0.0), "CPU-s", better="lower")]
    out += [f(common.qualified("cpu_s", k), v, "CPU-s", better="lower") for k, v in sorted(cpu.items())
            if k != HARNESS and v >= 0.05]
    if seconds and data.get("cpus"):
        out.append(f("busy_percent", 100 * (control + cpu.get(HARNESS, 0.0)) / (seconds * data["cpus"]), "%",
                     better="none"))
    out += [f(common.qualified("peak_rss", k), v * 2**20, "B", better="lower") for k, v in sorted(peak.items())]
    return out


def main(argv: list[str]) -> int:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a finished run's directory: out/runs/<run id>")
    ap.add_argument("--out", type=Path, default=common.OUT_DIR / "nightly.json")
    args = ap.parse_args(argv)
    try:
        data = read_run(args.run)
        profile = load_profile(data["run"].get("profile") or "nightly", [])
    except HarnessError as e:
        raise common.fail(e) from None
    context = common.header(argv, None, profile, MODULE)
    r = data["run"]
    context["date"] = r.get("finished") or context["date"]     # when the run measured it, not when it was read
    context["machine"].pop("loadavg_1m_at_end", None)          # the load while reading it says nothing of the run
    context["cluster"] = {"backend": r.get("backend"), "nodes": r.get("nodes"), "server": r.get("kubernetes"),
                          "simulated": r.get("simulated"), "go_runtime": data["go_runtime"]}
    context["run"] = {k: r.get(k) for k in ("id", "commit", "dirty", "started", "finished", "pytest_exit")}
    common.write(args.out, context, figures(data), data)
    if r.get("pytest_exit") != 0:
        common.say(f"run {r.get('id')} ended with pytest's exit {r.get('pytest_exit')}: its figures are a red run's")
    return exitcodes.OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
