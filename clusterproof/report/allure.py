"""Allure plumbing: run environment, titles, each check's figures, and cluster state on failure.

Why: tests assert, the report explains. An SRE reading the report the next
morning needs to know what ran where (simulated kwok nodes or real
hardware, versions, profile, run id), what each check measured against its
threshold and, for a failure, the events and a cluster summary -- without
anyone adding report code to a test body. The hooks that call this live in
``clusterproof.fixtures.report``; this module is pure (no pytest, no domain).
Nothing here may mask a test result: report errors are swallowed and noted.
"""
from __future__ import annotations

import html
import inspect
import json
from pathlib import Path
from typing import Callable

import allure

from clusterproof.core.measurement import Figure

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
    {"name": "Regression against the baseline (--baseline: a figure or a check got worse)",
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
            "kubelet": "kubelet", "wal": "WAL", "rss": "RSS", "json": "JSON"}


def sentence(item) -> str:
    """A check's title as a sentence: test_gang_is_bound_all_together[native] ->
    'Gang is bound all together (native)'."""
    name = getattr(item, "originalname", None) or item.name.split("[", 1)[0]
    words = " ".join(_SPELLED.get(w, w) for w in name.removeprefix("test_").split("_"))
    param = item.name[len(name):].strip("[]") if "[" in item.name else ""
    return words[:1].upper() + words[1:] + (f" ({param})" if param else "")


def description(item) -> str:
    """What the check proves: its own docstring, if any, then its suite's module docstring."""
    parts = [inspect.cleandoc(d) for d in (getattr(getattr(item, "function", None), "__doc__", None),
                                          getattr(item.module, "__doc__", None)) if d]
    return "\n\n".join(parts)


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


def show_figure(figure: Figure) -> None:
    """A figure on its check's own page (passed or failed), beside its threshold."""
    allure.dynamic.parameter(figure.name, figure.shown())


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
    doc = description(item)
    if doc:
        allure.dynamic.description_html(as_html(doc))


def attach_cluster_state(summary: Callable[[], str], events: Callable[[], str]) -> None:
    """A failed check's cluster summary and the events of this run's namespaces (each read when called)."""
    try:
        allure.attach(summary(), "cluster summary", allure.attachment_type.TEXT)
        allure.attach(events(), "events in this run's namespaces", allure.attachment_type.TEXT)
    except Exception as e:  # the report must never hide the real failure
        allure.attach(f"could not gather cluster state: {e}", "cluster state error",
                      allure.attachment_type.TEXT)


def write_environment(alluredir: Path, env: dict[str, str], has_cluster: bool) -> None:
    """Allure's environment.properties (and clusterproof-run.json, the same as JSON) and categories.json."""
    alluredir.mkdir(parents=True, exist_ok=True)
    (alluredir / "categories.json").write_text(json.dumps(CATEGORIES, indent=2))
    if not has_cluster:
        if (alluredir / "environment.properties").exists():
            return  # a run without a cluster must not hide the one that had one
        env = {**env, "hardware": "no cluster used"}
    (alluredir / "environment.properties").write_text("".join(f"{k}={v}\n" for k, v in sorted(env.items())))
    (alluredir / "clusterproof-run.json").write_text(json.dumps(env, indent=2))
