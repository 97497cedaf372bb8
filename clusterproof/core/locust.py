"""Run a locustfile as its own process and read locust's own statistics files.

Why a subprocess: locust monkey-patches the standard library with gevent
when imported, which must never happen inside pytest. Why locust's CSV: its
percentiles, failure table and distributed aggregation are the measurement;
re-implementing them would only add a second, disagreeing number.

Distributed mode: with a ``Master``, the harness runs locust's master itself
(``--master``, ``--expect-workers``) and workers on other hosts join it
(``clusterproof load-worker``, ``clusterproof.core.loadworker``). The run's figures
are the master's aggregate; ``<csv>_workers.json`` (load/workers.py) says who
joined, who finished and who was lost.
"""
from __future__ import annotations

import csv
import ipaddress
import json
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
from clusterproof.core.ports import free_port
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


@dataclass(frozen=True)
class Master:
    """locust's master, run by the harness, waiting for ``workers`` remote workers.

    ``names``: the names the workers give (``clusterproof load-worker --name``), for the one line
    that names the missing ones; empty: any ``workers`` workers. ``bind``/``port``: where it listens
    (loopback unless the run names an address its workers reach: ``*`` every address; the run says so,
    ``listens_beyond_loopback``). ``wait_s``: how long it waits for all of them before it gives up.
    """
    workers: int
    names: tuple[str, ...] = ()
    bind: str = "127.0.0.1"
    port: int = 5557
    wait_s: float = 120.0

    @classmethod
    def of(cls, profile, workers: int, names) -> Master | None:
        """From the profile's ``load_master_*`` keys; None when no remote worker is expected."""
        if not workers:
            return None
        return cls(workers, tuple(names), profile.load_master_bind, profile.load_master_port,
                   profile.load_workers_wait_s)

    def listens_beyond_loopback(self) -> str | None:
        """The line a run says when its master is reachable from other hosts (an explicit opt-in, profile key
        ``load_master_bind``: the workers receive the run's token over locust's unauthenticated port)."""
        try:
            if ipaddress.ip_address(self.bind).is_loopback:
                return None
        except ValueError:   # "*", or a host name
            pass
        return (f"locust master listens on {self.bind}:{self.port} for {self.workers} remote worker(s) "
                "(load_master_bind): reachable from beyond this machine for this load")

    def args(self, csv_prefix: Path) -> list[str]:
        return ["--master", "--master-bind-host", self.bind, "--master-bind-port", str(self.port),
                "--expect-workers", str(self.workers), "--expect-workers-max-wait", str(max(1, round(self.wait_s))),
                "--cp-expect-worker-names", ",".join(self.names)]


def read_workers(csv_prefix: Path) -> list[dict]:
    """The master's record of its workers (load/workers.py), joined order; [] without one."""
    path = Path(f"{csv_prefix}_workers.json")
    try:
        return json.loads(path.read_text()).get("workers", [])
    except (OSError, ValueError):
        return []


def _who(w: dict) -> str:
    at = f" from {w['address']}" if w.get("address") else ""
    return f"{w.get('name') or w.get('client_id')}{at}"


def missing_workers_line(master: Master, joined: list[dict], port_note: str = "") -> str:
    """One line: which expected workers did not join the master within its wait (pure)."""
    names = [w.get("name", "") for w in joined]
    if master.names:
        missing = [n for n in master.names if n not in names]
    else:
        missing = [f"{master.workers - len(joined)} unnamed worker(s)"]
    got = ", ".join(_who(w) for w in joined) or "none"
    return (f"locust master: {len(joined)} of {master.workers} expected workers joined within {master.wait_s:g} s; "
            f"missing: {', '.join(missing) or 'none'} (joined: {got}); start them with `clusterproof load-worker "
            f"--master HOST:{master.port} --name NAME`{port_note}")


def lost_workers(workers: list[dict]) -> list[dict]:
    return [w for w in workers if w.get("state") == "lost"]


def lost_line(w: dict, what: str = "creates") -> str:
    """One log line about a worker lost mid-run."""
    done = sum(r.get("requests", 0) - r.get("failures", 0) for r in w.get("reported", {}).values())
    return (f"locust worker {_who(w)} (index {w.get('index')}) was lost {w.get('lost_s')} s into the run, "
            f"after reporting {done} successful requests (a worker reports every 3 s); its unfinished {what} "
            "are completed without it")


@dataclass
class LocustResult:
    returncode: int
    seconds: float
    csv_prefix: Path
    stats: dict[str, LocustStats]               # by request name ("create pod", "Aggregated")
    failures: list[dict] = field(default_factory=list)   # rows of <prefix>_failures.csv
    log_tail: str = ""
    workers: list[dict] = field(default_factory=list)    # distributed mode: the master's record (read_workers)

    @property
    def lost(self) -> list[dict]:
        return lost_workers(self.workers)

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
               processes: int = 1, status: Callable[[], Any] | None = None,
               master: Master | None = None) -> LocustResult:
    """``locust -f FILE --headless`` until the locustfile quits; bounded by ``timeout_s``.

    ``--run-time`` is the locust-side bound; the subprocess timeout is the
    backstop. ``processes`` > 1 uses locust's own distributed mode on this
    machine (a master and forked workers), the same code path as workers on
    other machines. ``master``: locust's master for remote workers instead
    (``processes`` is then not used); it waits ``master.wait_s`` for them
    and fails with one line naming the missing ones. While it runs, a
    heartbeat line says so (with ``status()``, e.g. the pods seen so far, or
    the last line of its log).
    """
    if not LOCUST.exists():
        raise HarnessError(f"locust is not installed next to {sys.executable}: "
                           "install requirements.txt into the venv")
    csv_prefix.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(LOCUST), "-f", str(locustfile_path(locustfile)), "--headless", "--host", host,
           "-u", str(users), "-r", str(users), "--run-time", f"{int(timeout_s)}s",
           "--stop-timeout", "10", "--csv", str(csv_prefix), "--only-summary",
           "--loglevel", "WARNING", "--exit-code-on-error", "0", *args]
    if master is not None:
        cmd += master.args(csv_prefix)
        wide = master.listens_beyond_loopback()
        if wide:
            progress.say(wide)
        Path(f"{csv_prefix}_workers.json").unlink(missing_ok=True)
    elif processes > 1:
        # The forked workers reach their master on loopback, at a port of its own: never on every
        # interface, and never locust's fixed 5557, which another run on this machine may hold.
        port = str(free_port())
        cmd += ["--processes", str(processes), "--master-bind-host", "127.0.0.1", "--master-bind-port", port,
                "--master-host", "127.0.0.1", "--master-port", port]
    bound = timeout_s + 60 + (master.wait_s if master else 0)
    t0 = time.monotonic()
    log = csv_prefix.with_suffix(".log")
    with open(log, "w") as out:
        # Its own process group, dying with the harness: locust's --processes
        # workers are forked children, and an interrupted run stops them all.
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=own_session_dying_with_parent,
                                env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
        try:
            with progress.heartbeat(f"locust {locustfile} ({users} users) to finish", timeout=bound,
                                    status=status or (lambda: _status(master, csv_prefix, log)),
                                    log=progress.caller_logger(1)):
                proc.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            raise HarnessError(f"locust did not finish within {bound:g} s; see {log}") from None
        finally:
            stop_group(proc)
    seconds = time.monotonic() - t0
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
    workers = read_workers(csv_prefix) if master is not None else []
    if master is not None and "Gave up waiting for workers" in tail:
        raise HarnessError(missing_workers_line(master, workers))
    if not Path(f"{csv_prefix}_stats.csv").exists():
        raise HarnessError(f"locust wrote no statistics (exit {proc.returncode}); see {log}: "
                           f"{tail.splitlines()[-1] if tail else 'no output'}")
    stats, failures = read_stats(csv_prefix)
    return LocustResult(proc.returncode, seconds, csv_prefix, stats, failures, tail, workers)


def _status(master: Master | None, csv_prefix: Path, log: Path) -> str:
    """The heartbeat's status: with a master, which workers joined so far; else the log's last line."""
    if master is None:
        return progress.last_line(log)
    ws = read_workers(csv_prefix)
    return (f"{len(ws)} of {master.workers} workers joined ({', '.join(_who(w) for w in ws) or 'none yet'}); "
            f"{progress.last_line(log)}")
