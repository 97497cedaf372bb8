"""What each suite cost the control plane: requests, watch events and CPU, per test module.

Why: on two cores every request the harness sends is CPU the control plane
under test does not get, and a nightly's time is mostly the control plane
working. Before any work is removed it has to be seen, per suite, by
instruments that do not share a blind spot:

- the harness's own requests, as its client sent them (``CallRecorder``:
  verb and resource of every request of the harness's identity in this
  process; the locust workers, other processes, are not in it);
- every request kube-apiserver served, as it counted them
  (``apiserver_request_total``: the harness, the controllers, the
  scheduler and kwok together), and the watch events it sent
  (``apiserver_watch_events_total``, their bytes from
  ``apiserver_watch_events_sizes``);
- the CPU seconds each embedded component used (``/proc``, through psutil),
  and the harness's with the processes it started; and each component's
  peak resident memory so far (``VmHWM``), the price of the memory the Go
  runtime is given for CPU (profile key ``component_go_env``).

``control_plane_guard`` (``ModuleGuard``) takes a ``Snapshot`` when a module
starts and ``work`` when it ends; the row goes to the report (an attachment
per module), the run's ``api-work.json`` and a table at the end of the run
(``table_lines``). Numbers only, never a verdict.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from prometheus_client.parser import text_string_to_metric_families

from clusterproof.core.texttable import text_table
from clusterproof.kube import apimetrics
from clusterproof.kube import flowcontrol as apf
from clusterproof.kube.apicalls import resource_of

REQUESTS = apf.REQUESTS                    # apiserver_request_total, the API guard's 5xx source too
WATCH_EVENTS = "apiserver_watch_events_total"
WATCH_SIZES = "apiserver_watch_events_sizes"
SCRAPED = (REQUESTS, WATCH_EVENTS, WATCH_SIZES)
HARNESS = "harness"
# The server's verb label as the Kubernetes verb the client's CallRecorder names.
VERBS = {"POST": "create", "PUT": "update", "GET": "get", "LIST": "list", "WATCH": "watch", "PATCH": "patch",
         "APPLY": "patch", "DELETE": "delete", "DELETECOLLECTION": "deletecollection", "CONNECT": "connect"}
WRITES = ("create", "update", "patch", "delete", "deletecollection")
TOP = 12    # the (verb, resource) pairs a module's attachment lists, the most first


def served(text: str) -> Counter:
    """Requests kube-apiserver counted, by (verb, resource), all codes together (pure)."""
    out: Counter = Counter()
    for (verb, group, resource, sub), n in apimetrics.counters(text, REQUESTS, ("verb", "group", "resource",
                                                                                "subresource")).items():
        out[(VERBS.get(verb, verb.lower()), resource_of(resource, sub, group))] += n
    return out


def watch_events(text: str) -> tuple[Counter, Counter]:
    """Watch events sent, and their bytes, by resource (pure)."""
    events, size = Counter(), Counter()
    for (group, resource), n in apimetrics.counters(text, WATCH_EVENTS, ("group", "resource")).items():
        events[resource_of(resource, "", group)] += n
    for fam in text_string_to_metric_families(apimetrics.only(text, (WATCH_SIZES,))):
        for s in fam.samples:
            if fam.name == WATCH_SIZES and s.name == WATCH_SIZES + "_sum":
                size[resource_of(s.labels.get("resource", ""), "", s.labels.get("group", ""))] += s.value
    return events, size


def harness_cpu_s() -> float:
    """CPU seconds of this process, the children it waited for, and the descendants still running."""
    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.Error:       # gone since it was listed: its time is in its parent's children_*
            pass
    return total


def components_cpu_s(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds each component process has used (a component not running is left out)."""
    out = {}
    for name, pid in pids.items():
        try:
            t = psutil.Process(pid).cpu_times()
            out[name] = t.user + t.system
        except psutil.Error:
            pass
    return out


def peak_rss_bytes(status: str) -> int | None:
    """A process's peak resident memory from its /proc/<pid>/status text (``VmHWM``; pure)."""
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024    # the kernel writes it in kB (KiB)
    return None


def components_peak_rss(pids: dict[str, int]) -> dict[str, int]:
    """Each component's peak resident memory since it started, in bytes (one not running is left out)."""
    out = {}
    for name, pid in pids.items():
        try:
            peak = peak_rss_bytes(Path(f"/proc/{pid}/status").read_text())
        except OSError:
            continue
        if peak is not None:
            out[name] = peak
    return out


def minus(after: Counter | dict, before: Counter | dict) -> dict:
    """What grew between two readings (a counter that went back -- a restarted process -- is left out)."""
    return {k: round(v - before.get(k, 0.0), 3) for k, v in after.items() if v - before.get(k, 0.0) > 0}


@dataclass
class Snapshot:
    """Every instrument read at one moment."""
    at: float
    harness_calls: Counter
    metrics: str | None            # the apiserver's counters (SCRAPED), None if unreadable
    cpu: dict[str, float]          # component -> CPU seconds; HARNESS too
    peak_rss: dict[str, int] = field(default_factory=dict)   # component -> bytes, its peak since it started

    @classmethod
    def take(cls, calls, metrics: str | None, pids: dict[str, int]) -> "Snapshot":
        return cls(time.monotonic(), calls.by_verb_and_resource() if calls is not None else Counter(), metrics,
                   {**components_cpu_s(pids), HARNESS: harness_cpu_s()}, components_peak_rss(pids))


@dataclass
class ModuleWork:
    """One module's work (see the module docstring); each dict is keyed 'verb resource' or resource."""
    suite: str
    seconds: float
    harness: dict[str, float] = field(default_factory=dict)
    apiserver: dict[str, float] | None = None        # None: the counters could not be read twice from one replica
    watch_events: dict[str, float] = field(default_factory=dict)
    watch_bytes: dict[str, float] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)
    peak_rss: dict[str, int] = field(default_factory=dict)   # each component's peak since it started, at the end

    @classmethod
    def between(cls, suite: str, a: Snapshot, b: Snapshot) -> "ModuleWork":
        key = " ".join
        harness = {key(k): v for k, v in minus(b.harness_calls, a.harness_calls).items()}
        work = cls(suite, round(b.at - a.at, 1), harness, cpu_s=minus(b.cpu, a.cpu), peak_rss=b.peak_rss)
        if a.metrics is not None and b.metrics is not None:
            work.apiserver = {key(k): v for k, v in minus(served(b.metrics), served(a.metrics)).items()}
            (ev_b, sz_b), (ev_a, sz_a) = watch_events(b.metrics), watch_events(a.metrics)
            work.watch_events, work.watch_bytes = minus(ev_b, ev_a), minus(sz_b, sz_a)
        return work

    def total(self, which: str, verbs: tuple[str, ...] | None = None) -> int:
        rows = getattr(self, which) or {}
        return int(sum(v for k, v in rows.items() if verbs is None or k.split(" ", 1)[0] in verbs))

    def control_plane_cpu_s(self) -> float:
        return round(sum(v for k, v in self.cpu_s.items() if k != HARNESS), 1)

    def row(self) -> dict:
        """The module's line of api-work.json and of the end-of-run table."""
        return {"suite": self.suite, "seconds": self.seconds,
                "harness_requests": self.total("harness"),
                "harness_lists": self.total("harness", ("list",)),
                "harness_watches": self.total("harness", ("watch",)),
                "harness_writes": self.total("harness", WRITES),
                "apiserver_requests": self.total("apiserver") if self.apiserver is not None else None,
                "watch_events": int(sum(self.watch_events.values())),
                "watch_mib": round(sum(self.watch_bytes.values()) / 2**20, 1),
                "control_plane_cpu_s": self.control_plane_cpu_s(),
                "harness_cpu_s": round(self.cpu_s.get(HARNESS, 0.0), 1),
                "cpu_s": {k: round(v, 1) for k, v in sorted(self.cpu_s.items())},
                "peak_rss_mib": {k: round(v / 2**20) for k, v in sorted(self.peak_rss.items())},
                "harness": dict(sorted(self.harness.items(), key=lambda kv: -kv[1])),
                "apiserver": dict(sorted((self.apiserver or {}).items(), key=lambda kv: -kv[1])),
                "watch_events_by_resource": dict(sorted(self.watch_events.items(), key=lambda kv: -kv[1]))}

    def report(self) -> str:
        """The module's attachment: totals, then the requests and watch events the most first."""
        r = self.row()
        lines = [f"{self.seconds:.0f} s; requests of the harness (as its client sent them): {r['harness_requests']:,} "
                 f"({r['harness_lists']:,} LIST, {r['harness_watches']:,} WATCH, {r['harness_writes']:,} writes); "
                 "served by kube-apiserver (every client): "
                 + (f"{r['apiserver_requests']:,}" if r["apiserver_requests"] is not None else "not readable")
                 + f"; watch events sent: {r['watch_events']:,} ({r['watch_mib']} MiB)",
                 "CPU seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in
                                             sorted(self.cpu_s.items(), key=lambda kv: -kv[1]))]
        if self.peak_rss:
            lines.append("peak resident memory since each component started: " + ", ".join(
                f"{k} {v / 2**20:,.0f} MiB" for k, v in sorted(self.peak_rss.items(), key=lambda kv: -kv[1])))
        for title, rows in (("harness requests", self.harness), ("served by kube-apiserver", self.apiserver or {}),
                            ("watch events sent", self.watch_events)):
            top = sorted(rows.items(), key=lambda kv: -kv[1])[:TOP]
            if top:
                lines += ["", f"{title} (the {len(top)} most of {len(rows)}):",
                          *text_table(["what", "count"], [[k, f"{int(v):,}"] for k, v in top], "<>").splitlines()]
        return "\n".join(lines)


def table_lines(rows: list[dict]) -> list[str]:
    """The end-of-run table, one line per module (pure)."""
    def n(v):
        return "-" if v is None else f"{v:,}"
    return text_table(["suite", "time", "harness requests", "LIST", "WATCH", "writes", "all requests",
                       "watch events", "control-plane CPU-s", "harness CPU-s"],
                      [[r["suite"], f"{r['seconds']:.0f} s", n(r["harness_requests"]), n(r["harness_lists"]),
                        n(r["harness_watches"]), n(r["harness_writes"]), n(r["apiserver_requests"]),
                        n(r["watch_events"]), f"{r['control_plane_cpu_s']:.0f}", f"{r['harness_cpu_s']:.0f}"]
                       for r in rows], "<>>>>>>>>>").splitlines()
