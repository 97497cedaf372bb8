"""Self-tests of a check's Allure page: its history links night to night, and it reads in 30 seconds.

History: Allure links a check's results across runs by their ``historyId``,
which allure-pytest computes from the check's full name and every parameter
not marked ``excluded`` (``allure_pytest.utils.get_history_id``). A measured
value that became a parameter changed the historyId every night, so the
History tab never showed a second run. Here the same tiny check (the plugin,
no cluster) runs twice with different figures: same historyId and testCaseId;
and a check that still records a figure the old way (a plain parameter) gets
two historyIds, proving the comparison would catch it.

The page: the description is the check's own docstring (the suite's story is
one footer line and its doc page), its figures are one whole table with a
verdict per figure, and every check of the suites has a short docstring that
says what red means.
"""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from clusterproof.core.attachment import Attachment
from clusterproof.core.measurement import Figure
from clusterproof.report import allure as page

ROOT = Path(__file__).resolve().parent.parent
SUITES = sorted((ROOT / "suites").glob("test_*.py"))
LONGEST_DOC = 500   # characters: about four lines on the page

# The tiny suite run twice: a module docstring (which must not be on the pages), checks with docstrings
# of their own, figures that change from run to run, a pytest parameter, a descriptive parameter.
TINY = '''"""The tiny suite's story: one line. The rest of this module docstring must stay off the pages."""
import os

import allure
import pytest

from clusterproof.core.attachment import CSV, JSON, Attachment
from clusterproof.report import allure as page

VALUE = float(os.environ["CP_TINY_VALUE"])


def test_measures(figures):
    """Records three figures whose values change every run. Red: never."""
    allure.dynamic.parameter("gang backend", f"backend build {VALUE:g}", excluded=True)
    figures.add("latency p99", VALUE, "s", 5.0, headline=True)
    figures.add("bytes per change", 21234.5 * VALUE, "B", 1000.0)
    figures.add("pods seen", 3, "pods")


@pytest.mark.parametrize("mode", ["paced", "storm"])
def test_per_mode(mode, figures):
    """One check per mode: the pytest parameter makes two checks of one function. Red: never."""
    figures.add("joined", VALUE, "nodes")


def test_the_old_way(figures):
    """A figure recorded as a plain parameter, as before: its historyId changes with the value."""
    f = figures.add("latency p99", VALUE, "s", 5.0)
    allure.dynamic.parameter(f.name, f.shown())


def test_hands_over_attachments(tmp_path):
    """A domain's attachments, handed over as data and attached by report/. Red: never."""
    (tmp_path / "stats.csv").write_text("a,b\\n1,2\\n")
    page.attach(Attachment("a text", "one line"), Attachment("some json", '{"x": 1}', JSON),
                Attachment.file(tmp_path / "stats.csv", "a csv file", CSV))
'''


def _run_tiny(tmp_path: Path, value: float) -> dict[str, dict]:
    """The tiny suite run once (its own pytest process, the plugin, no cluster): results by pytest id."""
    work = tmp_path / f"run-{value:g}"
    (work / "suites").mkdir(parents=True)
    (work / "suites" / "test_tiny.py").write_text(TINY)
    env = {**os.environ, "CP_TINY_VALUE": str(value),
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:locust", "-p", "no:cacheprovider", "-p", "no:randomly",
           f"--cp-output-dir={work / 'out'}", f"--alluredir={work / 'allure'}", "suites/test_tiny.py"]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = {}
    for f in (work / "allure").glob("*-result.json"):
        r = json.loads(f.read_text())
        r["_dir"] = work / "allure"
        out[next(lb["value"] for lb in r["labels"] if lb["name"] == "pytest.id")] = r
    assert set(out) == {"test_measures", "test_per_mode[paced]", "test_per_mode[storm]", "test_the_old_way",
                        "test_hands_over_attachments"}, out
    return out


def _attachment(result: dict, name: str) -> str:
    found = [a for a in result.get("attachments", []) if a["name"] == name]
    assert len(found) == 1, [a["name"] for a in result.get("attachments", [])]
    return (result["_dir"] / found[0]["source"]).read_text()


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> tuple[dict, dict]:
    tmp = tmp_path_factory.mktemp("history")
    return _run_tiny(tmp, 1.25), _run_tiny(tmp, 4.5)


@pytest.mark.cluster
def test_a_check_keeps_its_history_id_when_its_figures_change(two_runs):
    first, second = two_runs
    for check in ("test_measures", "test_per_mode[paced]", "test_per_mode[storm]"):
        assert first[check]["historyId"] == second[check]["historyId"], check
        assert first[check]["testCaseId"] == second[check]["testCaseId"], check
    # The figures really differed between the runs (the data beside the table).
    values = [{f["name"]: f["value"] for f in json.loads(_attachment(r["test_measures"], "figures (data)"))}
              for r in two_runs]
    assert values[0]["latency p99"] == 1.25 and values[1]["latency p99"] == 4.5
    # A pytest parameter still tells two checks of one function apart.
    assert first["test_per_mode[paced]"]["historyId"] != first["test_per_mode[storm]"]["historyId"]
    # No figure is a parameter; the descriptive one is shown, excluded.
    params = first["test_measures"].get("parameters", [])
    assert [(p["name"], p.get("excluded")) for p in params] == [("gang backend", True)], params


@pytest.mark.control
def test_a_figure_recorded_as_a_plain_parameter_would_change_the_history_id(two_runs):
    """The negative control: the old way (``allure.dynamic.parameter(name, value)``) is caught by the
    comparison above."""
    first, second = two_runs
    assert first["test_the_old_way"]["testCaseId"] == second["test_the_old_way"]["testCaseId"]
    assert first["test_the_old_way"]["historyId"] != second["test_the_old_way"]["historyId"]


@pytest.mark.unit
def test_the_page_shows_the_checks_own_docstring_and_its_figures_whole(two_runs):
    first, _ = two_runs
    r = first["test_measures"]
    html = r["descriptionHtml"]
    assert "Records three figures whose values change every run." in html, html
    assert "must stay off the pages" not in html, html
    assert "docs/suites/tiny.md" in html and "The tiny suite&#x27;s story: one line." in html, html
    labels = {lb["name"]: lb["value"] for lb in r["labels"]}
    assert labels["suite"] == "tiny: The tiny suite's story: one line.", labels
    table = _attachment(r, "figures")
    rows = re.findall(r"<tr class=\"[^\"]*\"><td>(.*?)</td><td class=\"n\">(.*?)</td><td>(.*?)</td>"
                      r"<td class=\"n\">(.*?)</td><td[^>]*>(.*?)</td></tr>", table)
    assert rows == [("latency p99", "1.25", "s", "&lt;= 5", "within"),
                    ("bytes per change", "26,543.1", "B", "&lt;= 1,000", "BEYOND"),
                    ("pods seen", "3", "pods", "", "not judged")], table
    # Once per check: the other checks have their own table (of their one figure).
    assert _attachment(first["test_per_mode[paced]"], "figures").count("<tr class=") == 1


@pytest.mark.unit
def test_a_domains_attachments_reach_the_page_with_their_name_body_and_kind(two_runs):
    """What a domain hands over (``clusterproof.core.attachment``) is what the page shows: the name, the body
    (a file's as it was) and the kind's MIME type."""
    r = two_runs[0]["test_hands_over_attachments"]
    got = {a["name"]: (a["type"], (r["_dir"] / a["source"]).read_text()) for a in r.get("attachments", [])}
    want = {"a text": ("text/plain", "one line"), "some json": ("application/json", '{"x": 1}'),
            "a csv file": ("text/csv", "a,b\n1,2\n")}
    assert {k: got.get(k) for k in want} == want, got


@pytest.mark.unit
def test_an_attachment_of_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="kind 'png'"):
        Attachment("a plot", "", "png")


@pytest.mark.unit
def test_the_figures_table_has_one_row_per_figure_with_its_verdict():
    figs = [Figure.of("c", "p99", 0.0123, "s", 1.0), Figure.of("c", "bytes", 2.12e4, "B", 1e4),
            Figure.of("c", "never measured", None, "s", 1.0), Figure.of("c", "count", 7, "pods"),
            Figure.of("c", "headline", 3, "s", 5.0, headline=True)]
    table = page.figures_table(figs)
    assert table.count("<tr class=") == len(figs)
    assert table.index(">headline<") < table.index(">p99<"), "headline figures come first"
    for words in (">0.0123<", ">21,200<", ">within<", ">BEYOND<", ">not measured<", ">not judged<",
                  '<tr class="headline">'):
        assert words in table, (words, table)
    assert "1 beyond" in table and "5 figures, 3 judged" in table
    data = json.loads(page.figures_data(figs))
    assert [d["verdict"] for d in data] == ["within", "within", "beyond", None, None]


@pytest.mark.unit
def test_the_description_is_the_checks_own_docstring_and_a_suite_footer():
    def test_x():
        """What this check proves. Red: what broke."""
    module = types.SimpleNamespace(__doc__="The suite holds. And a long story\n\nthat is not on the check's page.")
    item = types.SimpleNamespace(function=test_x, module=module, path=Path("/x/suites/test_gang_scheduling.py"))
    assert page.description(item) == "What this check proves. Red: what broke."
    assert page.suite_of(item) == "gang_scheduling" and page.suite_line(item) == "The suite holds."
    footer = page.suite_footer(item)
    assert "docs/suites/gang_scheduling.md" in footer and "The suite holds." in footer
    assert "long story" not in footer
    selftest = types.SimpleNamespace(function=test_x, module=module, path=Path("/x/tests/test_y.py"))
    assert page.suite_of(selftest) is None and page.suite_footer(selftest) == ""
    bare = types.SimpleNamespace(function=lambda: None, module=module, path=Path("/x/tests/test_y.py"))
    assert page.description(bare) == ""


def _checks(path: Path):
    return [n for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test_")]


@pytest.mark.unit
def test_every_suite_check_has_a_short_docstring_of_its_own_that_says_what_red_means():
    bad = []
    for path in SUITES:
        for fn in _checks(path):
            doc = ast.get_docstring(fn)
            where = f"{path.relative_to(ROOT)}:{fn.lineno} {fn.name}"
            if not doc:
                bad.append(f"{where}: no docstring (its page would be empty: say what it proves and what red means)")
            elif len(doc) > LONGEST_DOC:
                bad.append(f"{where}: a docstring of {len(doc)} characters (at most {LONGEST_DOC}: the page is "
                           "read in 30 seconds; details go in a comment or the suite's doc page)")
            elif not re.search(r"\bred\b", doc, re.IGNORECASE):
                bad.append(f"{where}: the docstring does not say what red means")
    assert SUITES and not bad, "\n".join(bad)


@pytest.mark.unit
def test_the_suite_check_above_would_catch_a_check_without_a_docstring(tmp_path):
    path = tmp_path / "test_x.py"
    path.write_text('def test_a():\n    """Proves a. Red: not a."""\n\n\ndef test_b():\n    pass\n')
    assert [(fn.name, ast.get_docstring(fn)) for fn in _checks(path)] == [("test_a", "Proves a. Red: not a."),
                                                                          ("test_b", None)]


def _parameter_calls(tree: ast.AST):
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "parameter" \
                and ast.unparse(n.func.value) in ("allure.dynamic", "dynamic"):
            yield n


def _not_excluded(tree: ast.AST) -> list[int]:
    return [c.lineno for c in _parameter_calls(tree)
            if not any(k.arg == "excluded" and isinstance(k.value, ast.Constant) and k.value.value is True
                       for k in c.keywords)]


@pytest.mark.cluster
def test_no_allure_parameter_of_ours_enters_the_history_id():
    """Every ``allure.dynamic.parameter`` in the package, the plugin and the suites passes ``excluded=True``:
    a description names versions, images and errors, a measurement changes nightly; the check's identity is
    its name and its pytest parameters."""
    files = [p for d in ("clusterproof", "fixtures", "suites") for p in (ROOT / d).rglob("*.py")]
    bad = [f"{p.relative_to(ROOT)}:{line}: allure.dynamic.parameter without excluded=True (it would change the "
           "check's historyId whenever its value changes)" for p in files for line in _not_excluded(
               ast.parse(p.read_text()))]
    assert files and not bad, "\n".join(bad)
    assert len(_not_excluded(ast.parse(TINY))) == 1, "the scan must see the tiny suite's plain parameter"


@pytest.mark.cluster
def test_every_suite_checks_pytest_parameters_are_the_same_from_run_to_run(tmp_path):
    """allure-pytest puts a pytest parameter's *value* (its repr) into the historyId: a value whose repr holds an
    address or any other per-run detail would split a check's history (two collections must agree)."""
    probe = tmp_path / "cp_params_probe.py"
    probe.write_text("import os\n\n\ndef pytest_collection_modifyitems(items):\n"
                     "    with open(os.environ['CP_PARAMS_OUT'], 'w') as fh:\n"
                     "        for item in items:\n"
                     "            params = getattr(getattr(item, 'callspec', None), 'params', {})\n"
                     "            fh.write(f'{item.nodeid} {sorted((k, repr(v)) for k, v in params.items())}\\n')\n")
    seen = []
    for i in range(2):
        out = tmp_path / f"params-{i}.txt"
        env = {**os.environ, "CP_PARAMS_OUT": str(out),
               "PYTHONPATH": os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
        proc = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "cp_params_probe",
                               f"--cp-output-dir={tmp_path / 'out'}", "suites", "--cp-profile", "smoke"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        seen.append(out.read_text())
    assert seen[0] == seen[1]
    assert "[(" in seen[0], "some suite check is parametrized"
    addresses = [ln for ln in seen[0].splitlines() if re.search(r" at 0x[0-9a-f]+", ln)]
    assert not addresses, "\n".join(addresses)


@pytest.mark.unit
def test_environment_keys_stay_whole_in_allure_properties(tmp_path):
    """Allure reads environment.properties as Java does: an unescaped space, ':' or '=' ends a key, and
    every such key would collapse into one row. Keys are escaped; plain ones are written as they are."""
    from clusterproof.report.allure import write_environment
    write_environment(tmp_path, {"harness.cpu: watch": "0.1 cores", "run.id": "x"}, has_cluster=True)
    lines = (tmp_path / "environment.properties").read_text().splitlines()
    assert lines == ["harness.cpu\\:\\ watch=0.1 cores", "run.id=x"], lines
