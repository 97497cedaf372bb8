"""Where the self-tests' CPU goes: each test's CPU-seconds, written as it ends, and a table per module.

    CLUSTERPROOF_CPU_PER_TEST=cpu.jsonl .venv/bin/python -m pytest tests --cp-profile smoke \\
        -n 4 --dist loadfile --no-loadscope-reorder -p tests.cpu_per_test
    python tests/cpu_per_test.py cpu.jsonl

A test's CPU is three figures, each counted once: the worker's own (``time.process_time``), the child
processes it started and reaped (``RUSAGE_CHILDREN``: child runs, their locust), and the components of
the worker's session cluster (``/proc/<pid>/stat``; each worker has its own, so the apiserver's work for
a child run pointed at it lands on that test). A test that brings the session cluster up is charged with
its bring-up. Not counted: the clusters child runs start for themselves (their components are detached
from the run that starts them).
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

ENV = "CLUSTERPROOF_CPU_PER_TEST"
TICK = os.sysconf("SC_CLK_TCK")


def _process_cpu(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK      # utime + stime


def _cluster_cpu(config: pytest.Config) -> dict[str, float]:
    from fixtures.cluster import CLUSTER
    c = config.stash.get(CLUSTER, None)
    if c is None or c.kwok is None:
        return {}
    cpu = {f"{name}:{pid}": _process_cpu(pid) for name, pid in c.kwok.pids().items()}
    return {k: v for k, v in cpu.items() if v is not None}


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    out = os.environ.get(ENV)
    if not out:
        yield
        return
    t0, own0, children0, cluster0 = time.monotonic(), time.process_time(), _children_cpu(), _cluster_cpu(item.config)
    yield
    cluster = sum(v - cluster0.get(k, 0.0) for k, v in _cluster_cpu(item.config).items())
    record = {"test": item.nodeid, "wall_s": round(time.monotonic() - t0, 1),
              "own_s": round(time.process_time() - own0, 2), "children_s": round(_children_cpu() - children0, 2),
              "cluster_s": round(cluster, 2)}
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
    print(f"{'module':36} {'CPU-s':>7} {'share':>6} {'own':>6} {'children':>9} {'cluster':>8} {'wall':>7}")
    for name, m in modules.items():
        print(f"{name:36} {m['cpu_s']:7.0f} {m['cpu_s'] / total:6.1%} {m['own_s']:6.0f} {m['children_s']:9.0f} "
              f"{m['cluster_s']:8.0f} {m['wall_s']:7.0f}")
    print(f"{'all':36} {total:7.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
