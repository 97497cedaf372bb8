"""Run a locustfile as its own process and read locust's own statistics files.

Why a subprocess: locust monkey-patches the standard library with gevent
when imported, which must never happen inside pytest. Why locust's CSV: its
percentiles, failure table and distributed aggregation are the measurement;
re-implementing them would only add a second, disagreeing number.
"""
from __future__ import annotations

import csv
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from clusterproof import IMPORT_ROOT as ROOT
from clusterproof.core import progress
from clusterproof.core.errors import HarnessError
from clusterproof.core.processes import own_session_dying_with_parent, stop_group

LOAD_DIR = Path(__import__("clusterproof.load", fromlist=["_"]).__file__).resolve().parent


def locustfile_path(locustfile: str) -> Path:
    """The project's locustfiles by their checkout path (``load/burst.py``: wherever the package is);
    any other path as given."""
    p = Path(locustfile)
    return LOAD_DIR / p.name if p.parts[:1] == ("load",) else p.resolve()
LOCUST = Path(sys.executable).with_name("locust")


@dataclass
class LocustStats:
    """One row of ``<prefix>_stats.csv`` (times in seconds) plus its failures."""
    name: str
    requests: int
    failures: int
    p50_s: float
    p99_s: float
    max_s: float
    rps: float


@dataclass
class LocustResult:
    returncode: int
    seconds: float
    csv_prefix: Path
    stats: dict[str, LocustStats]               # by request name ("create pod", "Aggregated")
    failures: list[dict] = field(default_factory=list)   # rows of <prefix>_failures.csv
    log_tail: str = ""

    def count_failures(self, prefix: str) -> int:
        """Occurrences of failures whose message starts with ``prefix`` (e.g. "429")."""
        return sum(int(f["Occurrences"]) for f in self.failures if f["Error"].startswith(prefix))

    @property
    def stats_csv(self) -> Path:
        final = Path(f"{self.csv_prefix}_final_stats.csv")
        return final if final.exists() else Path(f"{self.csv_prefix}_stats.csv")


def _num(row: dict, key: str) -> float:
    v = row.get(key, "")
    return float(v) if v not in ("", "N/A") else 0.0


def read_stats(prefix: Path) -> tuple[dict[str, LocustStats], list[dict]]:
    """The final tables if the locustfile wrote them (load.kube_user), else locust's periodic ones."""
    final = Path(f"{prefix}_final_stats.csv").exists()
    tag = "_final" if final else ""
    stats = {}
    with open(f"{prefix}{tag}_stats.csv", newline="") as f:
        for row in csv.DictReader(f):
            stats[row["Name"]] = LocustStats(
                row["Name"], int(_num(row, "Request Count")), int(_num(row, "Failure Count")),
                _num(row, "50%") / 1000, _num(row, "99%") / 1000, _num(row, "Max Response Time") / 1000,
                _num(row, "Requests/s"))
    failures = []
    fpath = Path(f"{prefix}{tag}_failures.csv")
    if fpath.exists():
        with open(fpath, newline="") as f:
            failures = list(csv.DictReader(f))
    return stats, failures


def run_locust(locustfile: str, host: str, users: int, args: list[str], csv_prefix: Path,
               timeout_s: float, env: dict[str, str] | None = None,
               processes: int = 1, status: Callable[[], Any] | None = None) -> LocustResult:
    """``locust -f FILE --headless`` until the locustfile quits; bounded by ``timeout_s``.

    ``--run-time`` is the locust-side bound; the subprocess timeout is the
    backstop. ``processes`` > 1 uses locust's own distributed mode on this
    machine (a master and forked workers), the same code path as workers on
    other machines. While it runs, a heartbeat line says so (with
    ``status()``, e.g. the pods seen so far, or the last line of its log).
    """
    if not LOCUST.exists():
        raise HarnessError(f"locust is not installed next to {sys.executable}: "
                           "install requirements.txt into the venv")
    csv_prefix.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(LOCUST), "-f", str(locustfile_path(locustfile)), "--headless", "--host", host,
           "-u", str(users), "-r", str(users), "--run-time", f"{int(timeout_s)}s",
           "--stop-timeout", "10", "--csv", str(csv_prefix), "--only-summary",
           "--loglevel", "WARNING", "--exit-code-on-error", "0", *args]
    if processes > 1:
        cmd += ["--processes", str(processes)]
    t0 = time.monotonic()
    log = csv_prefix.with_suffix(".log")
    with open(log, "w") as out:
        # Its own process group, dying with the harness: locust's --processes
        # workers are forked children, and an interrupted run stops them all.
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=own_session_dying_with_parent,
                                env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
        try:
            with progress.heartbeat(f"locust {locustfile} ({users} users) to finish", timeout=timeout_s + 60,
                                    status=status or (lambda: progress.last_line(log)), log=progress.caller_logger(1)):
                proc.wait(timeout=timeout_s + 60)
        except subprocess.TimeoutExpired:
            raise HarnessError(f"locust did not finish within {timeout_s + 60:g} s; see {log}") from None
        finally:
            stop_group(proc)
    seconds = time.monotonic() - t0
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
    if not Path(f"{csv_prefix}_stats.csv").exists():
        raise HarnessError(f"locust wrote no statistics (exit {proc.returncode}); see {log}: "
                           f"{tail.splitlines()[-1] if tail else 'no output'}")
    stats, failures = read_stats(csv_prefix)
    return LocustResult(proc.returncode, seconds, csv_prefix, stats, failures, tail)
