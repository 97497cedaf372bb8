"""``clusterproof``: the jobs that are not a pytest run, and the suites from the installed package.

    clusterproof run [PYTEST ARGS]       the shipped suites (pytest --pyargs clusterproof.suites)
    clusterproof bench NAME [ARGS]       a benchmark: apf, bringup, burst, knee, kueue, nightly (a finished
                                         run's records), preflight, prometheus, watch_bandwidth
    clusterproof compare [ARGS]          a run's summary against a baseline
    clusterproof upgrade [ARGS]          the same profile at two Kubernetes versions, compared
    clusterproof sweep                   remove every embedded cluster a dead run left
    clusterproof toolchain [ARGS]        build the upstream binaries from their Go modules (cached)
    clusterproof prepare [RUN ARGS]      build only what a run with these arguments uses (./proof run does)
    clusterproof doctor [RUN ARGS]       what a run with these arguments needs from this machine, present or missing
    clusterproof prom-history [ARGS]     build the embedded Prometheus's backfilled history
    clusterproof images [ARGS]           build the real nodes' container images (root)
    clusterproof rbac [--destructive]    print the RBAC manifest a cluster's admins apply for the harness
    clusterproof profile --from-cluster [--cp-kubeconfig K] [-o FILE]   a profile read from a cluster's nodes
    clusterproof architecture            print the map of the tree (docs/architecture.md)
    clusterproof bench-tables [--write|--check]  the docs' figures tables, from reports/bench/*.json
    clusterproof load-worker --master HOST:PORT --locustfile burst|flood   a locust worker joining a run's master
    clusterproof --version               this clusterproof's version

Each job is the module named below, run as ``python -m``; its own ``--help``
says the rest. Exit codes are the job's own, from the one table (``clusterproof.core.exitcodes``,
docs/exit-codes.md): 4 bad input (doctor: a prerequisite missing), 6 a regression, 8 a set-up job's failed build.
"""
from __future__ import annotations

import runpy
import sys
from pathlib import Path

from clusterproof.core import exitcodes

JOBS = {
    "upgrade": "clusterproof.upgrade",
    "sweep": "clusterproof.cluster.kwok",
    "toolchain": "clusterproof.provision.toolchain",
    "prepare": "clusterproof.prepare",
    "doctor": "clusterproof.doctor",
    "prom-history": "clusterproof.prometheus.history",
    "images": "clusterproof.provision.images",
    "host-packages": "clusterproof.provision.hostpkgs",
    "architecture": "clusterproof.architecture",
    "load-worker": "clusterproof.core.loadworker",
    "profile": "clusterproof.cluster.site_profile",
}
BENCHES = ("apf", "bringup", "burst", "knee", "kueue", "nightly", "preflight", "prometheus", "watch_bandwidth")


def _usage(message: str) -> int:
    print(f"clusterproof: {message} (see clusterproof --help)", file=sys.stderr)
    return exitcodes.USAGE


def _run_module(module: str, argv: list[str]) -> int:
    sys.argv = [module, *argv]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def _compare(argv: list[str]) -> int:
    """``clusterproof compare BASELINE CANDIDATE``: the comparison outside a run (tolerances from a profile)."""
    import json

    from clusterproof.config.profile import load_profile
    from clusterproof.core.errors import ArgumentParser, HarnessError
    from clusterproof.report.compare import REGRESSION_EXIT, SummaryError, Tolerance, compare, load, text_report
    ap = ArgumentParser(prog="clusterproof compare",
                                 description="Compare a clusterproof summary with a baseline (exit 6 on a regression).")
    ap.add_argument("baseline", help="a summary.json of an earlier run (out/runs/<run id>/summary.json), "
                                     "or a folder of them")
    ap.add_argument("candidate", help="the summary to judge (default tolerances from its profile)")
    ap.add_argument("--cp-profile", "--profile", dest="profile", default=None,
                    help="take the tolerances from this profile (default: the candidate's)")
    ap.add_argument("--json", default=None, help="also write the comparison here")
    a = ap.parse_args(argv)
    try:
        base, now = load(a.baseline), load(a.candidate)
        try:
            profile = load_profile(a.profile or now.get("run", {}).get("profile") or "smoke", [])
        except HarnessError as e:
            raise SummaryError(str(e)) from None
        c = compare(base, now, Tolerance.of(profile))
    except SummaryError as e:
        print(f"clusterproof: {e}", file=sys.stderr)
        return exitcodes.USAGE
    print(text_report(c))
    if a.json:
        Path(a.json).write_text(json.dumps(c.to_json(), indent=2))
    return REGRESSION_EXIT if c.regressed else 0


def _bench_tables(argv: list[str]) -> int:
    """``clusterproof bench-tables``: print the docs' figures tables from the bench JSON, or rewrite them."""
    import argparse

    from clusterproof.report import benchtables
    checkout = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(
        prog="clusterproof bench-tables",
        description="The figures tables of docs/ (between <!-- bench-tables: NAME --> markers), printed from "
                    "reports/bench/*.json. Exit 1 with --check when a committed table is stale.")
    ap.add_argument("names", nargs="*", help="only these tables (default: every one)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the marked tables in docs/**.md in place")
    mode.add_argument("--check", action="store_true", help="say which committed tables differ (exit 1)")
    ap.add_argument("--bench-dir", type=Path, default=checkout / "reports" / "bench")
    ap.add_argument("--docs-dir", type=Path, default=checkout / "docs")
    a = ap.parse_args(argv)
    try:
        if not a.bench_dir.is_dir():
            raise benchtables.BenchTablesError(f"no bench figures at {a.bench_dir} (a checkout's reports/bench; "
                                               f"--bench-dir names another)")
        if a.write or a.check:
            if not a.docs_dir.is_dir():
                raise benchtables.BenchTablesError(f"no docs at {a.docs_dir} (--docs-dir names another)")
            if a.check:
                problems = benchtables.stale(a.docs_dir, a.bench_dir)
                for p in problems:
                    print(p, file=sys.stderr)
                return 1 if problems else 0
            for page in benchtables.write(a.docs_dir, a.bench_dir):
                print(f"clusterproof: rewrote the tables in {page}", file=sys.stderr)
            return 0
        print(benchtables.printed(a.bench_dir, a.names))
    except benchtables.BenchTablesError as e:
        print(f"clusterproof: {e}", file=sys.stderr)
        return 4
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(__doc__.strip())
        return 0
    if args[0] in ("-V", "--version"):
        from clusterproof import __version__
        print(f"clusterproof {__version__}")
        return 0
    job, rest = args[0], args[1:]
    if job == "run":     # pytest's own command line (only fixtures/ and the suites import pytest)
        return _run_module("pytest", ["--pyargs", "clusterproof.suites", *rest])
    if job == "bench":
        if not rest or rest[0] not in BENCHES:
            return _usage(f"bench needs one of: {', '.join(BENCHES)}")
        return _run_module(f"clusterproof.bench.{rest[0]}", rest[1:])
    if job == "compare":
        return _compare(rest)
    if job == "bench-tables":
        return _bench_tables(rest)
    if job == "rbac":
        name = "rbac-destructive.yaml" if "--destructive" in rest else "rbac.yaml"
        sys.stdout.write((Path(__file__).resolve().parent / "kube" / name).read_text())
        return 0
    if job == "sweep":
        return _run_module(JOBS[job], ["--sweep-all", *rest])
    if job in JOBS:
        return _run_module(JOBS[job], rest)
    return _usage(f"unknown job {job!r}")


if __name__ == "__main__":
    sys.exit(main())
