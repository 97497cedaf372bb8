"""Allure plumbing: run environment, titles, each check's figures, and cluster state on failure.

Why: tests assert, the report explains. An SRE reading the report the next
morning needs to know what ran where (simulated kwok nodes or real
hardware, versions, profile, run id), what each check measured against its
threshold (one figures table per check, attached at its end) and, for a
failure, the events and a cluster summary -- without anyone adding report
code to a test body. A check's page opens with its own docstring, its
suite's one sentence and doc page below it.

History: Allure links a check's results across nights by their historyId,
which allure-pytest computes from the check's full name and every parameter
not marked ``excluded``. Pytest's own parameters (``[coscheduling]``) must
stay in it -- they make two checks of one function -- and nothing measured
or described may enter it: figures are never parameters here, and every
``allure.dynamic.parameter`` of ours passes ``excluded=True``
(tests/test_report_page.py holds both). The hooks that call this live in
``clusterproof.fixtures.report``; this module is pure (no pytest, no domain). In the library only
``clusterproof.report`` imports Allure: the domains hand their attachments over as data (``attach``).
Nothing here may mask a test result: report errors are swallowed and noted.
"""
from __future__ import annotations

import html
import inspect
import json
from pathlib import Path
from typing import Callable

import allure

from clusterproof.core.attachment import Attachment
from clusterproof.core.measurement import BEYOND, WITHIN, Figure

# How the report sorts what did not pass. Allure puts a result in *every* category whose statuses and
# messageRegex match (the regex must match the whole status message, which allure-pytest writes as
# "Failed: <message>" for pytest.fail and "AssertionError: <message>" for an assert), so each category
# excludes the ones above it: a result lands in exactly one (``categories`` mirrors it; self-tested).
_CONTROL_PLANE = "(?:this module broke the control plane|the control plane was already broken)"
_HARNESS = "(?:Failed: )?clusterproof: "
_SLO = ".*SLO.*broken"
_REGRESSION = ".*(?:regressed beyond tolerance|check\\(s\\) now failing)"
_NOT_CP = f"(?!.*{_CONTROL_PLANE})"
CATEGORIES = [
    {"name": "Control plane broken (a module broke it, or it was broken before)",
     "matchedStatuses": ["failed", "broken"],
     "messageRegex": f"(?s).*{_CONTROL_PLANE}.*"},
    {"name": "Harness or environment error", "matchedStatuses": ["broken"], "messageRegex": f"(?s){_NOT_CP}.*"},
    {"name": "Harness or environment error", "matchedStatuses": ["failed"],
     "messageRegex": f"(?s){_NOT_CP}{_HARNESS}.*"},
    {"name": "SLO broken", "matchedStatuses": ["failed"], "messageRegex": f"(?s){_NOT_CP}(?!{_HARNESS}){_SLO}.*"},
    {"name": "Known upstream limitation (strict expected failure)", "matchedStatuses": ["skipped"],
     "messageRegex": "(?s)XFAIL.*"},
    {"name": "Regression against the baseline (--cp-baseline: a figure or a check got worse)",
     "matchedStatuses": ["failed"],
     "messageRegex": f"(?s){_NOT_CP}(?!{_HARNESS})(?!{_SLO}){_REGRESSION}.*"},
    {"name": "Cluster defect", "matchedStatuses": ["failed"],
     "messageRegex": f"(?s){_NOT_CP}(?!{_HARNESS})(?!{_SLO})(?!{_REGRESSION}).*"},
]


def categories(status: str, message: str | None) -> list[str]:
    """The categories Allure gives a result (all that match, as its CategoriesPlugin does)."""
    import re
    return [c["name"] for c in CATEGORIES if status in c["matchedStatuses"]
            and ("messageRegex" not in c or (message is not None and re.fullmatch(c["messageRegex"], message)))]


# Words a test name spells in lower case that a sentence spells otherwise.
_SPELLED = {"api": "API", "apis": "APIs", "slo": "SLO", "slos": "SLOs", "gpu": "GPU", "gpus": "GPUs",
            "apf": "APF", "xid": "XID", "nvml": "NVML", "pdb": "PDB", "pdbs": "PDBs", "ecc": "ECC",
            "pcie": "PCIe", "nvlink": "NVLink", "p99": "p99", "5xx": "5xx", "ip": "IP", "ips": "IPs",
            "promql": "PromQL", "prometheus": "Prometheus", "endpointslice": "EndpointSlice",
            "endpointslices": "EndpointSlices", "noexecute": "NoExecute", "noschedule": "NoSchedule",
            "kubelet": "kubelet", "wal": "WAL", "rss": "RSS", "json": "JSON",
            "kueue": "Kueue", "kueues": "Kueue's", "jobset": "JobSet", "jobsets": "JobSets"}


def sentence(item) -> str:
    """A check's title as a sentence: test_gang_is_bound_all_together[native] ->
    'Gang is bound all together (native)'."""
    name = getattr(item, "originalname", None) or item.name.split("[", 1)[0]
    words = " ".join(_SPELLED.get(w, w) for w in name.removeprefix("test_").split("_"))
    param = item.name[len(name):].strip("[]") if "[" in item.name else ""
    return words[:1].upper() + words[1:] + (f" ({param})" if param else "")


def description(item) -> str:
    """What the check proves: its own docstring only (its suite's story is the footer, ``suite_footer``)."""
    doc = getattr(getattr(item, "function", None), "__doc__", None)
    return inspect.cleandoc(doc) if doc else ""


def suite_of(item) -> str | None:
    """The suite a check belongs to: ``suites/test_gang_scheduling.py`` -> 'gang_scheduling'; None for a
    check outside suites/ (a self-test)."""
    path = Path(str(getattr(item, "path", "") or getattr(item, "fspath", "")))
    if path.parent.name != "suites" or not path.stem.startswith("test_"):
        return None
    return path.stem.removeprefix("test_")


def suite_line(item) -> str:
    """The suite's story in one sentence: the first sentence of its module docstring."""
    doc = inspect.cleandoc(getattr(getattr(item, "module", None), "__doc__", None) or "")
    first = " ".join(doc.split("\n\n", 1)[0].split())
    end = first.find(". ")
    return first[:end + 1] if end >= 0 else first


def suite_footer(item) -> str:
    """The description's footer: the suite's one sentence and its doc page (``docs/suites/<suite>.md``,
    where the whole story, its figures and its known findings are)."""
    suite = suite_of(item)
    if suite is None:
        return ""
    line = suite_line(item)
    return (f"<p>&#8212; Suite <b>{html.escape(suite)}</b>" + (f": {_inline(line)}" if line else "")
            + f" The whole story: <code>docs/suites/{html.escape(suite)}.md</code> in the clusterproof "
              "repository.</p>")


def as_html(text: str) -> str:
    """A docstring as readable HTML: paragraphs flowed, ``- `` lines as a list, ``code`` as code."""
    out = []
    for para in text.split("\n\n"):
        if not para.strip():
            continue
        lines = para.splitlines()
        items, current = [], None
        for ln in lines:
            if ln.lstrip().startswith("- "):
                current = [ln.lstrip()[2:]]
                items.append(current)
            elif current is not None:
                current.append(ln.strip())
            else:
                items.append(ln.strip())
        text_parts = [x for x in items if isinstance(x, str)]
        if text_parts:
            out.append(f'<p style="margin: 0 0 0.6em 0">{_inline(" ".join(text_parts))}</p>')
        bullets = [x for x in items if isinstance(x, list)]
        if bullets:
            # Allure's stylesheet resets list styles: the bullets are asked for inline.
            out.append('<ul style="list-style: disc; padding-left: 1.5em; margin: 0.3em 0">'
                       + "".join(f"<li>{_inline(' '.join(b))}</li>" for b in bullets) + "</ul>")
    return "\n".join(out)


def _inline(text: str) -> str:
    parts = html.escape(text).split("``")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


# A verdict as the figures table shows it: word, colour.
_VERDICT = {WITHIN: ("within", "#2e7d32"), BEYOND: ("BEYOND", "#c62828")}


def number_shown(value: float | None) -> str:
    """A value whole, for a reader: 21234 -> '21,234', 0.01234 -> '0.01234', 1234.5 -> '1,234.5'."""
    if value is None:
        return "n/a"
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    if abs(value) >= 1000:
        return f"{value:,.1f}"
    return f"{value:.4g}"


def figures_table(figures: list[Figure]) -> str:
    """A check's figures as one HTML table (figure, value, unit, threshold, verdict), headline figures
    first and in bold; each value whole. Its data beside it: ``figures_data``."""
    rows = sorted(figures, key=lambda f: not f.headline)
    judged = [f for f in rows if f.verdict is not None]
    beyond = sum(f.verdict == BEYOND for f in judged)
    head = (f"{len(rows)} figure{'s' if len(rows) != 1 else ''}, {len(judged)} judged against a threshold: "
            + (f'<b style="color: #c62828">{beyond} beyond</b>' if beyond else "all within")
            if judged else f"{len(rows)} figure{'s' if len(rows) != 1 else ''}, none judged against a threshold")
    out = ["<!DOCTYPE html><html><head><meta charset=\"utf-8\"><style>",
           "body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; font-size: 13px; "
           "margin: 8px; color: #222 }",
           "table { border-collapse: collapse } th, td { padding: 3px 10px; border-bottom: 1px solid #e0e0e0; "
           "text-align: left; vertical-align: top }",
           "th { background: #f3f3f3 } td.n { text-align: right; font-variant-numeric: tabular-nums; "
           "white-space: nowrap } tr.headline td { font-weight: bold }",
           "</style></head><body>", f"<p>{head}</p>",
           "<table><tr><th>figure</th><th>value</th><th>unit</th><th>threshold</th><th>verdict</th></tr>"]
    for f in rows:
        threshold = "" if f.threshold is None else f"{html.escape(f.op or '')} {number_shown(f.threshold)}"
        word, colour = _VERDICT.get(f.verdict, ("not judged" if f.value is not None or f.threshold is None
                                                else "not measured", "#757575"))
        out.append(f'<tr class="{"headline" if f.headline else ""}"><td>{html.escape(f.name)}</td>'
                   f'<td class="n">{number_shown(f.value)}</td><td>{html.escape(f.unit)}</td>'
                   f'<td class="n">{threshold}</td><td style="color: {colour}">{word}</td></tr>')
    out.append("</table></body></html>")
    return "\n".join(out)


def figures_data(figures: list[Figure]) -> str:
    """The figures table's data: each figure as summary.json has it (JSON)."""
    return json.dumps([f.to_json() for f in sorted(figures, key=lambda f: not f.headline)], indent=1)


def attach_figures(figures: list[Figure]) -> None:
    """A check's figures on its page, once, at its end: the table and its data beside it (nothing for a
    check that measured nothing). Measured values are never Allure parameters: a parameter enters the
    result's historyId, which must stay the same from one night to the next."""
    if not figures:
        return
    try:
        allure.attach(figures_table(figures), "figures", allure.attachment_type.HTML)
        allure.attach(figures_data(figures), "figures (data)", allure.attachment_type.JSON)
    except Exception as e:  # the report must never hide the real result
        allure.attach(f"could not render the figures: {e}", "figures error", allure.attachment_type.TEXT)


def attach(*attachments: Attachment) -> None:
    """Domains' attachments (``clusterproof.core.attachment``) on the current check's page, in order: each
    with the name, body and kind its domain gave it; a file as it is now. Also the ``attach`` a domain's
    set-up, guard or tear-down is given."""
    for a in attachments:
        kind = allure.attachment_type[a.kind.upper()]
        if a.source is not None:
            allure.attach.file(str(a.source), a.name, kind)
        else:
            allure.attach(a.body, a.name, kind)


def plain_failure(excinfo) -> None:
    """A suite's failed assertion reads as its own sentence: pytest's introspection of the
    expression (``assert not [Latency(...), ...]``) is cut from the message the report shows
    (the full traceback keeps it)."""
    err = excinfo.value if excinfo else None
    if isinstance(err, AssertionError) and err.args and isinstance(err.args[0], str):
        msg, sep, _ = err.args[0].partition("\nassert ")
        if sep and msg.strip():
            err.args = (msg,) + err.args[1:]


def name_result(item) -> None:
    """The check's title, pytest id and description on its result (after allure-pytest named it)."""
    allure.dynamic.title(sentence(item))
    # The pytest id, for a reader (or a self-test) who wants the check behind a sentence title.
    allure.dynamic.label("pytest.id", item.name)
    suite = suite_of(item)
    if suite is not None:
        # The Suites tab groups a suite's checks under its one-sentence story.
        allure.dynamic.suite(f"{suite}: {suite_line(item)}" if suite_line(item) else suite)
    doc, footer = description(item), suite_footer(item)
    if doc or footer:
        # Allure's page drops every style (margins too): an empty line sets the footer apart.
        allure.dynamic.description_html(as_html(doc) + ("\n<br>\n" if doc and footer else "") + footer)


def attach_cluster_state(summary: Callable[[], str], events: Callable[[], str]) -> None:
    """A failed check's cluster summary and the events of this run's namespaces (each read when called)."""
    try:
        allure.attach(summary(), "cluster summary", allure.attachment_type.TEXT)
        allure.attach(events(), "events in this run's namespaces", allure.attachment_type.TEXT)
    except Exception as e:  # the report must never hide the real failure
        allure.attach(f"could not gather cluster state: {e}", "cluster state error",
                      allure.attachment_type.TEXT)


def _property_key(key: str) -> str:
    """A key as Java's properties format reads it whole (a space, ``:`` or ``=`` would end it)."""
    return "".join("\\" + c if c in " :=#!\\" else c for c in key)


RUN_ENV_FILE = "clusterproof-run.json"   # the environment as JSON, for readers of a run (bench nightly)


def write_environment(alluredir: Path, env: dict[str, str], has_cluster: bool) -> None:
    """Allure's environment.properties (and ``RUN_ENV_FILE``, the same as JSON) and categories.json."""
    alluredir.mkdir(parents=True, exist_ok=True)
    (alluredir / "categories.json").write_text(json.dumps(CATEGORIES, indent=2))
    if not has_cluster:
        if (alluredir / "environment.properties").exists():
            return  # a run without a cluster must not hide the one that had one
        env = {**env, "hardware": "no cluster used"}
    (alluredir / "environment.properties").write_text("".join(f"{_property_key(k)}={v}\n"
                                                              for k, v in sorted(env.items())))
    (alluredir / RUN_ENV_FILE).write_text(json.dumps(env, indent=2))
