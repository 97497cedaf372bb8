"""Pre-upgrade validation: the same profile on an embedded cluster at two Kubernetes versions.

Why: before an upgrade an SRE wants to know what the new version changes in
the behaviour and figures this harness checks -- the report attached to the
upgrade ticket. ``make upgrade-check FROM=v1.36.3 TO=v1.37.2 PROFILE=smoke``
runs the suites at FROM, then at TO with ``--cp-baseline`` set to FROM's
summary, one after the other (never at the same time: both would share two
cores). Each version's control plane is built once and cached.

What it leaves, in the output directory (``clusterproof.core.outputs``): two
runs, ``out/runs/<id>-from/`` (the FROM run's summary and Allure results) and
``out/runs/<id>-to/`` (the TO run: its summary, ``comparison.json`` against
FROM, its Allure results with the comparison as a result of its own --
``./proof report`` builds it, being the latest run -- and ``upgrade.txt``, the
table for the ticket).

Exit status (the one table: docs/exit-codes.md): TO's run's (1 a check failed
at TO, 6 the checks passed but a figure regressed or a check flipped to
failing); 4 bad input (a version or profile, one line); 8 a version's control
plane could not be built; a run that ended before it wrote what the next step
reads (FROM's summary, TO's comparison): that run's own code (4 if it had none).
A check that fails at FROM only is a finding the table lists, not an error.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from clusterproof.config.profile import load_profile
from clusterproof.core import exitcodes, outputs
from clusterproof.core.errors import ArgumentParser, HarnessError
from clusterproof.core.run import new_run_id
from clusterproof.provision import toolchain
from clusterproof.report import compare

ROOT = Path.cwd()


def pytest_cmd(version: str, profile: str, run: outputs.RunOutputs, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "suites", "--cp-profile", profile, f"--cp-set=kubernetes_version={version}",
            f"--cp-run-id={run.run_id}", f"--cp-output-dir={run.base}", *extra]


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m clusterproof.upgrade",
                                 description="Run PROFILE at FROM, then at TO compared with FROM.")
    ap.add_argument("--from", dest="old", required=True, help="the version the cluster runs now, e.g. v1.36.3")
    ap.add_argument("--to", dest="new", required=True, help="the version it is upgraded to, e.g. v1.37.2")
    ap.add_argument("--cp-profile", "--profile", dest="profile", default="smoke")   # a run's spellings, both
    ap.add_argument("extra", nargs="*", help="more pytest arguments for both runs (after --)")
    a = ap.parse_args(argv)
    try:
        for v in (a.old, a.new):
            load_profile(a.profile, [f"kubernetes_version={v}"])   # a bad version or profile: one line, now
        if a.old == a.new:
            raise HarnessError(f"FROM and TO are both {a.old}: name two versions (e.g. FROM=v1.36.3 TO=v1.37.2)")
    except HarnessError as e:
        print(f"clusterproof: {e}", file=sys.stderr)
        return exitcodes.USAGE
    try:
        for v in (a.old, a.new):   # both builds first: a version the proxy lacks ends it before any run
            for c in (toolchain.kubernetes(v), toolchain.kubelet(v)):
                toolchain.ensure(c, progress=lambda m: print(m, flush=True))
    except HarnessError as e:
        print(f"clusterproof: {e}", file=sys.stderr)
        return exitcodes.SETUP_FAILED
    job = new_run_id()
    old, new = outputs.for_run(f"{job}-from"), outputs.for_run(f"{job}-to")
    old_summary = old.summary
    print(f"upgrade-check 1/2: profile {a.profile} on Kubernetes {a.old} (outputs: {old.shown()})", flush=True)
    first = subprocess.run(pytest_cmd(a.old, a.profile, old, a.extra), cwd=ROOT)
    if not old_summary.exists():
        print(f"clusterproof: the run at {a.old} ended (exit {first.returncode}) before it wrote a summary: "
              "see its output above", file=sys.stderr)
        return first.returncode or exitcodes.USAGE
    print(f"upgrade-check 2/2: profile {a.profile} on Kubernetes {a.new}, compared with {a.old} "
          f"(outputs: {new.shown()})", flush=True)
    second = subprocess.run(pytest_cmd(a.new, a.profile, new, [f"--cp-baseline={old_summary}", *a.extra]), cwd=ROOT)
    comparison = new.comparison
    if not comparison.exists():
        print(f"clusterproof: the run at {a.new} ended (exit {second.returncode}) before it compared: "
              "see its output above", file=sys.stderr)
        return second.returncode or exitcodes.USAGE
    c = json.loads(comparison.read_text())
    table = compare.text_report(compare.Comparison.from_json(c))
    (new.dir / "upgrade.txt").write_text(table + "\n")
    print(f"\nupgrade-check {a.old} -> {a.new} (profile {a.profile}): {c['headline']}\n"
          f"exit at {a.old}: {first.returncode}, at {a.new}: {second.returncode}; table: "
          f"{outputs.shown(new.dir / 'upgrade.txt')}; report: ./proof report {new.run_id} "
          f"(FROM's: ./proof report {old.run_id})", flush=True)
    return second.returncode


if __name__ == "__main__":
    sys.exit(main())
