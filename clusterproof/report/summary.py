"""Every run's figures in one file, its verdict in the terminal, and the comparison with a baseline.

Why: the Allure report is for reading; a run also needs a machine-readable
record to compare with (``summary.json`` in the run's output directory,
``out/runs/<run id>/``, see ``clusterproof.core.outputs``: each check's outcome, and
every figure a check measured with its unit and which direction is better),
and a short table an SRE pastes into a chat. ``--baseline PATH`` compares
this run with an earlier summary (or the median of a folder of them, see
``clusterproof.report.compare``): the table is printed, written to
``comparison.json`` beside the summary, attached to the report as a check of its own,
and a regression beyond tolerance ends the run with exit status 6 even when
every check passed.

Figures come from ``clusterproof.report.allure.measured`` (what each check shows beside
its threshold) and the time each suite took (``clusterproof.report.timing``).
"""
from __future__ import annotations

import json
import math
import os
import time
import uuid
from pathlib import Path

import pytest

from clusterproof.fixtures import CLUSTER, OUTPUTS, PROFILE, RUN_ID
from clusterproof.report import compare
from clusterproof.report import timing

BASELINE = pytest.StashKey()   # the loaded baseline summary (dict), when --baseline was given

_figures: dict[str, dict] = {}
_checks: dict[str, dict] = {}
_titles: dict[str, str] = {}
_started = [time.time()]
# Units whose smaller value is better, and whose larger is. A ceiling (<=) makes a figure "lower is
# better" whatever its unit (latency, 5xx count); a floor (>=) only for a rate -- a count that must
# reach a number ("at least one 429", "every planned pod") is a verdict, not a figure to improve.
# Anything else is shown, never judged.
_LOWER_UNITS = {"s", "ms", "MiB", "B", "B/s", "bytes"}
_HIGHER_UNITS = {"pods/s", "nodes/s"}


def better_of(unit: str, threshold: float | None, op: str) -> str:
    if threshold is not None and op in ("<=", "<"):
        return "lower"
    if unit in _HIGHER_UNITS and op != "==":
        return "higher"
    if threshold is None and unit in _LOWER_UNITS:
        return "lower"
    return "none"


def _current_check() -> str:
    """The check being run (pytest sets PYTEST_CURRENT_TEST to 'nodeid (phase)')."""
    return os.environ.get("PYTEST_CURRENT_TEST", "outside a check").rsplit(" (", 1)[0]


def record(name: str, value, unit: str, threshold: float | None = None, op: str = "<=",
           better: str | None = None, headline: bool = False) -> None:
    """One figure of the check being run (called by ``clusterproof.report.allure.measured``)."""
    check = _current_check()
    try:
        v = float(value) if value is not None else None
    except (TypeError, ValueError):
        v = None
    if v is not None and not math.isfinite(v):
        v = None
    _figures[f"{check} :: {name}"] = {
        "check": check, "name": name, "value": v, "unit": unit,
        "better": better or better_of(unit, threshold, op),
        "threshold": threshold, "op": op if threshold is not None else None, "headline": headline}


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("clusterproof")
    g.addoption("--baseline", default=None, metavar="PATH",
                help="compare this run with an earlier run's summary.json (or a folder of them: "
                     "their median); exit 6 if a figure regressed beyond the profile's tolerance or a check "
                     "that passed there fails now")
    g.addoption("--summary", default=None, metavar="PATH",
                help="where to write this run's summary (default: summary.json in the run's output directory, "
                     "out/runs/<run id>/); its comparison with --baseline goes beside it")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("baseline", None)
    if path:
        try:
            config.stash[BASELINE] = compare.load(path)
        except compare.SummaryError as e:
            raise pytest.UsageError(f"clusterproof: {e}") from None


def pytest_collection_modifyitems(items) -> None:
    from clusterproof.report.allure import sentence
    for item in items:
        _titles[item.nodeid] = sentence(item)


def outcome_of(report: pytest.TestReport) -> str | None:
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


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    outcome = outcome_of(report)
    if outcome is None:
        return
    entry = _checks.setdefault(report.nodeid, {"title": _titles.get(report.nodeid, report.nodeid)})
    if report.when == "teardown" and entry.get("outcome") in ("failed", "skipped", "xfailed"):
        return   # the check's own verdict stands; a teardown error of a failed check adds nothing
    entry["outcome"] = outcome
    if outcome in ("failed", "error", "xfailed", "skipped") and report.longrepr is not None:
        msg = getattr(report, "wasxfail", "") or _first_line(report)
        entry["message"] = msg[:300]


def _first_line(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message.strip().splitlines()[0] if crash.message.strip() else ""
    if isinstance(report.longrepr, tuple):      # a skip: (file, line, reason)
        return str(report.longrepr[2])
    return str(report.longrepr).strip().splitlines()[-1] if str(report.longrepr).strip() else ""


def build(config: pytest.Config, exitstatus: int) -> dict:
    profile = config.stash.get(PROFILE, None)
    c = config.stash.get(CLUSTER, None)
    figures = dict(_figures)
    for row in timing.rows(profile):
        if row["suite"].startswith("total"):
            continue
        key = f"time :: {row['suite']}"
        figures[key] = {"check": "time per suite", "name": row["suite"], "value": row["seconds"], "unit": "s",
                        "better": "lower", "threshold": row["budget_s"], "op": "<=" if row["budget_s"] else None,
                        "headline": False}
    run = {"id": config.stash.get(RUN_ID, "?"), "profile": getattr(profile, "name", None),
           "nodes": getattr(profile, "nodes", None),
           "kubernetes": (c.server_version if c is not None else None)
           or getattr(profile, "kubernetes_version", None),
           "backend": getattr(c, "backend", None), "simulated": getattr(c, "simulated", None),
           "real_nodes": len(c.real.nodes) if getattr(c, "real", None) is not None else 0,
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(_started[0])),
           "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "seconds": round(time.time() - _started[0], 1), "pytest_exit": int(exitstatus)}
    return {"schema": compare.SCHEMA, "run": run, "checks": dict(sorted(_checks.items())), "figures": figures}


def _is_suite_run(session: pytest.Session) -> bool:
    """A run of the suites (self-tests keep no summary: they drive suites in runs of their own)."""
    return any(nodeid.startswith("suites/") for nodeid in _checks)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if not _is_suite_run(session) or hasattr(config, "workerinput"):
        return
    summary = build(config, exitstatus)
    path = Path(config.getoption("summary") or config.stash[OUTPUTS].summary)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=1))
    config._cp_summary = (path, summary)
    baseline = config.stash.get(BASELINE, None)
    if baseline is None:
        return
    profile = config.stash.get(PROFILE, None)
    c = compare.compare(baseline, summary, compare.Tolerance.of(profile))
    (path.parent / "comparison.json").write_text(json.dumps(c.to_json(), indent=1))
    config._cp_comparison = c
    alluredir = config.getoption("allure_report_dir", None)
    if alluredir:
        attach_comparison(Path(alluredir), c, config.getoption("baseline"))
    if c.regressed and session.exitstatus == 0:
        session.exitstatus = compare.REGRESSION_EXIT


def attach_comparison(alluredir: Path, c: compare.Comparison, baseline_path: str) -> None:
    """The comparison as a result of its own in the Allure report (the table attached, a regression red)."""
    alluredir.mkdir(parents=True, exist_ok=True)
    now = int(time.time() * 1000)
    table = f"{uuid.uuid4()}-attachment.html"
    data = f"{uuid.uuid4()}-attachment.json"
    (alluredir / table).write_text(compare.html_table(c))
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
    rows = [r for r in c.rows if r.verdict in ("regressed", "improved", "within tolerance") and r.change_pct is not None]
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
           + (f" + {r['real_nodes']} real node(s) (kubelet + containerd; GPUs simulated)" if r.get("real_nodes") else "")]
    out.append(f"{'suite':28}" + "".join(f"{k:>9}" for k in kinds))
    for suite, counts in sorted(per_suite.items()):
        out.append((f"{suite:28}" + "".join(f"{counts.get(k, 0) or '':>9}" for k in kinds)).rstrip())
    bad = [(n, c) for n, c in summary["checks"].items() if c.get("outcome") in ("failed", "error", "xpassed")]
    for nodeid, chk in bad[:15]:
        out.append(f"  {chk.get('outcome').upper()}: {chk['title']} -- {chk.get('message', '')[:140]}")
    heads = [f for f in summary["figures"].values() if f.get("headline")]
    if heads:
        out.append("headline figures:")
        for f in heads:
            v = "n/a" if f["value"] is None else f"{f['value']:.3g}"
            thr = f" (threshold {f['op']} {f['threshold']:g})" if f.get("threshold") is not None else ""
            out.append(f"  {f['name']:58} {v:>9} {f['unit']}{thr}")
    if comparison is not None:
        out.append("against the baseline:")
        out += ["  " + ln for ln in compare.text_table(comparison, limit=12).splitlines()]
    return out


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    held = getattr(config, "_cp_summary", None)
    if held is None:
        return
    path, summary = held
    tr = terminalreporter
    tr.section("clusterproof summary")
    for line in terminal_lines(summary, getattr(config, "_cp_comparison", None)):
        tr.write_line(line)
    tr.write_line(f"summary: {path}" + ("; comparison: " + str(path.parent / "comparison.json")
                                        if getattr(config, "_cp_comparison", None) else ""))
