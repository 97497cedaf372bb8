"""Every run's figures in one file, its verdict in the terminal, and the comparison with a baseline.

Why: the Allure report is for reading; a run also needs a machine-readable
record to compare with (``summary.json`` in the run's output directory: what produced it --
clusterproof's version and commit, the Kubernetes versions, the profile's hash, see
``clusterproof.report.origin`` --, each check's outcome, and every figure a check measured with its
unit and which direction is better),
and a short table an SRE pastes into a chat. ``--cp-baseline PATH`` compares
this run with an earlier summary (or the median of a folder of them, see
``clusterproof.report.compare``): the table is printed, written to
``comparison.json`` beside the summary, attached to the report as a check of its own,
and a regression beyond tolerance ends the run with exit status 6 even when
every check passed.

The session's state is one ``ReportSession`` (created in ``pytest_configure``
by ``clusterproof.fixtures.report``, which holds the hooks): the run's
``Figures`` (``clusterproof.core.measurement``: what each check recorded
through the ``figures`` fixture), each check's outcome, and the time each
suite took (``clusterproof.report.timing``). summary.json is built from it.
Pure: no pytest, no domain.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from clusterproof.core.measurement import Figures
from clusterproof.core.texttable import text_table
from clusterproof.report import compare, timing
from clusterproof.report.origin import Origin, Source, shown
from clusterproof.report.origin import source as read_source

BAD_OR_SKIPPED = ("failed", "error", "xfailed", "skipped")
# The gang mechanisms a run judges, side by side (``gang_mechanisms``): a check of the gang suite is a
# mechanism's by its parameter, every check of the Kueue suite is Kueue's.
GANG_SUITE, KUEUE_SUITE = "suites/test_gang_scheduling.py", "suites/test_kueue_admission.py"
GANG_PARAMS = {"coscheduling": "Coscheduling (scheduler-plugins)", "native": "native (Kubernetes Workload API)"}
KUEUE = "Kueue + JobSet (default scheduler)"
SUITES_PACKAGE = "clusterproof.suites"


def check_id(nodeid: str, module: str) -> str:
    """A check's id in figures, summary.json and baselines: ``suites/<file>::<name>`` for a check of a shipped
    suite however pytest reached it -- a checkout's ``suites/`` (node id ``suites/test_x.py::name``) or an
    installed ``clusterproof run`` (``--pyargs clusterproof.suites``: node ids relative to the package's
    folder, ``test_x.py::name``) -- so that a figure of one compares with the other; any other check (a team's,
    a self-test) keeps its node id. ``module``: the check's module name."""
    if not module.startswith(SUITES_PACKAGE + "."):
        return nodeid
    _, sep, rest = nodeid.partition("::")
    return f"suites/{module.removeprefix(SUITES_PACKAGE + '.')}.py{sep}{rest}"


@dataclass
class ReportSession:
    """What the report keeps for one pytest session (never in module globals: two sessions in one
    process -- pytester, a self-test -- each have their own)."""
    figures: Figures = field(default_factory=Figures)
    checks: dict[str, dict] = field(default_factory=dict)     # check id -> {title, outcome, message}
    titles: dict[str, str] = field(default_factory=dict)      # check id -> the check's sentence
    ids: dict[str, str] = field(default_factory=dict)         # node id -> check id (``check_id``), at collection
    timing: timing.Timing = field(default_factory=timing.Timing)
    work: list[dict] = field(default_factory=list)            # each module's API work (clusterproof.cluster.apiwork)
    started: float = field(default_factory=time.time)
    baseline: dict | None = None                              # the loaded --cp-baseline
    summary_path: Path | None = None                          # written at the end of a suite run
    summary: dict | None = None
    comparison: compare.Comparison | None = None
    source: Source | None = None                              # the code that ran: read once, when first needed
    export_formats: tuple[str, ...] = ()                      # --cp-export (clusterproof.report.export)
    pushgateway: str | None = None                            # --cp-pushgateway
    exports: list[str] = field(default_factory=list)          # what the exports wrote, one line each

    def code(self) -> Source:
        """clusterproof's version and commit (``clusterproof.report.origin``), read from git once a session."""
        if self.source is None:
            self.source = read_source()
        return self.source

    def origin(self, profile, cluster) -> Origin:
        """What produced this run's results: the code, the cluster's server version, the profile."""
        return Origin.of(self.code(), profile, getattr(cluster, "server_version", None))

    def log_outcome(self, report) -> None:
        """One phase's report (a pytest TestReport) -> the check's outcome and its message."""
        outcome = outcome_of(report)
        if outcome is None:
            return
        check = self.check_of(report.nodeid)
        entry = self.checks.setdefault(check, {"title": self.titles.get(check, check)})
        if report.when == "teardown" and entry.get("outcome") in ("failed", "skipped", "xfailed"):
            return   # the check's own verdict stands; a teardown error of a failed check adds nothing
        entry["outcome"] = outcome
        if outcome in BAD_OR_SKIPPED and report.longrepr is not None:
            msg = getattr(report, "wasxfail", "") or first_line(report)
            entry["message"] = msg[:300]

    def check_of(self, nodeid: str) -> str:
        """The check id of a node id collected in this session (an xdist controller collects none: the node id)."""
        return self.ids.get(nodeid, nodeid)

    def is_suite_run(self) -> bool:
        """A run of the suites (self-tests keep no summary: they drive suites in runs of their own)."""
        return any(nodeid.startswith("suites/") for nodeid in self.checks)


def outcome_of(report) -> str | None:
    """A check's outcome from one phase's report; None when this phase decides nothing."""
    xfail = hasattr(report, "wasxfail")
    if report.when == "call":
        if xfail:
            return "xfailed" if report.skipped else "xpassed"
        return report.outcome
    if report.when == "setup" and report.outcome != "passed":
        return ("xfailed" if xfail else "skipped") if report.skipped else "error"
    if report.when == "teardown" and report.failed:
        return "error"
    return None


def first_line(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message.strip().splitlines()[0] if crash.message.strip() else ""
    if isinstance(report.longrepr, tuple):      # a skip: (file, line, reason)
        return str(report.longrepr[2])
    return str(report.longrepr).strip().splitlines()[-1] if str(report.longrepr).strip() else ""


def build(state: ReportSession, profile, cluster, run_id: str, exitstatus: int) -> dict:
    """summary.json: the run's facts, every check's outcome, and every figure of the store (each suite's
    time among them)."""
    for f in state.timing.figures(profile):
        state.figures.add(f)
    c = cluster
    run = {"id": run_id, **state.origin(profile, c).summary_fields(), "profile": getattr(profile, "name", None),
           "nodes": getattr(profile, "nodes", None),
           "kubernetes": (c.server_version if c is not None else None)
           or getattr(profile, "kubernetes_version", None),
           "backend": getattr(c, "backend", None), "simulated": getattr(c, "simulated", None),
           "real_nodes": len(c.real.nodes) if getattr(c, "real", None) is not None else 0,
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(state.started)),
           "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "seconds": round(time.time() - state.started, 1), "pytest_exit": int(exitstatus)}
    checks = dict(sorted(state.checks.items()))
    return {"schema": compare.SCHEMA, "run": run, "checks": checks, "gang_mechanisms": gang_mechanisms(checks),
            "figures": state.figures.to_json()}


def write(state: ReportSession, path: Path, summary: dict, baseline_path: str | None, tolerance,
          alluredir: str | None) -> None:
    """summary.json written; with a baseline, the comparison too (comparison.json, and a result of its
    own in the Allure results)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=1))
    state.summary_path, state.summary = path, summary
    if state.baseline is None:
        return
    c = compare.compare(state.baseline, summary, tolerance)
    (path.parent / "comparison.json").write_text(json.dumps(c.to_json(), indent=1))
    state.comparison = c
    if alluredir:
        attach_comparison(Path(alluredir), c, baseline_path)


def attach_comparison(alluredir: Path, c: compare.Comparison, baseline_path: str) -> None:
    """The comparison as a result of its own in the Allure report (the table attached, a regression red)."""
    alluredir.mkdir(parents=True, exist_ok=True)
    now = int(time.time() * 1000)
    table = f"{uuid.uuid4()}-attachment.html"
    data = f"{uuid.uuid4()}-attachment.json"
    (alluredir / table).write_text(compare.html_report(c))
    (alluredir / data).write_text(json.dumps(c.to_json(), indent=1))
    plot = change_plot(c)
    attachments = []
    if plot:
        attachments.append({"name": "change of each judged figure against the baseline (%)",
                            "source": f"{uuid.uuid4()}-attachment.png", "type": "image/png"})
        (alluredir / attachments[-1]["source"]).write_bytes(plot)
    title = ("This run regressed against its baseline" if c.regressed
             else "This run holds its baseline's figures within tolerance")
    result = {
        "uuid": str(uuid.uuid4()), "historyId": "clusterproof-baseline-comparison",
        "testCaseId": "clusterproof-baseline-comparison", "name": title, "fullName": "baseline comparison",
        "status": "failed" if c.regressed else "passed",
        "statusDetails": {"message": c.headline()} if c.regressed else {},
        "stage": "finished", "start": now, "stop": now,
        "description": (f"This run (Kubernetes {c.candidate.get('kubernetes')}, profile {c.candidate.get('profile')}) "
                        f"compared with the baseline {baseline_path} ({c.baseline.get('id')}, Kubernetes "
                        f"{c.baseline.get('kubernetes')}): checks that flipped first, then every figure with its "
                        "change and the profile's tolerance (baseline_tolerance_pct, baseline_min_change). "
                        + c.headline()),
        "labels": [{"name": "parentSuite", "value": "baseline comparison"},
                   {"name": "suite", "value": "against the baseline"},
                   {"name": "tag", "value": "comparison"}],
        "attachments": [{"name": "comparison table", "source": table, "type": "text/html"},
                        *attachments, {"name": "comparison (data)", "source": data, "type": "application/json"}],
    }
    (alluredir / f"{result['uuid']}-result.json").write_text(json.dumps(result))


def change_plot(c: compare.Comparison, most: int = 30) -> bytes | None:
    """The judged figures that moved most, as bars of percent change (worse to the right), each
    coloured by its verdict, each with its own tolerance marked. None when nothing was judged."""
    rows = [r for r in c.rows
            if r.verdict in ("regressed", "improved", "within tolerance") and r.change_pct is not None]
    rows = sorted(rows, key=lambda r: -abs(r.change_pct))[:most][::-1]
    if not rows:
        return None
    import io

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    worse = [r.change_pct if r.better == "lower" else -r.change_pct for r in rows]
    colour = {"regressed": "#c62828", "improved": "#2e7d32", "within tolerance": "#90a4ae"}
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(rows) + 1.6), dpi=110)
    ax.barh(range(len(rows)), worse, color=[colour[r.verdict] for r in rows])
    ax.set_yticks(range(len(rows)), [compare.short_key(r.key, 80) for r in rows], fontsize=7)
    ys = [i for i, r in enumerate(rows) if r.tolerance_pct is not None]
    ax.scatter([rows[i].tolerance_pct for i in ys], ys, marker="|", s=160, color="black", zorder=3,
               label="the figure's tolerance, worse side (profile)")
    ax.axvline(0, color="black", linewidth=0.6)
    ax.set_xlabel("change against the baseline, in the figure's worse direction (%)")
    fig.suptitle(f"The {len(rows)} judged figures that moved most\n(red regressed, green improved, grey within "
                 "tolerance or below the smallest change that counts)", fontsize=10)
    ax.legend(loc="lower right", fontsize="small")
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def gang_mechanisms(checks: dict[str, dict]) -> dict[str, dict[str, int]]:
    """{mechanism: {outcome: count}} of the run's gang checks (pure): which mechanism regressed, at a glance."""
    out: dict[str, dict[str, int]] = {}
    for nodeid, chk in checks.items():
        path = nodeid.partition("::")[0]
        if path == KUEUE_SUITE:
            mech = KUEUE
        elif path == GANG_SUITE:
            param = nodeid.rpartition("[")[2].rstrip("]") if nodeid.endswith("]") else ""
            mech = next((name for key, name in GANG_PARAMS.items() if key in param.split("-")), None)
            if mech is None:
                continue
        else:
            continue
        counts = out.setdefault(mech, {})
        counts[chk.get("outcome", "?")] = counts.get(chk.get("outcome", "?"), 0) + 1
    return out


def terminal_lines(summary: dict, comparison: compare.Comparison | None = None) -> list[str]:
    """The run in a few lines: checks per suite, what failed, the headline figures, the comparison."""
    per_suite: dict[str, dict[str, int]] = {}
    for nodeid, chk in summary["checks"].items():
        suite = timing.suite_of(nodeid)
        per_suite.setdefault(suite, {})
        per_suite[suite][chk.get("outcome", "?")] = per_suite[suite].get(chk.get("outcome", "?"), 0) + 1
    kinds = ["passed", "failed", "error", "xfailed", "xpassed", "skipped"]
    r = summary["run"]
    out = [f"run {r['id']}: profile {r['profile']}, {r['nodes']} nodes, Kubernetes {r['kubernetes']}, "
           f"{'simulated' if r['simulated'] else 'real'} ({r['backend']})"
           + (f" + {r['real_nodes']} real node(s) (kubelet + containerd; GPUs simulated)"
              if r.get("real_nodes") else "") + (f"; {shown(r)}" if shown(r) else "")]
    out.append(text_table(["suite", *kinds], [[suite, *(counts.get(k, 0) or "" for k in kinds)]
                                              for suite, counts in sorted(per_suite.items())], "<" + ">" * len(kinds)))
    gangs = gang_mechanisms(summary["checks"])
    if len(gangs) > 1:
        out.append("gang mechanisms side by side:")
        out.append(text_table(["mechanism", *kinds], [[m, *(c.get(k, 0) or "" for k in kinds)]
                                                      for m, c in sorted(gangs.items())], "<" + ">" * len(kinds),
                              indent="  "))
    bad = [(n, c) for n, c in summary["checks"].items() if c.get("outcome") in ("failed", "error", "xpassed")]
    for _nodeid, chk in bad[:15]:
        out.append(f"  {chk.get('outcome').upper()}: {chk['title']} -- {chk.get('message', '')[:140]}")
    heads = [f for f in summary["figures"].values() if f.get("headline")]
    if heads:
        out.append("headline figures:")
        rows = []
        for f in heads:
            v = "n/a" if f["value"] is None else f"{f['value']:.3g}"
            thr = f" (threshold {f['op']} {f['threshold']:g})" if f.get("threshold") is not None else ""
            rows.append([f["name"], v, f"{f['unit']}{thr}"])
        out.append(text_table((), rows, "<>", gap=1, indent="  "))
    if comparison is not None:
        out.append("against the baseline:")
        out += ["  " + ln for ln in compare.text_report(comparison, limit=12).splitlines()]
    return out


