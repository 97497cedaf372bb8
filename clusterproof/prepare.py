"""What a run of the suites needs, built before it starts -- and nothing else, in the order it needs it.

Why: ``make run`` used to build every binary (the whole Go toolchain, ~12 min
cold) and the Prometheus history before any run, also before a run against an
existing cluster, which uses none of the embedded cluster's binaries, and before
``./proof run -k gang``, which uses neither Kueue nor Prometheus. Given the run's
own arguments, this job builds what that run uses (each once, cached; a build
prints one line, a failure is one line and exit 8 -- a bad profile or
``--cp-set``: exit 4, before any build), so a timed run does not pay for a build:

- the embedded cluster: what its start runs first (kwok, etcd, the control plane at
  the profile's ``kubernetes_version``, the mock NVML library; the real nodes' kubelet,
  host packages and images when the profile has real nodes, the Coscheduling scheduler
  when a check schedules gangs, Kueue and JobSet when one admits through Kueue), then
  Prometheus and the profile's backfilled history if a check uses the embedded Prometheus;
- ``--cp-kubeconfig`` (an existing cluster): the mock NVML library (the preflight
  checker runs here, and on a kwok cluster the GPUs are simulated) and Prometheus
  with its history if a check uses it;
- ``--cp-prometheus-url`` (the Prometheus under test): no Prometheus, no history.

Which checks the run selects (``-k``, ``-m``, paths, ``--lf``) is pytest's to say: when
something is not cached yet, this job collects the run first (``pytest --collect-only``
with the run's own arguments, 2-3 s) and reads what its checks use
(``clusterproof.fixtures.cluster.checks_use``). If that collection fails, everything
the run could use is built, and the run itself then says what is wrong.
Whatever is not built here is still built on first use inside the run.

    python -m clusterproof.prepare [--dry-run] [--jobs N] PYTEST_ARGS...

Unknown arguments (the rest of the run's pytest arguments) are ignored here.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from clusterproof.config.profile import load_profile
from clusterproof.core import exitcodes, progress
from clusterproof.core.errors import ArgumentParser, one_line_main
from clusterproof.provision import hostpkgs, toolchain


def run_args(argv: list[str]) -> argparse.Namespace:
    """The run's arguments that decide what it uses (both spellings, as the plugin takes them)."""
    ap = ArgumentParser(prog="python -m clusterproof.prepare", add_help=False, allow_abbrev=False)
    ap.add_argument("--cp-profile", "--profile", dest="profile", default="smoke")
    ap.add_argument("--cp-set", "--set", dest="cp_set", action="append", default=[])
    ap.add_argument("--cp-kubeconfig", "--kubeconfig", dest="kubeconfig", default=None)
    ap.add_argument("--cp-context", "--context", dest="context", default=None)
    ap.add_argument("--cp-prometheus-url", "--prometheus-url", dest="prometheus_url", default=None)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--jobs", type=int, default=1)
    return ap.parse_known_args(argv)[0]


OWN = ("--dry-run", "--jobs")    # this job's own options; the rest is the run's pytest command line
COLLECT_TIMEOUT_S = 300


def pytest_args(argv: list[str]) -> list[str]:
    """The run's pytest arguments: ``argv`` without this job's own options."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--jobs":
            skip = True
        elif not a.startswith(OWN):
            out.append(a)
    return out


def checks_use(argv: list[str]) -> list[str] | None:
    """What the checks the run selects use (``toolchain.USES``' names, in the order the run first needs each),
    from a collection of the run with its own arguments; None if the collection did not say (it failed: the
    run itself will say why)."""
    with tempfile.TemporaryDirectory(prefix="cp-uses-") as d:
        to = Path(d) / "uses.json"
        try:
            subprocess.run([sys.executable, "-m", "pytest", *pytest_args(argv), "--collect-only", "-q",
                            f"--cp-uses-to={to}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=COLLECT_TIMEOUT_S, check=False)
            return json.loads(to.read_text())
        except (OSError, ValueError, subprocess.TimeoutExpired):
            return None


def plan(a: argparse.Namespace, uses: list[str] | None = None) -> dict:
    """What the run uses: toolchain components, whether the history, host packages and images. ``uses``: what
    its checks use (``checks_use``); None: everything they could."""
    profile = load_profile(a.profile, a.cp_set)
    existing = bool(a.kubeconfig or a.context)     # --cp-context alone: the current kubeconfig's cluster
    real_nodes = (not existing) and profile.real_nodes > 0
    checks = uses
    if uses is not None:
        uses = [*(["real_nodes"] if real_nodes else []), *uses]
    components = toolchain.for_run(existing, bool(a.prometheus_url), profile.kubernetes_version, uses)
    start = () if existing else toolchain.bringup(uses, profile.kubernetes_version)
    return {"profile": profile, "components": components, "checks_use": checks,
            "start": [c for c in components if c in start], "later": [c for c in components if c not in start],
            "history": toolchain.PROMETHEUS in components and not a.prometheus_url,
            "real_nodes": real_nodes}


def history_shape(p: dict):
    from clusterproof.prometheus.history import shape_of
    return shape_of(p["profile"])


def history_cached(p: dict) -> bool:
    from clusterproof.prometheus import history
    return (history.cache_dir(history_shape(p)) / "history.json").exists()


def all_cached(p: dict) -> bool:
    """Is everything of plan ``p`` already built? (Then the run need not be collected to know what it uses.)"""
    return all(c.is_built() for c in p["components"]) and not (p["history"] and not history_cached(p))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = run_args(argv)
    say = lambda m: print(f"clusterproof: {m}", flush=True)   # noqa: E731

    def body() -> int:
        p = plan(a)     # a bad profile or --cp-set: HarnessError, exit 4 (one_line_main below)
        if not all_cached(p):
            uses = checks_use(argv)
            if uses is not None:
                p = plan(a, uses)
        if a.dry_run:
            if p["checks_use"] is not None:
                say(f"the selected checks use: {', '.join(p['checks_use']) or 'the control plane only'}")
            for c in p["components"]:
                say(f"{c.name} {c.version}: {'cached' if c.is_built() else 'would be built'}")
            if p["history"]:
                state = "cached" if history_cached(p) else "would be built"
                say(f"Prometheus history of {history_shape(p).nodes:,} nodes: {state}")
            else:
                say("Prometheus history: not used" + (" (--cp-prometheus-url)" if a.prometheus_url else ""))
            say(f"real nodes' host packages and images: {'used' if p['real_nodes'] else 'not used'}")
            return 0
        progress.to_terminal()   # the builds' heartbeats (a first build takes minutes), timestamped, on stderr
        return one_line_main(lambda: build(p), exitcodes.SETUP_FAILED)   # a build failed: 8

    def build(p: dict) -> int:
        # in the order the run needs them: what the cluster's start runs (the real nodes' host and images
        # with it), then what checks use later
        toolchain.ensure_many(p["start"], progress=say, jobs=a.jobs)
        if p["real_nodes"]:
            if hostpkgs.main(["--install"]) != 0:
                return exitcodes.SETUP_FAILED
            if os.geteuid() == 0:
                from clusterproof.provision import images
                for im in images.IMAGES:
                    images.build(im, progress=say)
            else:
                say("images for real nodes not built (not root)")
        toolchain.ensure_many(p["later"], progress=say, jobs=a.jobs)
        if p["history"]:
            from clusterproof.prometheus import history
            history.build(history_shape(p), progress=say)
        return 0
    return one_line_main(body, exitcodes.USAGE)


if __name__ == "__main__":
    sys.exit(main())
