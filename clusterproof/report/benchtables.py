"""The figures tables of the docs, printed from the committed benchmark JSON (reports/bench/*.json).

Why: a figure copied by hand into a page drifts from the measurement it came
from. Each table in ``docs/`` that shows bench figures sits between two marker
comments, ``<!-- bench-tables: NAME -->`` and ``<!-- /bench-tables: NAME -->``;
``clusterproof bench-tables`` prints what belongs there (``--write`` rewrites
the pages in place, ``--check`` fails on a stale one) and
``tests/test_docs.py`` fails when a committed table differs. Every table
says where its figures come from: the file, the date, the command (or, for
files written before benches recorded it, the profile and overrides), the
machine. The JSON files have grown over time and differ in shape; each known
shape has its renderer below, a file written with ``"figures"`` (the shape of
``clusterproof.bench.common.write``) gets a table of them, anything else a
table of its top-level numbers. Pure: reads JSON, returns text.
"""
from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Callable

from clusterproof.core.texttable import markdown_table as table

COMMAND = "clusterproof bench-tables --write"
OPEN = "<!-- bench-tables: {} -->"
CLOSE = "<!-- /bench-tables: {} -->"
# A recorded command line shown in today's option names (the old names still work, with a warning, until 0.23).
_OLD_OPTION = re.compile(r"(?<![\w-])--(profile|set|kubeconfig|context|run-id|baseline|summary|output-dir|"
                         r"allow-destructive|prometheus-url)(?=[\s=]|$)")
_MARKER = re.compile(r"<!-- bench-tables: ([\w.-]+) -->\n(.*?)<!-- /bench-tables: \1 -->", re.S)


class BenchTablesError(Exception):
    """A bench file or a page that cannot be rendered or rewritten (one line)."""


# ---- numbers as a reader wants them -------------------------------------------------------------

def _num(x) -> str:
    """A number as a reader wants it: thousands separated, two decimals at most above 1, three
    significant digits below; None -> '--'."""
    if x is None:
        return "--"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if abs(x) >= 1000 or x == 0:
        return f"{x:,.0f}"
    s = f"{x:.1f}" if abs(x) >= 100 else f"{x:.2f}" if abs(x) >= 1 else f"{x:.3g}"
    return s.rstrip("0").rstrip(".") if "." in s and "e" not in s else s


def _s(x) -> str:
    return "--" if x is None else f"{_num(x)} s"


def _mib(x) -> str:
    """Bytes as MiB below 1 GiB, GiB (two decimals) above."""
    if x is None:
        return "--"
    if x >= 2 ** 30:
        return f"{x / 2 ** 30:.2f} GiB"
    return f"{x / 2 ** 20:.0f} MiB"


def _kb(x) -> str:
    """Bytes in decimal units (network figures: kB, MB, GB)."""
    if x is None:
        return "--"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if x >= size:
            v = x / size
            return f"{v:.1f} {unit}" if v < 100 else f"{v:.0f} {unit}"
    return f"{x:.0f} B"


def _date(d: dict) -> str:
    raw = d.get("date") or d.get("measured_at")
    if not raw:
        return "date not recorded"
    try:
        t = dt.datetime.fromisoformat(str(raw).replace("Z", "+00:00")).astimezone(dt.timezone.utc)
    except ValueError:
        return str(raw)
    return t.strftime("%Y-%m-%d %H:%M UTC")


def _load(d: dict) -> str | None:
    m = d.get("machine") or {}
    for key in ("loadavg_1m_at_end", "load_average_1m_at_end"):
        if m.get(key) is not None:
            return f"{m[key]:.1f}"
    for src in (m.get("load_average_at_end"), d.get("load_average_at_end")):
        if isinstance(src, list) and src:
            return f"{src[0]:.1f}"
    return None


def source(path: Path, d: dict) -> str:
    """Where a table's figures come from, as one line above it."""
    m = d.get("machine") or {}
    bench = path.stem.split("-")[0]
    if d.get("command"):
        how = "command `" + _OLD_OPTION.sub(r"--cp-\1", d["command"]) + "`"
        if d["command"].startswith("python -m bench."):
            how += f" (before the package move; today `python -m clusterproof.bench.{bench}`)"
    else:
        sets = " ".join(f"--cp-set {o}" for o in d.get("overrides") or [])
        how = (f"profile `{d.get('profile', '?')}`" + (f", `{sets}`" if sets else ", no overrides")
               + f" (this older file does not record the command line; the bench is "
                 f"`python -m clusterproof.bench.{bench}`)")
    machine = f"{m['cpus']} CPUs" if m.get("cpus") else "machine not recorded"
    load = _load(d)
    if load is not None:
        machine += f", load average {load} at the end"
    nodes = (d.get("cluster") or {}).get("nodes", d.get("nodes"))
    version = (d.get("cluster") or {}).get("server") or (d.get("versions") or {}).get("kubernetes")
    where = ", ".join(x for x in (f"{nodes:,} nodes" if isinstance(nodes, int) else "",
                                  f"Kubernetes {version}" if version else "") if x)
    return (f"*`reports/bench/{path.name}`, measured {_date(d)}; {how}; {machine}"
            + (f"; {where}" if where else "") + ".*")


# ---- one renderer per shape ------------------------------------------------------------------------

def _bringup(files: list[tuple[Path, dict]]) -> str:
    """Every ``bringup*.json`` side by side (the same bench with different settings)."""
    def label(p: Path, d: dict) -> str:
        hb = (d.get("heartbeat") or {}).get("heartbeat_factor")
        return f"`{p.name}`" + (f" (heartbeat factor {hb:g})" if hb is not None else "")

    ds = [d for _, d in files]

    def row(name, fn):
        return [name, *(fn(d) for d in ds)]
    rows = [
        row("nodes", lambda d: _num(d.get("nodes"))),
        row("all nodes Ready=True, after the first create", lambda d: f"**{_s(d.get('seconds_to_all_ready'))}**"),
        row("all nodes schedulable (not-ready taint lifted)",
            lambda d: f"**{_s(d.get('seconds_to_all_schedulable'))}**"),
        row("creating the Node objects", lambda d: _s(d.get("seconds_create_all_nodes"))),
        row("control plane start", lambda d: _s(d.get("seconds_control_plane_start"))),
    ]
    for comp, key in (("kube-apiserver", "apiserver"), ("etcd", "etcd"), ("kwok", "kwok"),
                      ("kube-controller-manager", "kube_controller_manager"), ("kube-scheduler", "kube_scheduler")):
        rows.append(row(f"{comp} peak RSS", lambda d, k=key: _mib(d.get(f"{k}_peak_rss_bytes"))))
    rows.append(row("control plane CPU, idle at full size", lambda d: (
        f"**{_num(d.get('control_plane_cpu_cores_idle'))} cores** (mean over {_num(d.get('idle_window_seconds'))} s)")))
    comps = sorted({c for d in ds for c in (d.get("control_plane_cpu_cores_idle_by_component") or {})})
    for c in comps:
        rows.append(row(f"- of it {c}", lambda d, c=c: (
            f"{_num((d.get('control_plane_cpu_cores_idle_by_component') or {}).get(c))} cores")))
    comps = sorted({c for d in ds for c in (d.get("control_plane_cpu_seconds_through_bringup_by_component") or {})})
    for c in comps:
        rows.append(row(f"{c} CPU through bring-up", lambda d, c=c: (
            _s((d.get("control_plane_cpu_seconds_through_bringup_by_component") or {}).get(c)))))
    if any("control_plane_cores_through_bringup" in d for d in ds):
        rows.append(row("control plane cores from its start to all schedulable (of the machine's CPUs)", lambda d: (
            f"**{_num(d.get('control_plane_cores_through_bringup'))}** of {_num((d.get('machine') or {}).get('cpus'))}"
            if "control_plane_cores_through_bringup" in d else "not measured")))
    for key, moment in (("cpu_to_all_ready", "all Ready=True"), ("cpu_to_all_schedulable", "all schedulable")):
        if not any(d.get(key) for d in ds):
            continue
        name = f"first create to {moment}: the machine's CPUs busy; the shortest it could be on them (CPU-s of work)"
        rows.append(row(name, lambda d, k=key: (
            f"**{_num(round(100 * d[k]['machine_busy_share']))} %**; {_s(d[k]['cpu_bound_seconds'])} "
            f"({_num(d[k]['machine_busy_cpu_seconds'])} CPU-s)" if d.get(k) else "not measured")))
        procs = sorted({c for d in ds for c in ((d.get(key) or {}).get("cpu_seconds_by_process") or {})})
        for c in procs:
            rows.append(row(f"- of it {c}, CPU-s", lambda d, k=key, c=c: (
                _num(((d.get(k) or {}).get("cpu_seconds_by_process") or {}).get(c)) if d.get(k) else "not measured")))
    if any(d.get("node_lifecycle_controller") for d in ds):
        nlc = lambda d: d.get("node_lifecycle_controller") or {}  # noqa: E731
        rows.append(row("node lifecycle controller: median GET / PATCH of a node during bring-up", lambda d: (
            f"{_s(nlc(d).get('get_node_median_s'))} / {_s(nlc(d).get('patch_node_median_s'))}"
            if nlc(d) else "not measured")))
        rows.append(row("node lifecycle controller: its 8 workers' rate at just those medians", lambda d: (
            f"**{_num(nlc(d).get('rate_bound_nodes_per_second'))} nodes/s** "
            "(measured, first create to all schedulable: "
            f"{_num(round(d['nodes'] / d['seconds_to_all_schedulable'], 1))} nodes/s)"
            if nlc(d) and d.get("seconds_to_all_schedulable") else "not measured")))
    if any((d.get("node_lifecycle_queue") or {}).get("busy_workers_mean") for d in ds):
        nlq = lambda d: d.get("node_lifecycle_queue") or {}  # noqa: E731
        rows.append(row("node lifecycle controller, its own metrics: workers busy while its queue was full", lambda d: (
            f"**{_num(nlq(d)['busy_workers_mean'])} of {_num(nlq(d)['workers'])}** for "
            f"{_num(nlq(d)['saturated_seconds'])} s (queue up to {_num(nlq(d)['peak_queue_depth'])} nodes)"
            if nlq(d).get("busy_workers_mean") is not None else "not measured")))
        rows.append(row("node lifecycle controller: one node (GET + PATCH), mean; its client's GET / PATCH, mean",
                        lambda d: (
            f"**{_s(nlq(d)['item_mean_s'])}**, {_num(nlq(d)['items_per_second'])} nodes/s; "
            f"{_s(nlq(d)['kcm_client_get_mean_s'])} / {_s(nlq(d)['kcm_client_patch_mean_s'])}"
            if nlq(d).get("busy_workers_mean") is not None else "not measured")))
    rows.append(row("node lease writes/s (real kubelets at this size)", lambda d: (
        f"{_num((d.get('heartbeat') or {}).get('lease_writes_per_second'))} "
        f"({_num((d.get('heartbeat') or {}).get('real_kubelet_lease_writes_per_second'))})")))
    rows.append(row("kube-controller-manager client QPS", lambda d: _num(d.get("kcm_api_qps"))))
    real = sorted({k for d in ds for k, v in (d.get("real_nodes") or {}).items() if not isinstance(v, (dict, list))})
    for k in real:
        rows.append(row(f"real nodes: {k}", lambda d, k=k: _generic_value(k, (d.get("real_nodes") or {}).get(k))))
    out = [table(["bring-up", *(label(p, d) for p, d in files)], rows)]
    for p, d in files:
        out += ["", source(p, d)]
    meaning = next((d["ready_means"] for d in ds if d.get("ready_means")), None)
    if meaning:
        out += ["", f"Ready means -- {meaning}."]
    return "\n".join(out)


def _burst(path: Path, d: dict) -> str:
    b, sc, two = d.get("burst") or {}, d.get("scheduler") or {}, d.get("second_client") or {}
    run = ((d.get("runs") or [{}])[0].get("locust")) or {}
    jobs = run.get("jobs") or []
    rows = [
        ["burst", f"{b.get('jobs')} jobs × {b.get('job_size')} whole-node pods, {b.get('users')} locust users "
                  f"as {b.get('identity', 'an identity not recorded')}"],
        ["pods created", _num(d.get("pods_created"))],
        ["create rate, locust", f"**{_num(d.get('create_qps'))} pods/s**"],
        ["create rate, an independent client (same token, same requests in flight)",
         f"{_num(two.get('create_qps'))} pods/s"],
        ["ratio (target ≥ " + _num(d.get("create_rate_ratio_target")) + ": the generator is not the bottleneck)",
         _num(d.get("create_rate_ratio"))],
        ["pod create p50 / p99, client side (locust)",
         f"{_s(d.get('create_latency_p50_s'))} / {_s(d.get('create_latency_p99_s'))}"],
        ["pod create p50 / p99, apiserver's histogram",
         f"{_s(d.get('create_latency_server_p50_s'))} / **{_s(d.get('create_latency_server_p99_s'))}**"],
        [f"scheduling throughput (kube-scheduler, client QPS {sc.get('client_qps')}/burst {sc.get('client_burst')})",
         f"{_num(d.get('scheduling_throughput_pods_per_s'))} pods/s"],
        ["pod startup p50 / p99 (watched)",
         f"{_s(d.get('pod_startup_p50_s'))} / {_s(d.get('pod_startup_p99_s'))}"],
        ["of it created → bound p99", _s(d.get("created_to_bound_p99_s"))],
    ]
    if run.get("bound_to_running_p99_s") is not None:
        rows.append(["bound → Running p99", _s(run.get("bound_to_running_p99_s"))])
    if jobs:
        rows.append(["first create → job bound, per job",
                     " / ".join(_s(j.get("first_create_to_all_bound_s")) for j in jobs)])
    rows.append(["429 responses", _num(d.get("responses_429"))])
    g = d.get("gang") or {}
    if g:
        rows.append([f"{_num(g.get('gang_size'))}-pod gang, {g.get('scheduler_build', g.get('scheduler'))}: "
                     f"admission latency", _s(g.get("admission_latency_s"))])
    return table(["burst pod creation", "figure"], rows) + "\n\n" + source(path, d)


def _knee(path: Path, d: dict) -> str:
    knee = d.get("knee_pods_per_s")
    rows = []
    for s in d.get("steps") or []:
        rate = _num(s.get("rate"))
        rows.append([f"**{rate}**" if s.get("rate") == knee else rate, _num(s.get("pods")),
                     _s(s.get("create_latency_server_p99_s")), _s(s.get("create_latency_p99_s")),
                     _s(s.get("pod_startup_server_p99_s")), _s(s.get("pod_startup_p99_s")),
                     f"{_num(s.get('watch_lag_created_p99_s'))} / {_num(s.get('watch_lag_running_p99_s'))} s",
                     _num(s.get("scheduling_throughput_pods_per_s")), _num(s.get("slos_hold"))])
    slos = d.get("slos") or {}
    head = ["steady rate (pods/s)", "pods", "create p99, apiserver", "create p99, locust",
            "startup p99, timestamps", "startup p99, watch", "watch lag p99 (created / Running)", "bound per s",
            "SLOs hold"]
    lines = [table(head, rows), "",
             f"The knee: **{_num(knee)} pods/s** ({d.get('knee_means', 'meaning not recorded')}; SLOs: mutating "
             f"p99 ≤ {_num(slos.get('mutating_p99_s'))} s, pod startup p99 ≤ {_num(slos.get('pod_startup_p99_s'))} s).",
             "", source(path, d)]
    return "\n".join(lines)


def _apf(path: Path, d: dict) -> str:
    f = d.get("flood") or {}
    flow, hon, imp = f.get("flow") or {}, (f.get("clients") or {}).get("honouring") or {}, \
        (f.get("clients") or {}).get("impatient") or {}
    wb = f.get("well_behaved_client") or {}
    per_s = f.get("rejected_per_second_by_flow_schema") or {}
    rejected = "; ".join(f"`{k}`: {_num(v)} ({_num(per_s.get(k))}/s)"
                         for k, v in (f.get("rejected_by_flow_schema") or {}).items()) or "none"
    retry = sorted({int(k) for c in (hon, imp) for k in (c.get("retry_after_s") or {})})

    def client(c):
        return (f"{c.get('created')} of {c.get('planned')} created, "
                f"{_num(c.get('responses_429_per_created_pod'))} × 429 per pod, last create "
                f"{_s(c.get('seconds_flood_start_to_last_create'))} after the flood started")

    def p99(phase):
        return _s((wb.get(phase) or {}).get("p99_s"))
    flood_rows = [
        [f"429s by flow schema (the run's own: `{flow.get('flow_schema', '?')}`)", rejected],
        ["5xx from the apiserver", _num(sum((f.get("apiserver_5xx") or {}).values()))],
        ["clients that honour Retry-After", client(hon)],
        ["clients that retry at once", client(imp)],
        ["Retry-After values seen", ", ".join(f"{r} s" for r in retry) or "--"],
        [f"well-behaved client (`{wb.get('flow', '?')}`) p99: before / during / after",
         f"{p99('baseline')} / {p99('flood')} / {p99('recovery')}, "
         f"{_num(sum((wb.get(ph) or {}).get('responses_429', 0) for ph in ('baseline', 'flood', 'recovery')))} × 429"],
        ["its pods created during the flood: started, startup p99 (timestamps)",
         f"{_num(f.get('probe_pods_started'))}, {_s(f.get('probe_pod_startup_p99_s'))}"],
        ["most overdue node-lease renewal; nodes NotReady",
         f"{_s(f.get('most_overdue_lease_renewal_s'))}; {len(f.get('nodes_not_ready') or []) or 'none'}"],
        ["flood end → recovered", _s(f.get("seconds_flood_end_to_recovered"))],
    ]
    flood_head = [f"flood: {f.get('users')} users, {_num(f.get('noise_seconds'))} s of creates/LISTs/GETs, "
                  f"{flow.get('type', '?')} level of {flow.get('nominal_concurrency_shares', '?')} share(s), "
                  f"{flow.get('limit_response', '?')}", "figure"]
    joins = d.get("node_join") or {}
    out = [table(flood_head, flood_rows)]
    if joins:
        modes = list(joins.values())

        def jrow(name, fn):
            return [name, *(fn(j) for j in modes)]
        cls = {k for j in modes for k in (j.get("join_classification") or {})}
        rows = [
            jrow("registration latency p50 / p99",
                 lambda j: f"{_num(j.get('join_latency_p50_s'))} / {_num(j.get('join_latency_p99_s'))} s"),
            jrow("all registered / all Ready=True, after the first registration",
                 lambda j: f"{_s(j.get('seconds_to_register_all'))} / {_s(j.get('seconds_to_all_ready'))}"),
            jrow("429s, 5xx, existing nodes NotReady", lambda j: (
                f"{_num(j.get('join_429'))}, {_num(j.get('join_5xx'))}, "
                f"{len(j.get('existing_nodes_not_ready') or []) or 'none'}")),
            jrow("another flow's p99 / mutating p99 meanwhile", lambda j: (
                f"{_num((j.get('well_behaved_client') or {}).get('p99_s'))} / "
                f"{_num((j.get('well_behaved_client') or {}).get('mutating_p99_s'))} s")),
        ]
        n = modes[0].get("nodes")
        head = [f"{_num(n)} nodes joining as `system:node:<name>` (classified: "
                + "; ".join(sorted(c.replace("flowschemas/", "").replace("prioritylevelconfigurations/", "")
                                   for c in cls)) + ")",
                *(j.get("mode", "?") for j in modes)]
        out += ["", table(head, rows)]
    cls = d.get("classification_after_bringup") or {}
    if cls:
        out += ["", "Where APF put each component's traffic after bring-up: "
                + "; ".join(f"`{k}`: {v}" for k, v in cls.items()) + "."]
    out += ["", source(path, d)]
    return "\n".join(out)


def _preflight(path: Path, d: dict) -> str:
    c, j, s = d.get("checker") or {}, d.get("join") or {}, d.get("in_service") or {}

    def pct(x):
        x = x or {}
        return f"p50 {_s(x.get('p50_s'))}, p99 {_s(x.get('p99_s'))} (n = {x.get('n')})"
    rows = [
        [f"checker, {_num(c.get('machines'))} simulated machines ({_num(c.get('faulty'))} faulty) in one process",
         f"**{_s(c.get('one_process_s'))}** ({_num(c.get('per_machine_ms'))} ms a machine), "
         f"{_num(c.get('wrong_verdicts'))} wrong verdicts"],
        [f"checker, a process per machine ({c.get('process_per_machine_sample')} measured, projected)",
         f"{_s(c.get('process_per_machine_s'))} each → {_s(c.get('process_per_machine_projected_s'))}"],
        [f"{_num(j.get('nodes'))} nodes join at once ({_num(j.get('faulty'))} faulty, "
         f"{len(j.get('fault_kinds') or [])} fault kinds): created and Ready / all decided",
         f"{_s(j.get('created_and_ready_s'))} / {_s(j.get('all_decided_s'))}"],
        ["join → quarantine", pct(j.get("time_to_quarantine"))],
        ["join → release", pct(j.get("time_to_release"))],
        ["agent's API requests per joining node decided", _num(j.get("agent_requests_per_decided_node"))],
        ["the whole control plane's requests during the join",
         _num((j.get("apiserver_requests") or {}).get("total"))],
        ["the agent's checker time per node", f"{_num(j.get('agent_check_ms'))} ms"],
        [f"{_num(s.get('faults'))} nodes go bad in service at once, cap {_num(s.get('cap'))}",
         f"waves {' + '.join(str(w) for w in s.get('waves') or [])}; at most {_num(s.get('most_out_at_once'))} "
         f"out at once"],
        ["fault → cordoned", pct(s.get("time_to_cordon"))],
        ["fault → drained", pct(s.get("time_to_drained"))],
        [f"PodDisruptionBudget ({_num(s.get('replicas_under_pdb'))} pods)",
         f"never fewer than {_num(s.get('fewest_ready'))} Ready; {_num(s.get('evictions_refused_429'))} "
         f"evictions refused (429) and retried"],
        ["agent's API requests per node remediated", _num(s.get("agent_requests_per_remediated_node"))],
        ["the control plane's requests over the in-service phase",
         _num((s.get("apiserver_requests") or {}).get("total"))],
        [f"an active sweep of {_num(s.get('sweep_nodes_last'))} in-service nodes", _s(s.get("sweep_s_last"))],
    ]
    gpus = d.get("gpus")
    return (table(["GPU preflight", "figure"], rows) + "\n\n" + (f"GPUs: {gpus}.\n\n" if gpus else "")
            + source(path, d))


def _prometheus(path: Path, d: dict) -> str:
    h, lim, raw = d.get("history") or {}, d.get("with_limits") or {}, d.get("without_limits") or {}

    def answer(a, peak=False):
        if not a:
            return "--"
        what = (f"{a.get('status')} {a.get('error_type')} \"{a.get('error')}\"" if a.get("error")
                else f"{a.get('status')}")
        out = f"{what} after {_s(a.get('elapsed_s'))}"
        if a.get("series") is not None:
            out += f", {_num(a['series'])} series"
        if a.get("samples_read") is not None:
            out += f", {_num(a['samples_read'])} samples read"
        if peak and a.get("peak_samples") is not None:
            out += f", peak {_num(a['peak_samples'])} samples"
        return out

    def burst(m):
        b = m.get("burst") or {}
        el = [a.get("elapsed_s") for a in b.get("answers") or [] if a.get("elapsed_s") is not None]
        st = sorted({str(a.get("status")) for a in b.get("answers") or []})
        rng = f"{_num(min(el))}–{_num(max(el))} s" if el else "--"
        return f"{b.get('queries')} queries, status {'/'.join(st)}, answered after {rng}; " \
               f"{_num(b.get('queue_seconds'))} s in Prometheus' queue"

    def unbounded(m):
        u = m.get("series_unbounded") or {}
        return (f"{answer(u)}, {_kb(u.get('bytes'))}, RSS {_mib(u.get('idle_rss_bytes'))} → "
                f"{_mib(u.get('peak_rss_bytes'))}")

    def flags(m):
        return " ".join(f"`{f}`" for f in m.get("flags") or [])
    seed = [("cluster-wide `histogram_quantile` over every bucket", "histogram-quantile"),
            ("the same as a long range query", "long-range")]
    rows = [[name, answer((lim.get("seed") or {}).get(k)), answer((raw.get("seed") or {}).get(k), True)]
            for name, k in seed]
    rows += [
        ["the same with a larger `timeout=` asked by the client (" + " / ".join(
            str((m.get("request_timeout") or {}).get("asked")) for m in (lim, raw)) + ")",
         answer(lim.get("request_timeout")), answer(raw.get("request_timeout"))],
        ["high-resolution range query over 3 nodes' series", answer(lim.get("max_samples")),
         answer(raw.get("max_samples"), True)],
        ["seed quantiles at once", burst(lim), burst(raw)],
        ["**peak RSS** (idle)", f"**{_mib(lim.get('peak_rss_bytes'))}** ({_mib(lim.get('idle_rss_bytes'))}; "
                                f"bound the suite allows: {_mib(lim.get('limit_bound_bytes'))})",
         f"**{_mib(raw.get('peak_rss_bytes'))}** ({_mib(raw.get('idle_rss_bytes'))}; watchdog bound "
         f"{_mib(raw.get('memory_bound_bytes'))})"],
        ["`/api/v1/series` `{le!=\"\"}` with `limit=`", answer(lim.get("series_limited")),
         answer(raw.get("series_limited"))],
        ["`/api/v1/series` `{le!=\"\"}`, no limit", f"**{unbounded(lim)}**", unbounded(raw)],
        ["a cheap query right after", answer(lim.get("cheap_after")), answer(raw.get("cheap_after"))],
    ]
    hist = (f"{_num(h.get('nodes'))}-node history: {_num(h.get('series'))} series, {_num(h.get('bucket_series'))} "
            f"bucket series, {_num(h.get('samples'))} samples ({h.get('minutes')} min at {h.get('interval_s')} s)")
    out = [table([hist, f"with limits ({flags(lim)})", f"without ({flags(raw)})"], rows)]
    w = d.get("wal_replay") or {}
    if w:
        def mmm(key):
            x = w.get(key) or {}
            return f"{_num(x.get('min'))} / {_num(x.get('median'))} / {_num(x.get('max'))} s"
        out += ["", table(
            [f"WAL replay: {_num(w.get('series'))} series × {w.get('scrapes')} scrapes, "
             f"{_kb(w.get('wal_bytes'))} of WAL", "GOMAXPROCS=1", "GOMAXPROCS=2 (all cores)"],
            [["WAL replay, min / median / max", mmm("wal_replay_duration_s_gomaxprocs_1"),
              f"**{mmm('wal_replay_duration_s_gomaxprocs_2')}**"],
             ["restart to `/-/ready`, min / median / max", mmm("ready_s_gomaxprocs_1"), mmm("ready_s_gomaxprocs_2")]])]
    v = d.get("versions") or {}
    la = d.get("load_average_at_start")
    out += ["", (f"Prometheus {v.get('prometheus', '?')} (module {v.get('module', '?')}); history built in "
                 f"{_s(h.get('build_s'))}" + (f"; load average {la[0]:.1f} at the start" if la else "") + "."),
            "", source(path, d)]
    return "\n".join(out)


def _watch(path: Path, d: dict) -> str:
    groups = ("endpointslices/protobuf", "endpointslices/json", "endpoints/protobuf", "endpoints/json")
    rows = []
    for s in d.get("sizes") or []:
        g = s.get("groups") or {}
        trunc = (s.get("endpoints_object") or {}).get("annotations", {}).get("endpoints.kubernetes.io/over-capacity")
        agree = [a.get("relative_difference") for a in (s.get("apiserver_agreement") or {}).values()]
        rows.append([_num(s.get("endpoints")) + (f" (Endpoints {trunc})" if trunc else ""),
                     *(_kb((g.get(k) or {}).get("bytes_per_churn_change")) for k in groups),
                     _num((s.get("endpoints_to_endpointslice_bytes") or {}).get("protobuf")),
                     "--" if not agree else f"largest difference {max(agree):.4%}"])
    out = [table(["endpoints", "EndpointSlice protobuf", "EndpointSlice JSON", "Endpoints protobuf",
                  "Endpoints JSON", "Endpoints / EndpointSlice (protobuf)",
                  "harness vs `apiserver_watch_events_sizes`"], rows)]
    out += ["", f"Bytes per churn change per watcher. Bytes: {d.get('bytes_mean', 'not described')}. "
                f"Pods: {_num(d.get('pods_created_per_s'))} created/s, {_num(d.get('pods_deleted_per_s'))} "
                f"deleted/s; {_num(d.get('watchers_per_api_and_encoding'))} watchers per API and encoding."]
    proj = d.get("projection_bytes_per_s") or {}
    if proj:
        sizes = sorted({int(n) for pts in proj.values() for n, _ in pts})
        prow = [[name, *(_kb(dict((int(n), b) for n, b in pts).get(n)) + "/s" for n in sizes)]
                for name, pts in proj.items()]
        st = d.get("settings") or {}
        out += ["", table([f"projected watch egress at {_num(st.get('watch_projection_changes_per_node_hour'))} "
                           f"change per node per hour, one watcher per node", *(f"{n:,} nodes" for n in sizes)],
                          prow)]
    cap = d.get("watcher_capacity") or {}
    if cap.get("steps"):
        crow = [[f"{_num(s.get('streams'))} ({_num(s.get('watchers_per_group'))})", _num(s.get("kept_up")),
                 f"{_num(s.get('received_mb_per_s'))} MB/s",
                 _s(max((s.get("delivery_spread_p99_s") or {0: None}).values(), key=lambda x: x or 0)),
                 _s(s.get("harness_cpu_s")), _s(s.get("apiserver_cpu_s")), _s(s.get("window_s"))]
                for s in cap["steps"]]
        out += ["", table(["streams (per API and encoding)", "every watcher kept up", "received",
                           "spread p99 (worst API/encoding)", "harness CPU", "kube-apiserver CPU", "window"], crow)]
    out += ["", source(path, d)]
    return "\n".join(out)


def _generic_value(key: str, v) -> str:
    """A value named by its key's suffix: ``_s`` seconds, ``_bytes`` bytes, ``_per_s`` a rate."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if key.endswith("_bytes"):
            return _mib(v)
        if key.endswith("_per_s"):
            return f"{_num(v)}/s"
        if key.endswith("_s") or key.startswith("seconds"):
            return _s(v)
        if key.endswith("_ms"):
            return f"{_num(v)} ms"
    return _num(v) if isinstance(v, (int, float)) else str(v)


def _figures(path: Path, d: dict) -> str:
    """A file written with ``"figures"`` (``bench.common.write``): each figure with unit and threshold."""
    rows = []
    for f in (d.get("figures") or {}).values():
        thr = "" if f.get("threshold") is None else f"{f.get('op') or '<='} {_num(f['threshold'])} {f.get('unit', '')}"
        rows.append([f.get("name", "?"), f"{_num(f.get('value'))} {f.get('unit', '')}".strip(), thr.strip(),
                     f.get("verdict") or ""])
    return table(["figure", "value", "threshold", "verdict"], rows) + "\n\n" + source(path, d)


def _fallback(path: Path, d: dict) -> str:
    """A shape no renderer knows: its top-level numbers, named by key."""
    rows = [[f"`{k}`", _generic_value(k, v)] for k, v in d.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return table(["figure", "value"], rows or [["(no top-level figures)", "--"]]) + "\n\n" + source(path, d)


RENDERERS: dict[str, Callable[[Path, dict], str]] = {
    "burst": _burst, "knee": _knee, "apf": _apf, "preflight": _preflight, "prometheus": _prometheus,
    "watch_bandwidth": _watch,
}


def _read(path: Path) -> dict:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise BenchTablesError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(d, dict):
        raise BenchTablesError(f"{path}: not a JSON object")
    return d


def blocks(bench_dir: Path) -> dict[str, str]:
    """Every table block, by name: ``bringup`` for all ``bringup*.json``, the file's stem otherwise."""
    files = sorted(bench_dir.glob("*.json"))
    if not files:
        raise BenchTablesError(f"{bench_dir}: no *.json bench files")
    out: dict[str, str] = {}
    bringups = [(p, _read(p)) for p in files if p.stem.startswith("bringup")]
    if bringups:
        bringups.sort(key=lambda pd: (pd[0].stem != "bringup", pd[0].stem))
        out["bringup"] = _bringup(bringups)
    for p in files:
        if p.stem.startswith("bringup"):
            continue
        d = _read(p)
        render = RENDERERS.get(p.stem) or (_figures if d.get("figures") else _fallback)
        try:
            out[p.stem] = render(p, d)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise BenchTablesError(f"{p}: cannot render ({type(e).__name__}: {e})") from None
    return out


def printed(bench_dir: Path, names: list[str] | None = None) -> str:
    """What the command prints: each block between its markers, ready to paste into a page."""
    bl = blocks(bench_dir)
    unknown = [n for n in names or [] if n not in bl]
    if unknown:
        raise BenchTablesError(f"no bench table named {', '.join(unknown)} (there are: {', '.join(bl)})")
    return "\n\n".join(_marked(n, bl[n]) for n in (names or bl))


def rewrite(text: str, bl: dict[str, str], where: str = "page") -> str:
    """``text`` with every marked block replaced by the current one (an unknown name is an error)."""
    def sub(m: re.Match) -> str:
        name = m.group(1)
        if name not in bl:
            raise BenchTablesError(f"{where}: marker bench-tables: {name} names no bench table "
                                   f"(there are: {', '.join(bl)})")
        return _marked(name, bl[name])
    return _MARKER.sub(sub, text)


def _marked(name: str, block: str) -> str:
    """A block between its markers, blank lines around it (a table must not touch an HTML comment)."""
    return f"{OPEN.format(name)}\n\n{block}\n\n{CLOSE.format(name)}"


def pages(docs_dir: Path) -> list[Path]:
    """The pages under ``docs_dir`` that hold at least one marked block."""
    return sorted(p for p in docs_dir.rglob("*.md") if _MARKER.search(p.read_text()))


def stale(docs_dir: Path, bench_dir: Path, index: str = "benchmarks.md") -> list[str]:
    """One line per marked block that differs from what the command prints, and per bench table
    missing from ``index``: what differs, and the command that fixes it."""
    bl = blocks(bench_dir)
    problems = []
    for page in pages(docs_dir):
        rel = page.relative_to(docs_dir.parent) if docs_dir.parent in page.parents else page
        for m in _MARKER.finditer(page.read_text()):
            name, committed = m.group(1), m.group(2).strip("\n")
            if name not in bl:
                problems.append(f"{rel}: marker bench-tables: {name} names no bench table (there are: {', '.join(bl)})")
                continue
            if committed != bl[name]:
                old, new = committed.splitlines(), bl[name].splitlines()
                i = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
                problems.append(
                    f"{rel}: table '{name}' differs from what the bench JSON says, at its line {i + 1}:\n"
                    f"    committed: {old[i] if i < len(old) else '(nothing)'}\n"
                    f"    from JSON: {new[i] if i < len(new) else '(nothing)'}\n"
                    f"  run `{COMMAND}` (never edit a generated table by hand)")
    idx = docs_dir / index
    have = set(_MARKER.findall(idx.read_text())) if idx.is_file() else set()
    have = {n for n, _ in have}
    problems += [f"docs/{index}: no table '{n}' (reports/bench has it): add the markers "
                 f"`{OPEN.format(n)}` and `{CLOSE.format(n)}`, then run `{COMMAND}`" for n in bl if n not in have]
    return problems


def write(docs_dir: Path, bench_dir: Path) -> list[Path]:
    """Rewrite every page's marked blocks in place; returns the pages that changed."""
    bl = blocks(bench_dir)
    changed = []
    for page in pages(docs_dir):
        old = page.read_text()
        new = rewrite(old, bl, str(page))
        if new != old:
            page.write_text(new)
            changed.append(page)
    return changed
