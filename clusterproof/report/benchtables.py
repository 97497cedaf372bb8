"""The figures tables of the docs, printed from the committed benchmark JSON (reports/bench/*.json).

Why: a figure copied by hand into a page drifts from the measurement it came
from. Each table in ``docs/`` that shows bench figures sits between two marker
comments, ``<!-- bench-tables: NAME -->`` and ``<!-- /bench-tables: NAME -->``;
``clusterproof bench-tables`` prints what belongs there (``--write`` rewrites
the pages in place, ``--check`` fails on a stale one) and
``tests/test_docs.py`` fails when a committed table differs.

Every bench file has one shape (``clusterproof.bench.common.write``): its
context, its typed ``figures`` and its raw ``data``. A table is read from the
figures and the context only, by one renderer driven by a small declarative
spec per block (``BLOCKS``): which files, which figures in which rows, the
caption. A row's cell is a template naming figures (``{create_qps}``); a
table's columns are either the value, or one per bench file (the bring-up
variants side by side), or one per qualifier of the figures it names
(``create_qps[2 workers]``: a sweep's steps side by side). A file no spec
names gets a table of all its figures. Every table says where its figures
come from: the file, the date, the command (or, for files written before
benches recorded it, the profile and overrides), the machine. Pure: reads
JSON, returns text.
"""
from __future__ import annotations

import datetime as dt
import fnmatch
import json
import re
from dataclasses import dataclass
from pathlib import Path

from clusterproof.core.measurement import Figure
from clusterproof.core.texttable import markdown_table

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


def _version(d: dict, name: str) -> str | None:
    """A component's version from a file's context: its own entry's release (``"prometheus": {"release": ...}``),
    else ``versions``."""
    own = d.get(name)
    return (own.get("release") if isinstance(own, dict) else None) or (d.get("versions") or {}).get(name)


# A file of the embedded cluster that does not record its Go runtime was measured before the profile key
# component_go_env existed (2026-11-28), when every component ran with Go's defaults.
GO_DEFAULTS_BEFORE = "Go's defaults (measured before component_go_env existed)"


def source(path: Path, d: dict, versions: tuple[str, ...] = ()) -> str:
    """Where a table's figures come from, as one line below it (``d``: the file's context)."""
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
    cluster = d.get("cluster") or {}
    if cluster.get("backend") == "kwok":   # the embedded components' Go runtime (profile key component_go_env)
        how += f"; Go runtime: {cluster.get('go_runtime') or GO_DEFAULTS_BEFORE}"
    load = _load(d)
    if load is not None:
        machine += f", load average {load} at the end"
    start = d.get("load_average_at_start")
    if isinstance(start, list) and start:
        machine += f" ({start[0]:.1f} at the start)"
    nodes = (d.get("cluster") or {}).get("nodes")
    version = (d.get("cluster") or {}).get("server") or (d.get("versions") or {}).get("kubernetes")
    named = [f"{n} {_version(d, n)}" for n in versions if _version(d, n)]
    where = ", ".join(x for x in (f"{nodes:,} nodes" if isinstance(nodes, int) else "",
                                  f"Kubernetes {version}" if version else "", *named) if x)
    return (f"*`reports/bench/{path.name}`, measured {_date(d)}; {how}; {machine}"
            + (f"; {where}" if where else "") + ".*")


# ---- the one renderer ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Table:
    """One table of a block. ``rows``: (label, cell template); a template names figures in braces --
    ``{name}``, ``{name:n}`` (the number without its unit), ``{name:dec}`` (bytes in decimal units, as a
    network counts them), ``{name[*]}`` (every qualifier of ``name``, joined) -- and a part between
    ``«`` and ``»`` is left out when none of its figures has a value. ``columns``: ``""`` one value column,
    ``"file"`` one per bench file of the block, ``"qualifier"`` one per qualifier of the figures the rows
    name (a figure ``name`` in a row stands for ``name[<the column's qualifier>]``). ``each``: instead of
    ``rows``, a row per figure whose name starts with it (labelled with the rest of the name)."""
    head: str
    rows: tuple[tuple[str, str], ...] = ()
    columns: str = ""
    each: str | None = None


@dataclass(frozen=True)
class Block:
    """The tables between one pair of markers: the bench files they read (a glob under reports/bench;
    ``bringup.json`` first, then by name), the tables, notes (templates, as a cell's) and the component
    versions worth naming in the source line."""
    files: str
    tables: tuple[Table, ...]
    notes: tuple[str, ...] = ()
    versions: tuple[str, ...] = ()


@dataclass(frozen=True)
class BenchFile:
    """What a table may read of a bench file: its name, its context and its figures (never its data)."""
    path: Path
    context: dict
    figures: dict[str, Figure]


_PLACEHOLDER = re.compile(r"\{([^{}]+?)(?::(n|dec))?\}")
_OPTIONAL = re.compile(r"«(.*?)»")
_QUALIFIED = re.compile(r"^(.*)\[(.*)\]$")
MISSING = "not measured"


def _value(f: Figure, fmt: str | None) -> str:
    """A figure's value as a reader wants it, in its unit (``fmt``: ``n`` the number alone, ``dec`` bytes in
    decimal units)."""
    x, unit = f.value, f.unit
    if x is None:
        return "--"
    if unit == "bool":
        return "yes" if x else "no"
    if fmt == "n" or not unit:
        return _num(x)
    if unit == "s":
        return _s(x)
    if unit == "B":
        return _kb(x) if fmt == "dec" else _mib(x)
    if unit == "B/s":
        return _kb(x) + "/s"
    return f"{_num(x)} {unit}"


def fill(template: str, figures: dict[str, Figure], qualifier: str | None) -> str:
    """A cell: each placeholder replaced by its figure's value; an optional part without a value left out;
    ``not measured`` when the file has none of the cell's figures."""
    found = missing = 0

    def one(m: re.Match, part: list[bool]) -> str:
        nonlocal found, missing
        name, fmt = m.group(1), m.group(2)
        if name.endswith("[*]"):
            base = name[:-3]
            fs = [f for n, f in figures.items() if (q := _QUALIFIED.match(n)) and q.group(1) == base]
        else:
            f = figures.get(name if qualifier is None else f"{name}[{qualifier}]")
            fs = [f] if f is not None else []
        if not fs:
            missing += 1
            return "--"
        found += 1
        if any(f.value is not None for f in fs):
            part.append(True)
        return " / ".join(_value(f, fmt) for f in fs)

    def optional(m: re.Match) -> str:
        part: list[bool] = []
        text = _PLACEHOLDER.sub(lambda p: one(p, part), m.group(1))
        return text if part else ""
    text = _OPTIONAL.sub(optional, template)
    text = _PLACEHOLDER.sub(lambda p: one(p, []), text)
    return MISSING if missing and not found else text


def _names(template: str) -> list[str]:
    return [m.group(1) for m in _PLACEHOLDER.finditer(template)]


def _threshold(template: str, figures: dict[str, Figure]) -> str:
    """A row's threshold, when its one figure has one: `` (≤ 1 s)``."""
    names = _names(template)
    f = next((f for n, f in figures.items() if len(names) == 1 and (n == names[0] or n.startswith(names[0] + "["))
              and f.threshold is not None), None)
    if f is None:
        return ""
    op = {"<=": "≤", ">=": "≥"}.get(f.op or "", f.op)
    return f" ({op} {_value(Figure.of('', '', f.threshold, f.unit), None)})"


def _qualifiers(rows: list[tuple[str, str]], figures: dict[str, Figure]) -> list[str]:
    """The qualifiers of the figures the rows name, in the order the file lists them."""
    wanted = {n for _, t in rows for n in _names(t)}
    out: list[str] = []
    for n in figures:
        q = _QUALIFIED.match(n)
        if q and q.group(1) in wanted and q.group(2) not in out:
            out.append(q.group(2))
    return out


def render_table(t: Table, files: list[BenchFile]) -> str:
    """One table of figures, from the files' figures only."""
    first = files[0].figures
    rows = list(t.rows)
    if t.each is not None:
        bases = dict.fromkeys((q.group(1) if (q := _QUALIFIED.match(n)) and t.columns == "qualifier" else n)
                              for n in first if n.startswith(t.each))
        rows = [(n[len(t.each):] or n, "{" + n + "}") for n in bases]
    if t.columns == "file":
        head = [t.head, *(f"`{b.path.name}`" for b in files)]
        body = [[label + _threshold(tpl, first), *(fill(tpl, b.figures, None) for b in files)] for label, tpl in rows]
        return markdown_table(head, body)
    if t.columns == "qualifier":
        qs = _qualifiers(rows, first)
        body = [[label + _threshold(tpl, first), *(fill(tpl, first, q) for q in qs)] for label, tpl in rows]
        return markdown_table([t.head, *qs], body)
    body = [[label, fill(tpl, first, None)] for label, tpl in rows]
    judged = [f for _, tpl in rows for n in _names(tpl) if (f := first.get(n)) is not None and f.threshold is not None]
    if judged:     # a column for the threshold and the verdict, when the table holds a judged figure
        for row, (_, tpl) in zip(body, rows):
            fs = [first[n] for n in _names(tpl) if n in first and first[n].threshold is not None]
            row += [_threshold(tpl, first).strip(" ()") if fs else "", fs[0].verdict or "" if fs else ""]
        return markdown_table([t.head, "value", "threshold", "verdict"], body)
    return markdown_table([t.head, "value"], body)


def render(block: Block, files: list[BenchFile]) -> str:
    """A block: its tables, its notes (from the first file's figures), the source line of each file."""
    out = [render_table(t, files) for t in block.tables]
    out += [fill(n, files[0].figures, None) for n in block.notes]
    out += [source(b.path, b.context, block.versions) for b in files]
    return "\n\n".join(out)


# ---- the tables of the docs ---------------------------------------------------------------------------

T = Table
COMPONENTS = ("kube-apiserver", "etcd", "kwok-controller", "kube-controller-manager", "kube-scheduler")
PROCESSES = (*COMPONENTS, "harness (this process)")
NIGHTLY_SUITES = ("api_overload", "burst_pod_creation", "cluster_scale", "gang_scheduling", "gpu_preflight",
                  "kueue_admission", "prometheus_limits", "real_nodes", "taint_isolation", "watch_bandwidth")
NIGHTLY_COMPONENTS = ("kube-apiserver", "etcd", "kwok-controller", "kube-controller-manager", "kube-scheduler",
                      "coscheduling-scheduler", "podgroup-controller", "kueue", "jobset")

BLOCKS: dict[str, Block] = {
    "bringup": Block("bringup*.json", (T("bring-up", columns="file", rows=(
        ("nodes", "{nodes:n}"),
        ("heartbeat factor (node lease and monitor periods × it)", "{heartbeat_factor}"),
        ("node lease writes/s (real kubelets at this size)",
         "{lease_writes_per_second} ({real_kubelet_lease_writes_per_second:n})"),
        ("kube-controller-manager client QPS", "{kcm_api_qps:n}"),
        ("all nodes Ready=True, after the first create", "**{seconds_to_all_ready}**"),
        ("all nodes schedulable (not-ready taint lifted)", "**{seconds_to_all_schedulable}**"),
        ("creating the Node objects", "{seconds_create_all_nodes}"),
        ("control plane start", "{seconds_control_plane_start}"),
        ("kube-apiserver peak RSS", "{apiserver_peak_rss_bytes}"),
        ("etcd peak RSS", "{etcd_peak_rss_bytes}"),
        ("kwok peak RSS", "{kwok_peak_rss_bytes}"),
        ("kube-controller-manager peak RSS", "{kube_controller_manager_peak_rss_bytes}"),
        ("kube-scheduler peak RSS", "{kube_scheduler_peak_rss_bytes}"),
        ("control plane CPU, idle at full size (mean over the window)",
         "**{control_plane_cpu_cores_idle}** (over {idle_window_seconds})"),
        *((f"- of it {c}", f"{{control_plane_cpu_cores_idle[{c}]}}") for c in sorted(COMPONENTS)),
        *((f"{c} CPU from its start through bring-up", f"{{control_plane_cpu_seconds_through_bringup[{c}]}}")
          for c in sorted(COMPONENTS)),
        ("control plane cores from its start to all schedulable (of the machine's CPUs)",
         "**{control_plane_cores_through_bringup:n}**"),
        *((f"first create to {moment}: the machine's CPUs busy; the shortest it could be on them (CPU-s of work)",
           f"**{{machine_busy_percent_to_{w}}}**; {{cpu_bound_seconds_to_{w}}} ({{machine_busy_cpu_seconds_to_{w}}})")
          for w, moment in (("all_ready", "all Ready=True"),)),
        *((f"- of it {p}", f"{{cpu_seconds_to_all_ready[{p}]}}") for p in sorted(PROCESSES)),
        ("first create to all schedulable: the machine's CPUs busy; the shortest it could be on them (CPU-s of work)",
         "**{machine_busy_percent_to_all_schedulable}**; {cpu_bound_seconds_to_all_schedulable} "
         "({machine_busy_cpu_seconds_to_all_schedulable})"),
        *((f"- of it {p}", f"{{cpu_seconds_to_all_schedulable[{p}]}}") for p in sorted(PROCESSES)),
        ("node lifecycle controller: median GET / PATCH of a node during bring-up",
         "{node_lifecycle_get_node_median_s} / {node_lifecycle_patch_node_median_s}"),
        ("nodes made schedulable per second, first create to all schedulable; the node lifecycle controller's "
         "8 workers' bound at just those medians",
         "{nodes_per_s_to_all_schedulable}«; **{node_lifecycle_rate_bound_nodes_per_second}**»"),
        ("node lifecycle controller, its own metrics: workers busy while its queue was full, for how long "
         "(the queue's peak)", "**{node_lifecycle_queue_busy_workers_mean:n} of {node_lifecycle_queue_workers:n}** for "
         "{node_lifecycle_queue_saturated_seconds} ({node_lifecycle_queue_peak_queue_depth})"),
        ("node lifecycle controller: one node (GET + PATCH), mean, and the rate; its client's GET / PATCH, mean",
         "**{node_lifecycle_queue_item_mean_s}**, {node_lifecycle_queue_items_per_second}; "
         "{node_lifecycle_queue_kcm_client_get_mean_s} / {node_lifecycle_queue_kcm_client_patch_mean_s}"),
    )),), notes=("Ready means -- all_ready: every node reports Ready=True; all_schedulable: and the node lifecycle "
                 "controller has lifted its not-ready taint.",)),
    "apf": Block("apf.json", (
        T("flood: a Limited level and a flow schema of its own", rows=(
            ("users; seconds of creates/LISTs/GETs; the flood's length",
             "{flood_users:n}; {flood_noise_s}; {flood_seconds}"),
            ("the flood's level: nominal concurrency shares; rejects at once (no queues)",
             "{flood_level_shares:n}; {flood_level_rejects}"),
            ("429s to the run's own flow schema (per second)",
             "{flood_429_own_flow_schema:n} ({flood_429_per_s_own_flow_schema:n}/s)"),
            ("429s to any other flow schema", "{flood_429_other_flow_schemas:n}"),
            ("5xx from the apiserver", "{flood_apiserver_5xx:n}"),
            ("well-behaved client (another flow) p99: before / during / after",
             "{well_behaved_p99_s[baseline]} / {well_behaved_p99_s[flood]} / {well_behaved_p99_s[recovery]}, "
             "{well_behaved_429:n} × 429"),
            ("its pods created during the flood: started, startup p99 (timestamps)",
             "{probe_pods_started:n}, {probe_pod_startup_p99_s}"),
            ("most overdue node-lease renewal; nodes NotReady", "{most_overdue_lease_renewal_s}; {nodes_not_ready:n}"),
            ("flood end → recovered", "{seconds_flood_end_to_recovered}"))),
        T("clients of the flood", columns="qualifier", rows=(
            ("pods created of planned", "{created:n} of {planned:n}"),
            ("429s per created pod", "{responses_429_per_created_pod}"),
            ("last create after the flood started", "{seconds_flood_start_to_last_create}"))),
        T("Retry-After values seen (429s that carried it)", columns="qualifier", rows=(
            ("responses", "{retry_after_responses:n}"),)),
        T("nodes joining as `system:node:<name>`", columns="qualifier", rows=(
            ("nodes", "{join_nodes:n}"),
            ("registration latency p50 / p99", "{join_latency_p50_s} / {join_latency_p99_s}"),
            ("all registered / all Ready=True, after the first registration",
             "{seconds_to_register_all} / {seconds_to_all_ready}"),
            ("429s, 5xx, existing nodes NotReady", "{join_429:n}, {join_5xx:n}, {existing_nodes_not_ready:n}"),
            ("another flow's p99 / mutating p99 meanwhile",
             "{join_well_behaved_p99_s} / {join_well_behaved_mutating_p99_s}"))),
        T("the joins' requests, classified", columns="qualifier", each="join_requests_classified "),
        T("where APF put each component's traffic after bring-up", each="requests_classified "))),
    "burst": Block("burst.json", (T("burst pod creation", rows=(
        ("burst: jobs × whole-node pods, locust users (as a ServiceAccount token: APF flow schema service-accounts)",
         "{burst_jobs:n} × {burst_job_size:n}, {burst_users:n} users"),
        ("pods created", "{pods_created}"),
        ("create rate, locust", "**{create_qps}**"),
        ("create rate, an independent client (same token, same requests in flight)", "{create_qps_second_client}"),
        ("ratio locust / independent client (the generator is not the bottleneck)", "{create_rate_ratio}"),
        ("pod create p50 / p99, client side (locust)", "{create_latency_p50_s} / {create_latency_p99_s}"),
        ("pod create p50 / p99, apiserver's histogram",
         "{create_latency_server_p50_s} / **{create_latency_server_p99_s}**"),
        ("scheduling throughput (kube-scheduler, client QPS / burst)",
         "{scheduling_throughput_pods_per_s} ({scheduler_client_qps:n} / {scheduler_client_burst:n})"),
        ("pod startup p50 / p99 (watched)", "{pod_startup_p50_s} / {pod_startup_p99_s}"),
        ("of it created → bound p99", "{created_to_bound_p99_s}"),
        ("bound → Running p99", "{bound_to_running_p99_s}"),
        ("first create → job bound, per job", "{first_create_to_job_bound_s[*]}"),
        ("429 responses", "{responses_429:n}"),
        ("one gang through Coscheduling (scheduler-plugins): pods, admission latency (last create → all bound)",
         "{gang_size:n}, {gang_admission_latency_s}"))),), versions=("scheduler-plugins",)),
    "burst_workers": Block("burst_workers.json", (T(
        "locust workers (processes on this machine)", columns="qualifier", rows=(
        ("create rate", "{create_qps}"),
        ("pod create p99, apiserver's histogram", "{create_latency_server_p99_s}"),
        ("pod create p50 / p99, client side", "{create_latency_p50_s} / {create_latency_p99_s}"),
        ("pods created", "{pods_created:n}"),
        ("429 responses", "{responses_429:n}"))),)),
    "knee": Block("knee.json", (T("steady rate", columns="qualifier", rows=(
        ("pods", "{pods:n}"),
        ("create p99, apiserver", "{create_latency_server_p99_s}"),
        ("create p99, locust", "{create_latency_p99_s}"),
        ("startup p99, timestamps", "{pod_startup_server_p99_s}"),
        ("startup p99, watch", "{pod_startup_p99_s}"),
        ("watch lag p99, created / Running", "{watch_lag_created_p99_s} / {watch_lag_running_p99_s}"),
        ("bound per s", "{scheduling_throughput_pods_per_s:n}"),
        ("SLOs hold", "{slos_hold}"))),),
        notes=("The knee: **{knee_pods_per_s}**, the highest step rate at which pod-create p99 (apiserver "
               "histogram) and pod-startup p99 (creationTimestamp -> Ready) both held, every pod Running.",)),
    "kueue": Block("kueue.json", (T("Kueue admission at scale", rows=(
        ("JobSets (ranks) over ClusterQueues, on nodes",
         "{workloads:n} ({pods:n}) over {cluster_queues:n}, on {nodes:n}"),
        ("admitted", "{admitted:n}"),
        ("create → Admitted p50 / p99 / max", "{admit_p50_s} / **{admit_p99_s}** / {admit_max_s}"),
        ("- p99 by the objects' own timestamps (JobSet created, Workload Admitted; to the second)",
         "{admit_p99_by_timestamps_s}"),
        ("admitted per second, first create to last admission", "**{admitted_per_s}**"),
        ("first create → every rank bound; Workloads evicted on the way", "{all_bound_s}; {evicted:n}"),
        ("first create → last admission: cores busy; CPU-s of Kueue, kube-apiserver, etcd, JobSet, the harness",
         "{admission_machine_busy_percent}; {admission_cpu_s[kueue]}, {admission_cpu_s[kube-apiserver]}, "
         "{admission_cpu_s[etcd]}, {admission_cpu_s[jobset]}, {admission_cpu_s[harness]}"))),),
        notes=("Kueue's own performance CI admits 50,000 Workloads over 1,000 ClusterQueues in about 1,179 s "
               "(threshold 1,416 s), about 42 a second, and its topology run 15,000 on 640 nodes in about 401 s "
               "(37 a second): Workloads created directly, no JobSet, Job, pod or scheduler, on a CI machine of "
               "many cores. Here each is a JobSet whose ranks are made and bound, on two cores shared with the "
               "whole control plane.",),
        versions=("kueue", "jobset")),
    "nightly": Block("nightly*.json", (T("the nightly, suite by suite", columns="file", rows=(
        ("the suites' wall clock (pytest; bring-up included)", "**{suites_s}**"),
        ("checks passed / failed / strict xfail / skipped",
         "{checks[passed]:n} / {checks[failed]:n} / {checks[xfailed]:n} / {checks[skipped]:n}"),
        ("embedded cluster bring-up (7,500 nodes created, Ready and schedulable)", "{bringup_s}"),
        ("- first create to all Ready=True / all schedulable", "{ready_s} / {schedulable_s}"),
        *((f"{s.replace('_', ' ')}: time; CPU-s (control plane and harness)", f"{{suite_s[{s}]}}; {{suite_cpu_s[{s}]}}")
          for s in NIGHTLY_SUITES),
        ("the suites' modules: wall clock; the machine's cores busy (components and harness)",
         "{modules_s}; {busy_percent}"),
        ("- CPU-s of the control plane", "**{control_plane_cpu_s}**"),
        *((f"- - of it {c}", f"{{cpu_s[{c}]}}") for c in NIGHTLY_COMPONENTS),
        ("- CPU-s of the harness (with its locust workers)", "{cpu_s[harness]}"),
        *((f"{c} peak RSS", f"{{peak_rss[{c}]}}") for c in sorted(COMPONENTS)),
    )),), notes=("Each column is one `./proof run` on profile nightly, read from its own records (summary.json, "
                 "api-work.json, the report's environment); the Go runtime each ran with is in its source line.",)),
    "preflight": Block("preflight.json", (T("GPU preflight", rows=(
        ("checker, simulated machines (faulty) in one process", "{checker_machines:n} ({checker_faulty:n})"),
        ("- its time, a machine; wrong verdicts",
         "**{checker_one_process_s}**, {checker_per_machine_ms}; {checker_wrong_verdicts:n}"),
        ("checker, a process per machine (measured on a sample): each, projected",
         "{checker_process_per_machine_s}, {checker_process_per_machine_projected_s} "
         "(sample {checker_process_per_machine_sample:n})"),
        ("nodes join at once (faulty, fault kinds)", "{join_nodes:n} ({join_faulty:n}, {join_fault_kinds:n})"),
        ("- created and Ready / all decided", "{join_created_and_ready_s} / {join_all_decided_s}"),
        ("join → quarantine p50 / p99 (nodes)",
         "{join_to_quarantine_p50_s} / {join_to_quarantine_p99_s} ({join_to_quarantine_n:n})"),
        ("join → release p50 / p99 (nodes)",
         "{join_to_release_p50_s} / {join_to_release_p99_s} ({join_to_release_n:n})"),
        ("agent's API requests per joining node decided", "{join_agent_requests_per_decided_node:n}"),
        ("the whole control plane's requests during the join", "{join_apiserver_requests:n}"),
        ("the agent's checker time per node", "{join_agent_check_ms}"),
        ("nodes go bad in service at once; cap", "{in_service_faults:n}; {in_service_cap:n}"),
        ("- waves; at most out at once", "{in_service_wave_nodes[*]:n}; {in_service_most_out_at_once:n}"),
        ("fault → cordoned p50 / p99 (nodes)",
         "{fault_to_cordoned_p50_s} / {fault_to_cordoned_p99_s} ({fault_to_cordoned_n:n})"),
        ("fault → drained p50 / p99 (nodes)",
         "{fault_to_drained_p50_s} / {fault_to_drained_p99_s} ({fault_to_drained_n:n})"),
        ("PodDisruptionBudget: pods under it; never fewer Ready than; evictions refused (429) and retried",
         "{in_service_replicas_under_pdb:n}; {in_service_fewest_ready:n}; {in_service_evictions_refused_429:n}"),
        ("agent's API requests per node remediated", "{in_service_agent_requests_per_remediated_node:n}"),
        ("the control plane's requests over the in-service phase", "{in_service_apiserver_requests:n}"),
        ("an active sweep of the in-service nodes", "{in_service_sweep_s_last} ({in_service_sweep_nodes_last})"))),),
        notes=("GPUs: simulated, go-nvml mock DGX H100 machines through the project's libnvidia-ml.so.1 "
               "(real pynvml).",)),
    "prometheus": Block("prometheus.json", (
        T("the history Prometheus holds", rows=(
            ("nodes, their series (of them buckets), samples",
             "{history_nodes:n}, {history_series} ({history_bucket_series:n}), {history_samples}"),
            ("minutes at an interval of", "{history_minutes:n} at {history_interval_s}"),
            ("built in", "{history_build_s}"))),
        T("Prometheus", columns="qualifier", rows=(
            ("`--query.timeout` / `--query.max-samples` / `--query.max-concurrency`",
             "{query_timeout_s} / {query_max_samples} / {query_max_concurrency}"),
            ("cluster-wide `histogram_quantile` over every bucket: status after",
             "{seed_histogram_quantile_status} after {seed_histogram_quantile_elapsed_s}«, "
             "{seed_histogram_quantile_samples_read} read»«, peak {seed_histogram_quantile_peak_samples}»"),
            ("the same as a long range query",
             "{seed_long_range_status} after {seed_long_range_elapsed_s}«, {seed_long_range_samples_read} read»"
             "«, peak {seed_long_range_peak_samples}»"),
            ("the same with a larger `timeout=` asked by the client",
             "asked {request_timeout_asked_s}: {request_timeout_status} after {request_timeout_elapsed_s}"
             "«, {request_timeout_samples_read} read»"),
            ("high-resolution range query over 3 nodes' series",
             "{max_samples_status} after {max_samples_elapsed_s}«, {max_samples_samples_read} read»"
             "«, peak {max_samples_peak_samples}»"),
            ("seed quantiles at once: status, answered after, in Prometheus' queue",
             "{burst_queries:n} queries, {burst_status}, {burst_elapsed_min_s:n}–{burst_elapsed_max_s}, "
             "{burst_queue_s}"),
            ("**peak RSS** (idle)", "**{peak_rss_bytes}** ({idle_rss_bytes})"),
            ("the RSS bound the suite allows (from the idle RSS and the series selected)", "{limit_bound_bytes}"),
            ("the watchdog's bound (it kills the Prometheus without limits above it)", "{memory_bound_bytes}"),
            ("`/api/v1/series` `{le!=\"\"}` with `limit=`",
             "{series_limited_status} after {series_limited_elapsed_s}, {series_limited_series}"),
            ("`/api/v1/series` `{le!=\"\"}`, no limit: answer, size, RSS idle → peak",
             "{series_unbounded_status} after {series_unbounded_elapsed_s}, {series_unbounded_series}, "
             "{series_unbounded_bytes:dec}, {series_unbounded_idle_rss_bytes} → {series_unbounded_peak_rss_bytes}"),
            ("a cheap query right after", "{cheap_after_status} after {cheap_after_elapsed_s}"))),
        T("WAL replay", columns="qualifier", rows=(
            ("WAL replay, min / median / max",
             "{wal_replay_duration_min_s:n} / {wal_replay_duration_median_s:n} / {wal_replay_duration_max_s}"),
            ("restart to `/-/ready`, min / median / max", "{ready_min_s:n} / {ready_median_s:n} / {ready_max_s}"))),
        T("the WAL replayed", rows=(
            ("series × scrapes, bytes of WAL", "{wal_series:n} × {wal_scrapes:n}, {wal_bytes:dec}"),))),
        notes=("Status 422 with limits: Prometheus' `execution` error, the query cut off at `--query.timeout` "
               "(\"context deadline exceeded\") or refused above `--query.max-samples` (\"query processing would "
               "load too many samples into memory\"); the answers' texts are in the file's data.",),
        versions=("prometheus",)),
    "watch_bandwidth": Block("watch_bandwidth.json", (
        T("bytes per churn change per watcher", columns="qualifier", rows=(
            ("EndpointSlice protobuf", "{bytes_per_churn_change endpointslices/protobuf:dec}"),
            ("EndpointSlice JSON", "{bytes_per_churn_change endpointslices/json:dec}"),
            ("Endpoints protobuf", "{bytes_per_churn_change endpoints/protobuf:dec}"),
            ("Endpoints JSON", "{bytes_per_churn_change endpoints/json:dec}"),
            ("Endpoints / EndpointSlice (protobuf)", "{endpoints_to_endpointslice_bytes protobuf}"),
            ("Endpoints truncated (over capacity)", "{endpoints_truncated}"),
            ("harness vs `apiserver_watch_events_sizes`, largest difference",
             "{apiserver_agreement_largest_difference}"))),
        T("the churn", rows=(
            ("pods created / deleted per second", "{pods_created_per_s:n} / {pods_deleted_per_s:n}"),
            ("watchers per API and encoding", "{watchers_per_api_and_encoding:n}"),
            ("projection: changes per node per hour, one watcher per node", "{projection_changes_per_node_hour:n}"))),
        T("projected watch egress", columns="qualifier", each="projected_egress "),
        T("streams (all APIs and encodings)", columns="qualifier", rows=(
            ("watchers per API and encoding", "{watchers_per_group:n}"),
            ("every watcher kept up", "{kept_up}"),
            ("received", "{received_mb_per_s}"),
            ("delivery spread p99 (worst API/encoding)", "{delivery_spread_p99_s_worst}"),
            ("harness CPU", "{harness_cpu_s}"),
            ("kube-apiserver CPU", "{apiserver_cpu_s}"),
            ("window", "{window_s}")))),
        notes=("Bytes as framed on the watch stream (JSON line with newline, protobuf frame with its 4-byte "
               "length).",)),
}


def read(path: Path) -> BenchFile:
    """A bench file as a table may read it: its context and its figures (``Figure.from_json``), never its data."""
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise BenchTablesError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(d, dict):
        raise BenchTablesError(f"{path}: not a JSON object")
    figs = d.get("figures")
    if not isinstance(figs, list) or not figs:
        raise BenchTablesError(f"{path}: no \"figures\" list (every bench writes one through "
                               f"clusterproof.bench.common.write; a file of another shape cannot be tabulated)")
    try:
        figures = [Figure.from_json(f) for f in figs]
    except (TypeError, ValueError, AttributeError) as e:
        raise BenchTablesError(f"{path}: a figure does not load ({type(e).__name__}: {e})") from None
    context = {k: v for k, v in d.items() if k not in ("figures", "data")}
    return BenchFile(path, context, {f.name: f for f in figures})


def blocks(bench_dir: Path) -> dict[str, str]:
    """Every table block, by name: those of ``BLOCKS`` whose files exist, and for any other bench file a
    table of all its figures under its stem."""
    files = sorted(bench_dir.glob("*.json"))
    if not files:
        raise BenchTablesError(f"{bench_dir}: no *.json bench files")
    out: dict[str, str] = {}
    taken: set[Path] = set()
    for name, block in BLOCKS.items():
        # The file the glob names without its wildcard first (bringup.json), then the variants by name.
        mine = sorted((p for p in files if fnmatch.fnmatch(p.name, block.files)),
                      key=lambda p: (p.name != block.files.replace("*", ""), p.stem))
        if mine:
            out[name] = render(block, [read(p) for p in mine])
            taken.update(mine)
    for p in files:
        if p not in taken:
            out[p.stem] = render(Block(p.name, (Table(p.stem, each=""),)), [read(p)])
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
