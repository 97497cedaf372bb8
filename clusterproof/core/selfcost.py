"""The observer's own cost: how much CPU the harness process spent while it measured.

On a 2-core machine the harness shares the cores with the control plane it measures: a burst's
create latencies or a watch's bytes per second taken while the harness itself used a core are
not the cluster's alone. ``measured`` records, over a block, the harness process's CPU (every
thread: informers, probes, JSON decoding) and, apart, that of the child processes it waited for
in the block (the load generator, locust), as cores and as a share of the machine's CPUs. The
suites put the line in the report's environment, beside the figures it qualifies.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psutil


@dataclass
class CpuCost:
    """CPU seconds over ``wall_s``: the harness process's own, and its waited-for children's."""
    what: str
    wall_s: float = 0.0
    own_s: float = 0.0
    children_s: float = 0.0
    cpus: int = 1

    def cores(self, seconds: float) -> float:
        return seconds / self.wall_s if self.wall_s > 0 else 0.0

    def line(self) -> str:
        """One line (pure), e.g. ``0.31 cores (16 % of 2 CPUs) over 94 s; its load generator 0.92 cores``."""
        own = self.cores(self.own_s)
        text = f"{own:.2f} cores ({100 * own / max(1, self.cpus):.0f} % of {self.cpus} CPUs) over {self.wall_s:.0f} s"
        if self.children_s > 0:
            text += f"; its load generator (locust, child processes) {self.cores(self.children_s):.2f} cores"
        return text


def _cpu(p: psutil.Process) -> tuple[float, float]:
    t = p.cpu_times()
    return t.user + t.system, t.children_user + t.children_system


@contextmanager
def measured(what: str) -> Iterator[CpuCost]:
    """The harness process's CPU over the block (filled in when it ends, also when it raises)."""
    p = psutil.Process()
    cost = CpuCost(what, cpus=os.cpu_count() or 1)
    own0, kids0 = _cpu(p)
    t0 = time.monotonic()
    try:
        yield cost
    finally:
        own1, kids1 = _cpu(p)
        cost.wall_s, cost.own_s, cost.children_s = time.monotonic() - t0, own1 - own0, kids1 - kids0
