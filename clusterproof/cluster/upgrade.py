"""Pre-upgrade validation: the same profile on an embedded cluster at two Kubernetes versions.

Why: before an upgrade an SRE wants to know what the new version changes in
the behaviour and figures this harness checks -- the report attached to the
upgrade ticket. ``make upgrade-check FROM=v1.34.4 TO=v1.35.4 PROFILE=smoke``
runs the suites at FROM, then at TO with ``--baseline`` set to FROM's
summary, one after the other (never at the same time: both would share two
cores). Each version's control plane is built once and cached.

What it leaves: ``reports/upgrade/<FROM>/`` (the FROM run's summary and Allure
results), ``reports/summary.json`` and ``reports/comparison.json`` (the TO
run, compared), the TO run's Allure results in ``reports/allure-results``
with the comparison as a result of its own (``make report``), and
``reports/upgrade/comparison.txt`` (the table for the ticket).

Exit status: TO's run's (1 a check failed at TO, 6 the checks passed but a
figure regressed or a check flipped to failing) or 2 for a harness error.
A check that fails at FROM only is a finding the table lists, not an error.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from clusterproof.cluster import toolchain
from clusterproof.core.errors import HarnessError
from clusterproof.config.profile import load_profile
from clusterproof.report import compare

ROOT = Path.cwd()
OUT = ROOT / "reports" / "upgrade"
RESULTS = ROOT / "reports" / "allure-results"


def pytest_cmd(version: str, profile: str, summary: Path, alluredir: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "suites", "--profile", profile, f"--set=kubernetes_version={version}",
            f"--summary={summary}", f"--alluredir={alluredir}", *extra]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m clusterproof.cluster.upgrade",
                                 description="Run PROFILE at FROM, then at TO compared with FROM.")
    ap.add_argument("--from", dest="old", required=True, help="the version the cluster runs now, e.g. v1.34.4")
    ap.add_argument("--to", dest="new", required=True, help="the version it is upgraded to, e.g. v1.35.4")
    ap.add_argument("--profile", default="smoke")
    ap.add_argument("extra", nargs="*", help="more pytest arguments for both runs (after --)")
    a = ap.parse_args(argv)
    try:
        for v in (a.old, a.new):
            load_profile(a.profile, [f"kubernetes_version={v}"])   # a bad version or profile: one line, now
        if a.old == a.new:
            raise HarnessError(f"FROM and TO are both {a.old}: name two versions (e.g. FROM=v1.34.4 TO=v1.35.4)")
        for v in (a.old, a.new):   # both builds first: a version the proxy lacks ends it before any run
            toolchain.ensure(toolchain.kubernetes(v), progress=lambda m: print(m, flush=True))
    except HarnessError as e:
        print(f"clusterproof: {e}", file=sys.stderr)
        return 2
    old_dir = OUT / a.old
    shutil.rmtree(old_dir, ignore_errors=True)
    old_dir.mkdir(parents=True)
    old_summary = old_dir / "summary.json"
    print(f"upgrade-check 1/2: profile {a.profile} on Kubernetes {a.old}", flush=True)
    first = subprocess.run(pytest_cmd(a.old, a.profile, old_summary, old_dir / "allure-results", a.extra), cwd=ROOT)
    if not old_summary.exists():
        print(f"clusterproof: the run at {a.old} ended (exit {first.returncode}) before it wrote a summary: "
              "see its output above", file=sys.stderr)
        return 2
    print(f"upgrade-check 2/2: profile {a.profile} on Kubernetes {a.new}, compared with {a.old}", flush=True)
    new_summary = ROOT / "reports" / "summary.json"
    second = subprocess.run(pytest_cmd(a.new, a.profile, new_summary, RESULTS,
                                       [f"--baseline={old_summary}", *a.extra]), cwd=ROOT)
    comparison = ROOT / "reports" / "comparison.json"
    if not comparison.exists():
        print(f"clusterproof: the run at {a.new} ended (exit {second.returncode}) before it compared: "
              "see its output above", file=sys.stderr)
        return 2
    c = json.loads(comparison.read_text())
    shutil.copy(comparison, OUT / "comparison.json")
    table = compare.text_table(compare.Comparison.from_json(c))
    (OUT / "comparison.txt").write_text(table + "\n")
    print(f"\nupgrade-check {a.old} -> {a.new} (profile {a.profile}): {c['headline']}\n"
          f"exit at {a.old}: {first.returncode}, at {a.new}: {second.returncode}; table: {OUT / 'comparison.txt'}; "
          "report: make report", flush=True)
    return second.returncode


if __name__ == "__main__":
    sys.exit(main())
