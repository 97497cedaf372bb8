"""What a CI shows of a run: its verdict in the job's summary, and the CI build in the Allure report.

Why: a red night is first seen in the CI, not in the report. GitHub Actions
renders ``$GITHUB_STEP_SUMMARY`` (markdown) on the job's page; when it is set,
the end of every run appends to it: the verdict and its exit code (the one
table: ``clusterproof.core.exitcodes``, docs/exit-codes.md), the counts per
suite, each check that failed with the Allure category the report files it
under (the same rules: ``clusterproof.report.allure.categories``), the
headline figures, the regressions against the baseline, and the run's
directory (junit.xml, summary.json, the Allure results) with the command
that builds its report.

``executor.json`` in the Allure results names the CI build that ran the
checks (Allure 2's Executors widget on the Overview; its trend charts link
each earlier night to its build): GitHub Actions from its own variables;
any other CI from these (only ``CLUSTERPROOF_CI_NAME`` is required)::

    CLUSTERPROOF_CI_NAME         the CI's name, e.g. Jenkins
    CLUSTERPROOF_CI_TYPE         Allure's icon for it: jenkins, gitlab, teamcity, bamboo, circleci,
                                 bitbucket, azure, github (anything else: no icon)
    CLUSTERPROOF_CI_URL          the CI's (or the job's) page
    CLUSTERPROOF_CI_BUILD_NAME   this build, e.g. "nightly #1234"
    CLUSTERPROOF_CI_BUILD_URL    this build's page
    CLUSTERPROOF_CI_BUILD_ORDER  this build's number (an integer: the trend charts' order)
    CLUSTERPROOF_CI_REPORT_URL   where this build's report will be (default: the build's page)

Outside a CI it names the run (``local``, the run id).

junit.xml (pytest's own, in the run's directory) carries each check's
figures as properties of its ``<testcase>`` (``junit_properties``) and what
produced the run as properties of the ``<testsuite>`` (clusterproof's version
and commit, the Kubernetes versions, the profile's hash:
``clusterproof.report.origin``), so a CI that reads only JUnit still has them.

Pure: no pytest, no domain; called by ``clusterproof.fixtures.report``
(``session_end`` at the very end of the session, after every plugin has set
the exit code). Nothing here may change a run's outcome: a file it cannot
write is one line on stderr.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Mapping

from clusterproof.core import exitcodes, outputs
from clusterproof.core.measurement import Figure
from clusterproof.core.texttable import markdown_table
from clusterproof.report import allure as allure_page
from clusterproof.report import compare, origin, timing
from clusterproof.report.summary import ReportSession

STEP_SUMMARY_ENV = "GITHUB_STEP_SUMMARY"
CI_ENV = "CLUSTERPROOF_CI_"
KINDS = ("passed", "failed", "error", "xfailed", "xpassed", "skipped")
BAD = ("failed", "error", "xpassed")
MOST_FAILED = 40       # rows of failed checks in the summary (GitHub keeps 1 MiB per step)


def allure_status(outcome: str, message: str) -> tuple[str, str | None]:
    """The status and message Allure gets for a check, from its outcome and the first line of its failure
    (``ReportSession.checks``). allure-pytest: an AssertionError or pytest.fail is ``failed``, any other
    exception ``broken``, the message the exception's ``Type: text`` (pytest's first line drops
    ``AssertionError:`` before a bare ``assert``); a strict XPASS is ``failed`` with no message (no
    exception), a loose one ``passed``."""
    if outcome == "xfailed":
        return "skipped", f"XFAIL {message}"
    if outcome == "skipped":
        return "skipped", message
    if outcome == "xpassed":
        return "passed", f"XPASS {message}"
    if outcome == "passed":
        return "passed", None
    if message.startswith("[XPASS(strict)]"):
        return "failed", None
    if message.startswith(("Failed: ", "AssertionError")):
        return "failed", message
    if message.startswith("assert "):
        return "failed", f"AssertionError: {message}"
    return "broken", message


def category(outcome: str, message: str) -> str:
    """The Allure category of a check (Allure's own defaults when none of ours matches)."""
    status, text = allure_status(outcome, message or "")
    found = allure_page.categories(status, text)
    default = {"failed": "Product defects", "broken": "Test defects"}.get(status, f"none ({status})")
    return found[0] if found else default


def _cell(text: object, most: int = 200) -> str:
    """One markdown table cell: one line, at most ``most`` characters (``markdown_table`` escapes its pipes)."""
    s = " ".join(str(text).split())
    return s if len(s) <= most else s[:most - 1] + "…"


def _num(value: float | None, unit: str) -> str:
    return "n/a" if value is None else f"{value:.4g} {unit}"


def _link(environ: Mapping[str, str], path: str) -> str:
    """A file of this checkout as a link on the forge when the CI says where (GitHub), else its path."""
    server, repo, sha = (environ.get(k) for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_SHA"))
    return f"[{path}]({server}/{repo}/blob/{sha}/{path})" if server and repo and sha else f"`{path}`"


def step_summary(code: int, checks: Mapping[str, dict], summary: dict | None = None,
                 comparison: compare.Comparison | None = None, run: outputs.RunOutputs | None = None,
                 stopped: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The run as GitHub-flavoured markdown: verdict, counts, failed checks, headline figures, regressions."""
    environ = os.environ if environ is None else environ
    code = int(code)
    mark = "✅" if code == exitcodes.OK else "❌"
    out = [f"### {mark} clusterproof: {exitcodes.verdict(code)} (exit {code})", ""]
    facts = (summary or {}).get("run") or {}
    if facts:
        kind = "simulated" if facts.get("simulated") else "real"
        out.append(f"Run `{facts.get('id')}`: profile {facts.get('profile')}, {facts.get('nodes')} nodes, "
                   f"Kubernetes {facts.get('kubernetes')}, {kind} ({facts.get('backend')})"
                   + (f" + {facts['real_nodes']} real node(s)" if facts.get("real_nodes") else "")
                   + f", {facts.get('seconds')} s." + (f" Code: {origin.shown(facts)}." if origin.shown(facts) else ""))
    elif run is not None:
        out.append(f"Run `{run.run_id}`.")
    if stopped:
        out.append(f"Stopped: {_cell(stopped, 400)}")
    out.append(f"What each exit code means and what to do: {_link(environ, 'docs/exit-codes.md')}.")
    out.append("")
    per_suite: dict[str, dict[str, int]] = {}
    for nodeid, chk in checks.items():
        counts = per_suite.setdefault(timing.suite_of(nodeid) or "?", {})
        counts[chk.get("outcome", "?")] = counts.get(chk.get("outcome", "?"), 0) + 1
    if per_suite:
        rows = sorted(per_suite.items())
        if len(rows) > 1:
            total = {k: sum(c.get(k, 0) for _, c in rows) for k in KINDS}
            rows.append(("**all**", total))
        out += [markdown_table(["suite", *KINDS], [[suite, *(counts.get(k, 0) or "" for k in KINDS)]
                                                   for suite, counts in rows], "<" + ">" * len(KINDS)), ""]
    else:
        out += ["No check ran.", ""]
    bad = [(nodeid, chk) for nodeid, chk in sorted(checks.items()) if chk.get("outcome") in BAD]
    if bad:
        rows = [[f"{_cell(chk.get('title') or nodeid, 120)}<br>`{_cell(nodeid, 160)}`", chk["outcome"],
                 category(chk["outcome"], chk.get("message", "")), _cell(chk.get("message", ""))]
                for nodeid, chk in bad[:MOST_FAILED]]
        if len(bad) > MOST_FAILED:
            rows.append([f"… and {len(bad) - MOST_FAILED} more (junit.xml, the report)"])
        out += [f"**{len(bad)} check(s) did not pass** (each Allure category's runbook: "
                f"{_link(environ, 'docs/triage.md')})", "",
                markdown_table(["check", "outcome", "Allure category", "first line"], rows), ""]
    heads = [f for f in ((summary or {}).get("figures") or {}).values() if f.get("headline")]
    if heads:
        rows = []
        for f in heads:
            value = "n/a" if f.get("value") is None else f"{f['value']:.3g} {f.get('unit', '')}"
            thr = f"{f['op']} {f['threshold']:g} {f.get('unit', '')}" if f.get("threshold") is not None else ""
            rows.append([_cell(f.get("name")), _cell(value), _cell(thr), f.get("verdict") or ""])
        out += ["**Headline figures**", "", markdown_table(["figure", "value", "threshold", "verdict"], rows, "<>"),
                ""]
    if comparison is not None:
        b = comparison.baseline
        out += [f"**Against the baseline** `{b.get('id', '?')}` (Kubernetes {b.get('kubernetes', '?')}): "
                f"{'REGRESSED: ' if comparison.regressed else ''}{_cell(comparison.headline(), 400)}", ""]
        flips, worse = comparison.flipped_to_bad, comparison.regressions
        if flips or worse:
            rows = [[f"check: {_cell(f.title, 120)}", f.baseline, f.now] for f in flips]
            for r in worse[:MOST_FAILED]:
                pct = "" if r.change_pct is None else f"{r.change_pct:+.1f} %"
                tol = "" if r.tolerance_pct is None else f"{r.tolerance_pct:g} %"
                rows.append([_cell(r.key, 160), _num(r.baseline, r.unit), _num(r.now, r.unit), pct, tol])
            out += [markdown_table(["regressed", "baseline", "now", "change", "tolerance"], rows, "<>>>>"), ""]
    if run is not None:
        files = [n for n in ("junit.xml", "summary.json", "comparison.json", "perfdata.json", "openmetrics.txt",
                             "allure-results")
                 if (run.dir / n).exists()]
        out.append(f"Outputs: `{run.shown()}`" + (f" ({', '.join(files)})" if files else "")
                   + f"; its report: `./proof report {run.run_id}`.")
    return "\n".join(out) + "\n"


def junit_properties(figures: list[Figure]) -> list[tuple[str, str]]:
    """A check's figures as properties of its ``<testcase>`` in junit.xml: ``figure.<name>`` (the value, or
    ``n/a``), ``figure.<name>.unit``, and with a threshold ``figure.<name>.threshold`` (``<= 5``) and
    ``figure.<name>.verdict`` (within or beyond). Jenkins's JUnit plugin lists a test's properties on its
    page (``keepProperties: true``); any reader of the XML finds them."""
    out = []
    for f in figures:
        key = f"figure.{f.name}"
        out += [(key, "n/a" if f.value is None else repr(f.value)), (f"{key}.unit", f.unit)]
        if f.threshold is not None:
            out += [(f"{key}.threshold", f"{f.op} {f.threshold:g}"), (f"{key}.verdict", f.verdict or "not measured")]
    return out


def executor(environ: Mapping[str, str], run_id: str) -> dict:
    """Allure 2's executor.json for this run: the CI build that ran it, else this machine (``local``)."""
    e = environ
    if e.get(CI_ENV + "NAME"):
        info = {"name": e[CI_ENV + "NAME"], "type": e.get(CI_ENV + "TYPE", ""), "url": e.get(CI_ENV + "URL", ""),
                "buildName": e.get(CI_ENV + "BUILD_NAME", ""), "buildUrl": e.get(CI_ENV + "BUILD_URL", ""),
                "reportUrl": e.get(CI_ENV + "REPORT_URL") or e.get(CI_ENV + "BUILD_URL", ""),
                "reportName": f"clusterproof: {e.get(CI_ENV + 'BUILD_NAME') or e[CI_ENV + 'NAME']}"}
        order = e.get(CI_ENV + "BUILD_ORDER", "")
        if order.strip().isdigit():
            info["buildOrder"] = int(order)
        elif order:
            print(f"clusterproof: {CI_ENV}BUILD_ORDER={order!r} is not an integer: left out of executor.json",
                  file=sys.stderr)
    elif e.get("GITHUB_ACTIONS") == "true" and e.get("GITHUB_REPOSITORY") and e.get("GITHUB_RUN_ID"):
        server, repo = e.get("GITHUB_SERVER_URL") or "https://github.com", e["GITHUB_REPOSITORY"]
        build_url = f"{server}/{repo}/actions/runs/{e['GITHUB_RUN_ID']}"
        number = e.get("GITHUB_RUN_NUMBER", "")
        name = f"{e.get('GITHUB_WORKFLOW') or 'workflow'} #{number or e['GITHUB_RUN_ID']}"
        if e.get("GITHUB_RUN_ATTEMPT", "1") not in ("", "1"):
            name += f" (attempt {e['GITHUB_RUN_ATTEMPT']})"
        info = {"name": "GitHub Actions", "type": "github", "url": f"{server}/{repo}/actions",
                "buildName": name, "buildUrl": build_url,
                "reportUrl": build_url,   # the run's page keeps its report (artifact clusterproof-report)
                "reportName": f"clusterproof: {name}"}
        if number.isdigit():
            info["buildOrder"] = int(number)
    else:
        info = {"name": "local", "type": "local", "buildName": f"run {run_id}",
                "reportName": f"clusterproof: run {run_id}"}
    return {k: v for k, v in info.items() if v != ""}


def session_end(environ: Mapping[str, str], exitstatus: int, state: ReportSession, run: outputs.RunOutputs | None,
                alluredir: str | None, stopped: str | None = None) -> None:
    """At the very end of a session: executor.json into the Allure results, the step summary when asked.
    Nothing for a session that wrote no run directory (``--collect-only``: nothing ran)."""
    if run is None or not run.dir.is_dir():
        return
    try:
        if alluredir:
            Path(alluredir).mkdir(parents=True, exist_ok=True)
            (Path(alluredir) / "executor.json").write_text(json.dumps(executor(environ, run.run_id), indent=2))
        target = environ.get(STEP_SUMMARY_ENV)
        if target:
            text = step_summary(exitstatus, state.checks, state.summary, state.comparison, run, stopped, environ)
            with open(target, "a", encoding="utf-8") as f:
                f.write(text + "\n")
    except OSError as e:   # the run's outcome stands; only this output is missing
        print(f"clusterproof: CI output not written: {e}", file=sys.stderr)
