"""The docs an SRE navigates stay true: generated tables, the runbook, the links.

- Every figures table in ``docs/`` between ``bench-tables`` markers is what ``clusterproof
  bench-tables`` prints from the figures of ``reports/bench/*.json`` (negative control: a copy of the
  bench JSON with one figure changed makes the comparison fail, naming the page, the table and both
  lines).
- ``docs/triage.md`` has exactly one entry per Allure category (``clusterproof.report.allure``
  ``CATEGORIES``, by unique name); negative control: a category added or removed is named.
- Every relative link in the README and in ``docs/`` resolves to a file of the checkout (and its
  ``#anchor`` to a heading of that page).
- Every resource the RBAC manifests grant is named in ``docs/rbac.md`` (the review cannot silently
  miss a rule a manifest gained).

Pure files: no cluster, well under a second (the CLI runs are one subprocess each).
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from clusterproof import CHECKOUT
from clusterproof.report import allure, benchtables

pytestmark = pytest.mark.unit

DOCS = CHECKOUT / "docs"
BENCH = CHECKOUT / "reports" / "bench"
README = CHECKOUT / "README.md"
RUNBOOK = DOCS / "triage.md"
CATEGORIES_HEADING = "## The categories"


# ---- generated figures tables -----------------------------------------------------------------------

def test_the_committed_tables_are_what_the_command_prints():
    problems = benchtables.stale(DOCS, BENCH)
    assert not problems, "\n".join(problems)


def test_every_bench_file_is_rendered_in_the_benchmarks_page():
    text = (DOCS / "benchmarks.md").read_text()
    names = list(benchtables.blocks(BENCH))
    assert names, "no bench tables"
    for path in sorted(BENCH.glob("*.json")):
        assert f"reports/bench/{path.name}" in text, f"docs/benchmarks.md shows nothing of {path}"


def _set_figure(name: str, value: float):
    """A change to a bench file: the figure ``name`` gets ``value``."""
    def change(d: dict) -> None:
        [f] = [f for f in d["figures"] if f["name"] == name]
        f["value"] = value
    return change


def _copy_with(tmp_path, name: str, change) -> tuple:
    """A copy of docs/ and reports/bench/ with ``change`` applied to reports/bench/<name>."""
    bench, docs = tmp_path / "bench", tmp_path / "docs"
    shutil.copytree(BENCH, bench)
    shutil.copytree(DOCS, docs)
    d = json.loads((bench / name).read_text())
    change(d)
    (bench / name).write_text(json.dumps(d, indent=2))
    return docs, bench


def test_a_changed_figure_makes_the_comparison_fail(tmp_path):
    """Negative control: burst.json's create rate 161.7 -> 99.9 pods/s in a copy; the committed
    pages (copied) no longer match, and the message names the page, the table, both lines and the fix."""
    docs, bench = _copy_with(tmp_path, "burst.json", _set_figure("create_qps", 99.9))
    problems = benchtables.stale(docs, bench)
    text = "\n".join(problems)
    assert problems, "a changed figure went unnoticed"
    assert "benchmarks.md: table 'burst' differs" in text and "burst_pod_creation.md: table 'burst'" in text, text
    assert "161.7 pods/s" in text and "99.9 pods/s" in text, text
    assert benchtables.COMMAND in text, text
    # ... and --write puts it right
    benchtables.write(docs, bench)
    assert benchtables.stale(docs, bench) == []


def test_the_command_checks_and_prints(tmp_path):
    """``clusterproof bench-tables --check`` exits 0 on the checkout, 1 (one line per stale table) on
    the changed copy; bad input is one line, exit 4."""
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "clusterproof.cli", "bench-tables", *args],
                              cwd=CHECKOUT, capture_output=True, text=True, timeout=120)
    ok = cli("--check")
    assert ok.returncode == 0, ok.stderr
    docs, bench = _copy_with(tmp_path, "knee.json", _set_figure("create_latency_server_p99_s[10 pods/s]", 0.5))
    stale = cli("--check", "--docs-dir", str(docs), "--bench-dir", str(bench))
    assert stale.returncode == 1 and "table 'knee' differs" in stale.stderr and "0.5 s" in stale.stderr, stale.stderr
    printed = cli("burst")
    assert printed.returncode == 0 and printed.stdout.startswith("<!-- bench-tables: burst -->"), printed.stderr
    bad = cli("no-such-table")
    assert bad.returncode == 4 and bad.stderr.count("\n") == 1 and "no bench table named no-such-table" in bad.stderr


def test_a_bench_file_no_table_names_still_gets_a_table_and_one_without_figures_is_refused(tmp_path):
    """A new bench's file (``bench.common.write``'s shape) that no table names gets a table of all its figures;
    a file without figures is one line naming it; a page's marker for a table that does not exist is named."""
    from clusterproof.core.measurement import Figure
    figs = [Figure.of("bench new", "time to x", 1.5, "s", 2.0), Figure.of("bench new", "rss", 2 ** 31, "B")]
    (tmp_path / "new.json").write_text(json.dumps({
        "command": "python -m clusterproof.bench.new --cp-profile smoke", "date": "2026-11-26T01:02:03Z",
        "figures": [f.to_json() for f in figs], "data": {"raw": [1, 2, 3]}}))
    bl = benchtables.blocks(tmp_path)
    assert "| time to x | 1.5 s | ≤ 2 s | within |" in bl["new"], bl["new"]
    assert "| rss | 2.00 GiB |  |  |" in bl["new"], bl["new"]
    assert "`python -m clusterproof.bench.new --cp-profile smoke`" in bl["new"] and "2026-11-26 01:02 UTC" in bl["new"]
    page = tmp_path / "docs"
    page.mkdir()
    (page / "benchmarks.md").write_text("<!-- bench-tables: gone -->\nold\n<!-- /bench-tables: gone -->\n")
    problems = benchtables.stale(page, tmp_path)
    assert any("marker bench-tables: gone names no bench table" in p for p in problems), problems
    assert any("no table 'new'" in p for p in problems), problems
    (tmp_path / "odd.json").write_text(json.dumps({"measured_at": "2026-11-26T01:02:03+00:00", "seconds": 3.25}))
    with pytest.raises(benchtables.BenchTablesError, match=r"odd.json: no \"figures\" list"):
        benchtables.blocks(tmp_path)


# ---- the runbook ------------------------------------------------------------------------------------

def runbook_entries(text: str) -> list[str]:
    """The ``###`` headings under ``## The categories`` of the runbook, in order."""
    if CATEGORIES_HEADING not in text:
        return []
    section = text.split(CATEGORIES_HEADING, 1)[1].split("\n## ", 1)[0]
    return [line[4:].strip() for line in section.splitlines() if line.startswith("### ")]


def runbook_problems(text: str, categories: list[dict]) -> list[str]:
    """What keeps the runbook and the report's categories apart, one line each."""
    names = list(dict.fromkeys(c["name"] for c in categories))
    entries = runbook_entries(text)
    problems = [f"docs/triage.md has no entry for the category {n!r} (add '### {n}' under "
                f"'{CATEGORIES_HEADING}': what it means, the first command, who owns it)"
                for n in names if n not in entries]
    problems += [f"docs/triage.md has an entry {e!r} that is no category of clusterproof/report/allure.py "
                 f"CATEGORIES (renamed or removed? there are: {', '.join(names)})" for e in entries if e not in names]
    problems += [f"docs/triage.md has {entries.count(e)} entries {e!r}" for e in set(entries) if entries.count(e) > 1]
    for e in set(entries) & set(names):
        body = text.split(f"### {e}", 1)[1].split("\n### ", 1)[0]
        for part in ("**What it means.**", "**First command.**", "**Who owns it.**"):
            if part not in body:
                problems.append(f"docs/triage.md: the entry {e!r} lacks {part}")
    return sorted(problems)


def test_the_runbook_has_one_entry_per_category():
    problems = runbook_problems(RUNBOOK.read_text(), allure.CATEGORIES)
    assert not problems, "\n".join(problems)


def test_a_category_added_or_removed_is_named():
    """Negative control: a new category without an entry, and an entry whose category went."""
    text = RUNBOOK.read_text()
    added = [*allure.CATEGORIES, {"name": "Flaky infrastructure", "matchedStatuses": ["broken"]}]
    problems = runbook_problems(text, added)
    assert len(problems) == 1 and "no entry for the category 'Flaky infrastructure'" in problems[0], problems
    removed = [c for c in allure.CATEGORIES if c["name"] != "Cluster defect"]
    problems = runbook_problems(text, removed)
    assert len(problems) == 1 and "entry 'Cluster defect' that is no category" in problems[0], problems
    doubled = text.replace("### SLO broken\n", "### SLO broken\n\n### SLO broken\n", 1)
    assert any("2 entries 'SLO broken'" in p for p in runbook_problems(doubled, allure.CATEGORIES))


# ---- links, RBAC, size ------------------------------------------------------------------------------

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _pages():
    return [README, *sorted(DOCS.rglob("*.md"))]


def _anchors(page) -> set[str]:
    """The anchors a page offers: its headings as GitHub spells them, and its ``<a id=...>``."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    heads = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.*)$", text, re.M)}
    return heads | set(re.findall(r'<a id="([^"]+)"', text))


def broken_links(pages, root) -> list[str]:
    """One line per relative link (outside code blocks) whose file, or whose anchor in a page, does not exist."""
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)   # code blocks hold no links
        for target in dict.fromkeys(_LINK.findall(text)):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = page.parent / file if file else page
            if not path.exists():
                broken.append(f"{page.relative_to(root)}: the link to {target} names no file")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                broken.append(f"{page.relative_to(root)}: the link to {target} names no heading of "
                              f"{file or 'this page'}")
    return broken


def test_every_relative_link_resolves():
    broken = broken_links(_pages(), CHECKOUT)
    assert not broken, "\n".join(broken)


def test_a_broken_link_is_named(tmp_path):
    """Negative control: a page linking a page that does not exist (and one that does, with an anchor)."""
    (tmp_path / "a.md").write_text("# T\n[b](b.md#at-7500-nodes) [gone](suites/gone.md) [web](https://example.com) "
                                   "[top](#t) [nohead](b.md#nowhere)\n```\n[in code](nowhere.md)\n```\n")
    (tmp_path / "b.md").write_text("## At 7,500 nodes\n")
    assert broken_links([tmp_path / "a.md"], tmp_path) == [
        "a.md: the link to suites/gone.md names no file", "a.md: the link to b.md#nowhere names no heading of b.md"]


def test_the_readme_links_every_docs_page():
    readme = README.read_text()
    missing = [str(p.relative_to(CHECKOUT)) for p in sorted(DOCS.glob("*.md"))
               if f"({p.relative_to(CHECKOUT)})" not in readme]
    missing += ["docs/suites/" + p.name for p in sorted((DOCS / "suites").glob("*.md"))
                if f"(docs/suites/{p.name})" not in readme]
    assert not missing, "README.md does not link: " + ", ".join(missing)


def test_every_suite_has_its_page():
    suites = sorted(p.stem.removeprefix("test_") for p in (CHECKOUT / "suites").glob("test_*.py"))
    missing = [s for s in suites if not (DOCS / "suites" / f"{s}.md").is_file()]
    assert not missing, "no docs/suites/<suite>.md for: " + ", ".join(missing)


def test_the_rbac_review_names_every_resource_the_manifests_grant():
    review = (DOCS / "rbac.md").read_text()
    missing = []
    for name in ("rbac.yaml", "rbac-destructive.yaml"):
        for doc in yaml.safe_load_all((CHECKOUT / "clusterproof" / "kube" / name).read_text()):
            for rule in (doc or {}).get("rules") or []:
                for res in [*(rule.get("resources") or []), *(rule.get("nonResourceURLs") or [])]:
                    if f"`{res}`" not in review:
                        missing.append(f"{name} {doc['metadata']['name']}: {res} ({', '.join(rule['verbs'])})")
    assert not missing, "docs/rbac.md does not name: " + "; ".join(missing)

