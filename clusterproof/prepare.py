"""What a run of the suites needs, built before it starts -- and nothing else.

Why: ``make run`` used to build every binary (the whole Go toolchain, ~12 min
cold) and the Prometheus history before any run, also before a run against an
existing cluster, which uses none of the embedded cluster's binaries. Given the
run's own arguments, this job builds what that run uses (each once, cached; a
build prints one line, a failure is one line and exit 8 -- a bad profile or
``--cp-set``: exit 4, before any build), so a timed run does not pay for a build:

- the embedded cluster: every toolchain component (kwok, etcd, the control
  plane at the profile's ``kubernetes_version``, the Coscheduling scheduler,
  Kueue and JobSet, the real nodes' kubelet, the mock NVML library), the real nodes' host
  packages and images (root; only when the profile has real nodes);
- ``--cp-kubeconfig`` (an existing cluster): the mock NVML library (the
  preflight checker runs here, and on a kwok cluster the GPUs are simulated);
- either, unless ``--cp-prometheus-url`` names the Prometheus under test:
  Prometheus and the profile's backfilled history (the embedded Prometheus).

Whatever is not built here is still built on first use inside the run.

    python -m clusterproof.prepare [--dry-run] [--jobs N] PYTEST_ARGS...

Unknown arguments (the rest of the run's pytest arguments) are ignored.
"""
from __future__ import annotations

import argparse
import os
import sys

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


def plan(a: argparse.Namespace) -> dict:
    """What the run uses: toolchain components, whether the history, host packages and images."""
    profile = load_profile(a.profile, a.cp_set)
    existing = bool(a.kubeconfig or a.context)     # --cp-context alone: the current kubeconfig's cluster
    return {"profile": profile,
            "components": toolchain.for_run(existing, bool(a.prometheus_url), profile.kubernetes_version),
            "history": not a.prometheus_url,
            "real_nodes": (not existing) and profile.real_nodes > 0}


def main(argv: list[str] | None = None) -> int:
    a = run_args(list(sys.argv[1:] if argv is None else argv))
    say = lambda m: print(f"clusterproof: {m}", flush=True)   # noqa: E731

    def body() -> int:
        p = plan(a)     # a bad profile or --cp-set: HarnessError, exit 4 (one_line_main below)
        if a.dry_run:
            for c in p["components"]:
                say(f"{c.name} {c.version}: {'cached' if c.is_built() else 'would be built'}")
            if p["history"]:
                from clusterproof.prometheus import history
                from clusterproof.prometheus.history import shape_of
                shape = shape_of(p["profile"])
                cached = (history.cache_dir(shape) / "history.json").exists()
                say(f"Prometheus history of {shape.nodes:,} nodes: {'cached' if cached else 'would be built'}")
            else:
                say("Prometheus history: not used (--cp-prometheus-url)")
            say(f"real nodes' host packages and images: {'used' if p['real_nodes'] else 'not used'}")
            return 0
        progress.to_terminal()   # the builds' heartbeats (a first build takes minutes), timestamped, on stderr
        return one_line_main(lambda: build(p), exitcodes.SETUP_FAILED)   # a build failed: 8

    def build(p: dict) -> int:
        toolchain.ensure_many(p["components"], progress=say, jobs=a.jobs)
        if p["real_nodes"]:
            if hostpkgs.main(["--install"]) != 0:
                return exitcodes.SETUP_FAILED
            if os.geteuid() == 0:
                from clusterproof.provision import images
                for im in images.IMAGES:
                    images.build(im, progress=say)
            else:
                say("images for real nodes not built (not root)")
        if p["history"]:
            from clusterproof.prometheus import history
            from clusterproof.prometheus.history import shape_of
            history.build(shape_of(p["profile"]), progress=say)
        return 0
    return one_line_main(body, exitcodes.USAGE)


if __name__ == "__main__":
    sys.exit(main())
