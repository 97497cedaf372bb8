"""Where the self-tests' CPU goes: each test's CPU-seconds, written as it ends, and a table per module.

    CLUSTERPROOF_CPU_PER_TEST=cpu.jsonl .venv/bin/python -m pytest tests --cp-profile smoke \\
        -n 4 --dist loadfile --no-loadscope-reorder -p tests.cpu_per_test
    .venv/bin/python tests/cpu_per_test.py cpu.jsonl

A test's CPU is three figures, each counted once: the worker's own and that of the child processes it
started and reaped (child runs, their locust), as ``clusterproof.core.selfcost`` measures the harness, and
the components of the worker's session cluster (``clusterproof.bench.bringup.cpu_seconds``; each worker
has its own, so the apiserver's work for a child run pointed at it lands on that test). A test that
brings the session cluster up is charged with its bring-up. Not counted: the clusters child runs start
for themselves (their components are detached from the run that starts them).
"""
from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from clusterproof.core.texttable import text_table

ENV = "CLUSTERPROOF_CPU_PER_TEST"


def _cluster_cpu(config: pytest.Config) -> dict[str, float]:
    """CPU-seconds of the session cluster's components, by name and pid (a restarted one is a new key)."""
    import psutil

    from clusterproof.bench.bringup import cpu_seconds
    from clusterproof.fixtures.cluster import CLUSTER
    c = config.stash.get(CLUSTER, None)
    if c is None or c.kwok is None:
        return {}
    try:
        return cpu_seconds({f"{name}:{pid}": pid for name, pid in c.kwok.pids().items()})
    except psutil.NoSuchProcess:     # a component a control stops, gone between the listing and the read
        return {}


def pytest_configure(config: pytest.Config) -> None:
    """Child runs spawned, not forked (tests/forkserver.py): a forked run is the fork server's child, and its CPU
    would not be among this worker's reaped children."""
    if os.environ.get(ENV):
        os.environ["CLUSTERPROOF_TEST_FORKSERVER"] = "0"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    out = os.environ.get(ENV)
    if not out:
        yield
        return
    from clusterproof.core import selfcost  # here: the table below runs without the package's imports
    cluster0 = _cluster_cpu(item.config)
    with selfcost.measured(item.nodeid) as cost:
        yield
    cluster = sum(v - cluster0.get(k, 0.0) for k, v in _cluster_cpu(item.config).items())
    record = {"test": item.nodeid, "wall_s": round(cost.wall_s, 1), "own_s": round(cost.own_s, 2),
              "children_s": round(cost.children_s, 2), "cluster_s": round(cluster, 2)}
    with open(out, "a") as f:
        f.write(json.dumps(record) + "\n")


def per_module(lines: list[str]) -> dict[str, dict[str, float]]:
    modules: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for line in lines:
        r = json.loads(line)
        m = modules[r["test"].split("::")[0].rsplit("/", 1)[-1]]
        for k in ("wall_s", "own_s", "children_s", "cluster_s"):
            m[k] += r[k]
        m["cpu_s"] += r["own_s"] + r["children_s"] + r["cluster_s"]
    return dict(sorted(modules.items(), key=lambda kv: -kv[1]["cpu_s"]))


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_file():
        print(f"usage: python tests/cpu_per_test.py FILE (written by a run with {ENV}=FILE -p tests.cpu_per_test)",
              file=sys.stderr)
        return 4
    modules = per_module(Path(argv[0]).read_text().splitlines())
    total = sum(m["cpu_s"] for m in modules.values())
    rows = [[name, f"{m['cpu_s']:.0f}", f"{m['cpu_s'] / total:.1%}",
             *(f"{m[k]:.0f}" for k in ("own_s", "children_s", "cluster_s", "wall_s"))] for name, m in modules.items()]
    rows.append(["all", f"{total:.0f}"])
    print(text_table(["module", "CPU-s", "share", "own", "children", "cluster", "wall"], rows, "<>>>>>>"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
