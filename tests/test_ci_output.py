"""Self-tests of what a CI gets from a run: JUnit XML, the job summary, executor.json, and --lf.

Real pytest runs of small check files of their own (no cluster), through the
plugin and this checkout's pytest.ini, into a temporary output directory:

- every run writes ``junit.xml`` into its run directory, and says so; an
  explicit ``--junitxml`` wins;
- with ``$GITHUB_STEP_SUMMARY`` set, the run appends its verdict, counts and
  each check that did not pass with the Allure category -- the very category
  Allure gives the result allure-pytest wrote (read back from the results);
- ``executor.json`` names the CI build (GitHub Actions, a generic CI through
  ``CLUSTERPROOF_CI_*``) or the local run;
- ``--lf`` reruns only the last failures, with pytest's cache under the output
  directory and never in the project.

The job summary of a suite run (figures, a regression, exit 6) is checked on
the pure function with a summary and a comparison built as a run builds them.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from clusterproof.core import outputs
from clusterproof.report import allure as allure_page
from clusterproof.report import ci, compare
from clusterproof.report.summary import ReportSession

ROOT = Path(__file__).resolve().parent.parent
# What the child runs read from the environment: only what a test gives them (not this machine's CI).
CI_VARS = ("GITHUB_STEP_SUMMARY", "GITHUB_ACTIONS", "GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID",
           "GITHUB_RUN_NUMBER", "GITHUB_RUN_ATTEMPT", "GITHUB_WORKFLOW", "GITHUB_SHA", outputs.ENV,
           outputs.PYTEST_CACHE_ENV)

KINDS = '''import pytest

def test_ok():
    pass

def test_bare_assert():
    assert 1 == 2

def test_slo():
    assert False, "pod startup p99 SLO broken: 9 s > 5 s"

def test_harness_line():
    pytest.fail("clusterproof: the kubeconfig names no cluster", pytrace=False)

def test_plain_fail():
    pytest.fail("node gpu-7 is not ready")

def test_other_exception():
    raise RuntimeError("boom")

def test_control_plane():
    raise ValueError("this module broke the control plane: kube-apiserver exited")

@pytest.fixture
def broken_fixture():
    raise OSError("no such file")

def test_setup_error(broken_fixture):
    pass

@pytest.mark.xfail(strict=True, reason="upstream bug 123")
def test_strict_xpass():
    pass

@pytest.mark.xfail(reason="upstream bug 456")
def test_known_limitation():
    assert False
'''


def _run(tmp_path: Path, files: dict[str, str], *args: str, **env: str) -> subprocess.CompletedProcess:
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    for name, text in files.items():
        (project / name).write_text(text)
    child = {k: v for k, v in os.environ.items() if k not in CI_VARS and not k.startswith(ci.CI_ENV)}
    child["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    cmd = [sys.executable, "-m", "pytest", "-p", "no:randomly", "-c", str(ROOT / "pytest.ini"), f"--rootdir={project}",
           f"--cp-output-dir={tmp_path / 'out'}", *args]
    return subprocess.run(cmd, cwd=project, env={**child, **env}, capture_output=True, text=True, timeout=300)


def _runs(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "out" / "runs").iterdir(), key=lambda p: p.stat().st_mtime)


@pytest.mark.cluster
def test_every_run_writes_junit_xml_into_its_directory_and_an_explicit_path_wins(tmp_path):
    files = {"test_two.py": "def test_green():\n    pass\n\ndef test_red():\n    assert 0, 'red'\n"}
    run = _run(tmp_path, files, "test_two.py")
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    d, = _runs(tmp_path)
    cases = {c.get("name"): c for c in ET.parse(d / "junit.xml").getroot().iter("testcase")}
    assert set(cases) == {"test_green", "test_red"} and cases["test_red"].find("failure") is not None
    assert f"{d.name}/ (allure-results, junit.xml)" in run.stdout, run.stdout[-2000:]
    mine = tmp_path / "mine.xml"
    again = _run(tmp_path, files, "test_two.py", f"--junitxml={mine}")
    assert again.returncode == 1 and mine.exists()
    assert not (_runs(tmp_path)[-1] / "junit.xml").exists()
    assert f"JUnit XML in {mine}" in again.stdout, again.stdout[-2000:]


@pytest.mark.cluster
def test_the_job_summary_gives_each_check_the_category_allure_gives_it(tmp_path):
    target = tmp_path / "step-summary.md"
    target.write_text("an earlier step's summary\n")
    run = _run(tmp_path, {"test_kinds.py": KINDS}, "test_kinds.py", GITHUB_STEP_SUMMARY=str(target))
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    text = target.read_text()
    assert text.startswith("an earlier step's summary\n"), "the summary must be appended, never replace"
    assert "clusterproof: a check failed (exit 1)" in text
    assert "| kinds | 1 | 7 | 1 | 1 |  |  |" in text, text        # passed failed error xfailed
    rows = {m.split("`")[1].split("::")[-1]: m.split(" | ")[2] for m in text.splitlines()
            if m.startswith("| ") and "<br>`" in m}
    d, = _runs(tmp_path)
    allure_gives = {}
    for f in (d / "allure-results").glob("*-result.json"):
        r = json.loads(f.read_text())
        msg = (r.get("statusDetails") or {}).get("message")
        found = allure_page.categories(r["status"], msg)
        allure_gives[r["fullName"].split("#")[-1]] = found[0] if found else {"failed": "Product defects"}.get(
            r["status"], r["status"])
    not_passed = {k for k, v in allure_gives.items() if v not in ("passed",)} - {"test_known_limitation"}
    assert set(rows) == not_passed, (rows, allure_gives)
    assert {k: rows[k] for k in rows} == {k: allure_gives[k] for k in rows}
    # every one of the report's kinds is there (the categories' own self-test pins which message is which)
    assert set(rows.values()) >= {"Cluster defect", "SLO broken", "Harness or environment error",
                                  "Control plane broken (a module broke it, or it was broken before)"}
    assert f"`./proof report {d.name}`" in text and "(junit.xml, allure-results)" in text
    executor = json.loads((d / "allure-results" / "executor.json").read_text())
    assert executor == {"name": "local", "type": "local", "buildName": f"run {d.name}",
                        "reportName": f"clusterproof: run {d.name}"}


@pytest.mark.cluster
def test_lf_reruns_only_the_last_failures_and_the_cache_lives_in_the_output_directory(tmp_path):
    files = {"test_flaky.py": "import os\n\ndef test_a():\n    assert os.environ.get('RED') != 'a'\n\n"
                              "def test_b():\n    pass\n\ndef test_c():\n    pass\n"}
    first = _run(tmp_path, files, "-q", "test_flaky.py", RED="a")
    assert first.returncode == 1 and "1 failed, 2 passed" in first.stdout, first.stdout[-2000:]
    again = _run(tmp_path, files, "-q", "--lf", "test_flaky.py")
    assert again.returncode == 0 and "1 passed, 2 deselected" in again.stdout, again.stdout[-2000:]
    cache = tmp_path / "out" / "pytest-cache"
    assert (cache / "v" / "cache" / "lastfailed").exists() or (cache / "v" / "cache" / "nodeids").exists()
    project = tmp_path / "project"
    assert not [p for p in project.rglob("*") if "cache" in p.name and p.name != "__pycache__"], \
        list(project.rglob("*"))


@pytest.mark.unit
def test_the_source_tree_gets_no_pytest_cache():
    ini = (ROOT / "pytest.ini").read_text()
    assert "no:cacheprovider" not in ini and "cache_dir = ${" + outputs.PYTEST_CACHE_ENV + "}" in ini
    assert not (ROOT / ".pytest_cache").exists()
    assert not (ROOT / ("${" + outputs.PYTEST_CACHE_ENV + "}")).exists()
    assert os.environ.get(outputs.PYTEST_CACHE_ENV, "").endswith("pytest-cache"), \
        "the plugin sets the cache directory of this very session"


def _summary(run_id: str, p99: float, outcome: str = "passed") -> dict:
    check = "suites/test_burst_pod_creation.py::test_burst"
    return {"schema": compare.SCHEMA,
            "run": {"id": run_id, "profile": "smoke", "nodes": 100, "kubernetes": "v1.35.4", "backend": "kwok",
                    "simulated": True, "real_nodes": 0, "seconds": 12.5},
            "checks": {check: {"title": "Burst", "outcome": outcome}},
            "figures": {f"{check} :: startup p99": {"check": check, "name": "startup p99", "value": p99, "unit": "s",
                                                    "better": "lower", "threshold": 5.0, "op": "<=",
                                                    "headline": True, "verdict": "within"}}}


@pytest.mark.unit
def test_the_job_summary_of_a_regressed_suite_run_names_its_figures_and_what_regressed(tmp_path):
    base, now = _summary("night-1", 2.0), _summary("night-2", 4.0)
    c = compare.compare(base, now, compare.Tolerance())
    assert c.regressed
    run = outputs.for_run("night-2", tmp_path).create()
    (run.dir / "junit.xml").write_text("<testsuites/>")
    text = ci.step_summary(6, now["checks"], now, c, run, environ={})
    assert "clusterproof: regressed against the baseline (exit 6)" in text
    assert "profile smoke, 100 nodes, Kubernetes v1.35.4, simulated (kwok)" in text
    assert "| burst_pod_creation | 1 |" in text and "did not pass" not in text
    assert "| startup p99 | 4 s | <= 5 s | within |" in text
    assert "REGRESSED" in text
    assert "| suites/test_burst_pod_creation.py::test_burst :: startup p99 | 2 s | 4 s | +100.0 % | 25 % |" in text
    assert f"Outputs: `{run.shown()}` (junit.xml)" in text
    ok = ci.step_summary(0, now["checks"], now, None, run, environ={"GITHUB_SERVER_URL": "https://github.com",
                                                                    "GITHUB_REPOSITORY": "o/r", "GITHUB_SHA": "abc"})
    assert ok.startswith("### ✅ clusterproof: passed (exit 0)")
    assert "[docs/exit-codes.md](https://github.com/o/r/blob/abc/docs/exit-codes.md)" in ok


@pytest.mark.unit
def test_no_job_summary_without_the_variable_and_a_file_it_cannot_write_changes_nothing(tmp_path, capsys):
    run = outputs.for_run("run-a", tmp_path).create()
    ci.session_end({}, 1, ReportSession(), run, str(run.allure_results))
    assert sorted(p.name for p in run.dir.rglob("*")) == ["allure-results", "executor.json"]
    ci.session_end({ci.STEP_SUMMARY_ENV: str(tmp_path / "no" / "such" / "dir" / "f.md")}, 1, ReportSession(), run,
                   None)
    assert "CI output not written" in capsys.readouterr().err


GITHUB = {"GITHUB_ACTIONS": "true", "GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "acme/gpu-fleet",
          "GITHUB_RUN_ID": "9876", "GITHUB_RUN_NUMBER": "42", "GITHUB_RUN_ATTEMPT": "1", "GITHUB_WORKFLOW": "nightly"}


@pytest.mark.parametrize("env,expected", [
    pytest.param(GITHUB, {"name": "GitHub Actions", "type": "github", "url": "https://github.com/acme/gpu-fleet/actions",
                          "buildOrder": 42, "buildName": "nightly #42",
                          "buildUrl": "https://github.com/acme/gpu-fleet/actions/runs/9876",
                          "reportUrl": "https://github.com/acme/gpu-fleet/actions/runs/9876",
                          "reportName": "clusterproof: nightly #42"}, id="github"),
    pytest.param({**GITHUB, "CLUSTERPROOF_CI_NAME": "Jenkins", "CLUSTERPROOF_CI_TYPE": "jenkins",
                  "CLUSTERPROOF_CI_URL": "https://ci.example/job/nightly", "CLUSTERPROOF_CI_BUILD_NAME": "nightly #7",
                  "CLUSTERPROOF_CI_BUILD_URL": "https://ci.example/job/nightly/7", "CLUSTERPROOF_CI_BUILD_ORDER": "7"},
                 {"name": "Jenkins", "type": "jenkins", "url": "https://ci.example/job/nightly", "buildOrder": 7,
                  "buildName": "nightly #7", "buildUrl": "https://ci.example/job/nightly/7",
                  "reportUrl": "https://ci.example/job/nightly/7", "reportName": "clusterproof: nightly #7"},
                 id="generic-wins"),
    pytest.param({}, {"name": "local", "type": "local", "buildName": "run r1", "reportName": "clusterproof: run r1"},
                 id="local"),
])
@pytest.mark.unit
def test_executor_json_names_the_ci_build_or_the_local_run(env, expected):
    got = ci.executor(env, "r1")
    assert got == expected
    allowed = {"name", "type", "url", "buildOrder", "buildName", "buildUrl", "reportUrl", "reportName"}
    assert set(got) <= allowed and isinstance(got.get("buildOrder", 0), int)   # Allure 2's ExecutorInfo


@pytest.mark.unit
def test_executor_json_says_a_retry_and_leaves_out_a_build_order_that_is_no_number(capsys):
    assert ci.executor({**GITHUB, "GITHUB_RUN_ATTEMPT": "2"}, "r1")["buildName"] == "nightly #42 (attempt 2)"
    got = ci.executor({"CLUSTERPROOF_CI_NAME": "Buildkite", "CLUSTERPROOF_CI_BUILD_ORDER": "seven"}, "r1")
    assert got == {"name": "Buildkite", "reportName": "clusterproof: Buildkite"}
    assert "CLUSTERPROOF_CI_BUILD_ORDER='seven' is not an integer" in capsys.readouterr().err
