"""What every benchmark shares: its command line, its cluster, its namespace, and how it writes JSON.

Why a module: a benchmark is a measurement, and its figures must say how
they were made -- the command, the date, the machine, the cluster -- the same
way for every bench; and a bench must leave nothing behind, like a suite.

    args = common.parser(__doc__, default_profile="smoke").parse_args(argv)
    profile = common.load(args)                # one line + exit 2 on bad input
    with common.cluster(args, profile) as c, common.namespace(c, "knee") as ns:
        ...
    data = {"steps": [...]}                       # what the bench measured, as it keeps it (plots read it)
    common.write(args.out, common.header(argv, c, profile, MODULE), figures(data), data)

Every bench writes one shape (``write``): its context (``header``: command,
date, machine, versions, profile, cluster; and its settings), its
``figures`` -- a list of ``clusterproof.core.measurement.Figure``s in
``Figure.to_json()``'s shape, as a suite's figures are in summary.json --
and ``data``, the raw measurements the bench keeps for its plots and for
whoever wants more than the figures. A bench derives its figures from its
data with one pure function (``figures(data)``), so a file written before a
figure existed can be given it from the data it holds. The docs' tables
(``clusterproof.report.benchtables``) read only the figures and the context.

A figure's name may carry a qualifier in brackets, ``create_qps[2 workers]``:
the same measure at one step of a sweep, one size, one mode (a table puts
the qualifiers side by side as columns).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import sys
from pathlib import Path
from typing import Iterable, Iterator

import psutil

from clusterproof import CHECKOUT
from clusterproof.cluster import backends
from clusterproof.cluster.kwok import describe_go_env
from clusterproof.config.profile import Profile, load_profile
from clusterproof.core import exitcodes, outputs, progress, redact
from clusterproof.core.errors import ArgumentParser, HarnessError
from clusterproof.core.measurement import Figure
from clusterproof.core.run import new_run_id
from clusterproof.kube import access
from clusterproof.kube.client import is_simulated, load_client
from clusterproof.prometheus.server import sweep_abandoned
from clusterproof.provision import toolchain

# The committed figures docs/benchmarks.md tabulates (reports/bench/) in a checkout; the output directory otherwise.
OUT_DIR = outputs.bench_dir(CHECKOUT)


# A bench's progress lines: logging (clusterproof.core.progress), timestamped on stderr once ``load`` has run.
say = progress.say


def parser(doc: str, default_profile: str, out: str) -> argparse.ArgumentParser:
    """--cp-profile, --cp-set, --cp-kubeconfig and --out (default ``reports/bench/<out>`` in a checkout, else
    ``<output dir>/bench/<out>``); add your own."""
    ap = ArgumentParser(description=doc.splitlines()[0])
    # The run's spellings (--cp-); the unprefixed ones are still read, as the plugin reads them.
    ap.add_argument("--cp-profile", "--profile", dest="profile", default=default_profile)
    ap.add_argument("--cp-set", "--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    ap.add_argument("--cp-kubeconfig", "--kubeconfig", dest="kubeconfig", default=None,
                    help="an existing cluster instead of an embedded one")
    ap.add_argument("--out", type=Path, default=OUT_DIR / out)
    return ap


class Failed(SystemExit):
    """A bench ends on bad input or a harness error: one line, exit 4 (clusterproof.core.exitcodes)."""


def fail(e: Exception) -> Failed:
    print(f"clusterproof: {e}", file=sys.stderr)
    return Failed(exitcodes.USAGE)


def load(args) -> Profile:
    """The profile (and, for an embedded cluster, every binary built first). From here on the bench's
    progress lines, phases and heartbeats are written to stderr with their time."""
    progress.to_terminal()
    try:
        profile = load_profile(args.profile, args.overrides)
        if not args.kubeconfig:
            toolchain.ensure_all(progress=say)
        return profile
    except HarnessError as e:
        raise fail(e) from None


@contextlib.contextmanager
def cluster(args, profile: Profile, coscheduling: bool = False, run_id: str | None = None,
            kueue: bool = False) -> Iterator[backends.Cluster]:
    """An embedded cluster for this bench (or the existing one ``--cp-kubeconfig`` names), gone afterwards;
    ``kueue``: with Kueue and JobSet declared (idle until ``clusterproof.cluster.kueue.start``)."""
    run_id, c = run_id or new_run_id(), None
    try:
        if args.kubeconfig:
            api = load_client(args.kubeconfig)
            simulated = is_simulated(api)   # every node a kwok node
            # A bench is load: it works under the destructive manifest, checked like a suite run's.
            c = backends.connect_existing(profile, run_id, args.kubeconfig, None, say, simulated=simulated,
                                          manifest=access.check(api, destructive=True, needs=access.pool_needs(profile),
                                                                       pool_label=profile.pool_label),
                                          local_sweeps=(sweep_abandoned,))
        else:
            c = backends.start_embedded(profile, run_id, say, coscheduling_components=coscheduling,
                                        kueue_components=kueue, local_sweeps=(sweep_abandoned,))
        yield c
    except HarnessError as e:
        raise fail(e) from None
    finally:
        if c is not None:
            backends.stop(c, False, say)


@contextlib.contextmanager
def namespace(c: backends.Cluster, name: str, labels: dict | None = None) -> Iterator[str]:
    """A namespace of the run's (created, or claimed from the pool); emptied and given back afterwards (a
    created one with kube.pods.delete_namespace: its pods and Events first, then the namespace). ``labels``:
    a created one's (a pool namespace cannot be labelled)."""
    ns = c.namespaces.take(f"bench-{name}", labels)
    try:
        yield ns
    finally:
        c.namespaces.give_back(ns, timeout=600)


def header(argv: list[str], c: backends.Cluster | None, profile: Profile, module: str) -> dict:
    """How the figures were made: command, date, machine (and its load), cluster."""
    out = {
        "command": redact.text(f"python -m {module} " + " ".join(argv)),   # a URL's user:pass@ never kept
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {"cpus": os.cpu_count(), "memory_bytes": psutil.virtual_memory().total,
                    "platform": platform.platform(), "python": platform.python_version(),
                    "loadavg_1m_at_end": round(os.getloadavg()[0], 2)},
        "versions": toolchain.versions(),
        "profile": profile.name,
    }
    if c is not None:
        out["cluster"] = {"backend": c.backend, "nodes": profile.nodes, "server": c.server_version,
                          "simulated": c.simulated}
        if c.kwok is not None:   # the embedded components' Go runtime (profile key component_go_env)
            out["cluster"]["go_runtime"] = describe_go_env(c.kwok.go_env)
    return out


def figure(bench: str, name: str, value, unit: str, threshold: float | None = None, op: str = "<=",
           better: str | None = None, headline: bool = False) -> Figure:
    """One figure of a bench (its check is the bench's name, e.g. ``bench burst``)."""
    return Figure.of(f"bench {bench}", name, value, unit, threshold, op, better, headline)


def qualified(name: str, qualifier) -> str:
    """``name[qualifier]``: one measure at one step, size or mode of a bench."""
    return f"{name}[{qualifier}]"


def shaped(context: dict, figures: Iterable[Figure], data: dict) -> dict:
    """The one shape of a bench's JSON: context, ``figures`` (``Figure.to_json()`` each), ``data``."""
    return {**context, "figures": [f.to_json() for f in figures], "data": data}


def write(path: Path, context: dict, figures: Iterable[Figure], data: dict) -> None:
    """The bench's JSON, in the shape every bench writes (``shaped``). Written even without a figure (an
    hour's measurement is not thrown away), but said: the docs' tables cannot read such a file."""
    result = shaped(context, figures, data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    say(f"wrote {path}" + ("" if result["figures"] else " WITHOUT FIGURES: its figures(data) found none in the data"))
