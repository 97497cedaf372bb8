"""Self-tests of the nightly pipeline: the workflow passes a real linter, and .ci/nightly does its steps.

actionlint (built from the module proxy, clusterproof.cluster.toolchain.ACTIONLINT) checks
.github/workflows/nightly.yml -- expressions, inputs, action inputs, cron,
permissions -- and must catch a broken copy of it (the negative control).
Two rules of this project's own that actionlint does not know (it treats
workflow_dispatch inputs as trusted) are checked here, with broken copies
too: no ``${{ }}`` inside a ``run:`` script (inputs and secrets reach scripts
only through ``env:``), and both GitHub Pages steps require .ci/nightly's
``pages`` decision (a real cluster's report is published only on opt-in).
.ci/nightly is exercised with ``./proof`` replaced by a recorder: which
arguments reach the main job (baseline, kubeconfig), that the history is
carried over, that the report is built, and that the main job's exit code
comes out unchanged (1, 4, 6...; 9 only when the run passed and the report
failed: docs/exit-codes.md). (The real steps ran as docs/baselines.md "The nightly pipeline" says.)
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from clusterproof.cluster import toolchain

pytestmark = pytest.mark.selftest
ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "nightly.yml"
# What .ci/nightly reads from its environment: only what a test gives it (not this machine's).
NIGHTLY_ENV = ("PROFILE", "ARGS", "PREVIOUS", "KUBECONFIG_FILE", "PUBLISH_REAL_CLUSTER_REPORT", "GITHUB_OUTPUT",
               "CLUSTERPROOF_OUTPUT_DIR")


@pytest.fixture(scope="module")
def actionlint() -> Path:
    return toolchain.ensure(toolchain.ACTIONLINT, progress=print).path("actionlint")


def _lint(actionlint: Path, path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(actionlint), "-no-color", str(path)], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def test_the_nightly_workflow_passes_actionlint(actionlint):
    run = _lint(actionlint, WORKFLOW)
    assert run.returncode == 0, f"actionlint found problems in {WORKFLOW}:\n{run.stdout}{run.stderr}"


@pytest.mark.parametrize("old,new,expected", [
    ("inputs.kubeconfig_secret != ''", "inputs.kubeconfig_secrt != ''", 'property "kubeconfig_secrt" is not defined'),
    ('cron: "17 2 * * *"', 'cron: "17 25 * * *"', "invalid CRON format"),
    ("timeout-minutes: 90", "timeout-minutes: ninety", "timeout-minutes"),
], ids=["undefined-input", "bad-cron", "bad-timeout"])
def test_actionlint_catches_a_broken_copy_of_the_workflow(actionlint, tmp_path, old, new, expected):
    text = WORKFLOW.read_text()
    assert old in text, f"the control's anchor {old!r} is gone from the workflow: update the control"
    broken = tmp_path / ".github" / "workflows" / "nightly.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text(text.replace(old, new, 1))
    run = _lint(actionlint, broken)
    assert run.returncode != 0 and expected in run.stdout, run.stdout + run.stderr


PAGES_STEP_GATE = "steps.nightly.outputs.pages == 'true'"
PAGES_JOB_GATE = "needs.nightly.outputs.pages == 'true'"


def guest_rule_problems(text: str) -> list[str]:
    """What breaks the project's two workflow rules (module doc) in a workflow's text."""
    doc = yaml.safe_load(text)
    problems = []
    for job_name, job in (doc.get("jobs") or {}).items():
        for i, step in enumerate(job.get("steps") or []):
            where = f"job {job_name}, step {step.get('name') or step.get('id') or i}"
            if "${{" in str(step.get("run", "")):
                problems.append(f"{where}: an expression inside run: (pass the value through env:)")
            uses = str(step.get("uses", ""))
            if uses.startswith("actions/upload-pages-artifact@") and PAGES_STEP_GATE not in str(step.get("if", "")):
                problems.append(f"{where}: uploads for Pages without {PAGES_STEP_GATE}")
            if uses.startswith("actions/deploy-pages@") and PAGES_JOB_GATE not in str(job.get("if", "")):
                problems.append(f"job {job_name}: deploys to Pages without {PAGES_JOB_GATE}")
    if "${{ steps.nightly.outputs.pages }}" not in str((doc["jobs"]["nightly"].get("outputs") or {}).get("pages")):
        problems.append("job nightly does not pass on .ci/nightly's pages decision (outputs.pages)")
    return problems


def test_the_nightly_workflow_keeps_secrets_out_of_scripts_and_real_cluster_reports_off_pages():
    assert guest_rule_problems(WORKFLOW.read_text()) == []


@pytest.mark.parametrize("old,new,expected", [
    ('echo "::error::secret $KUBECONFIG_SECRET_NAME is empty',
     'echo "::error::secret ${{ inputs.kubeconfig_secret }} is empty', "an expression inside run:"),
    ("run: .ci/nightly", "run: PUBLISH=${{ secrets.PAGES_TOKEN }} .ci/nightly", "an expression inside run:"),
    ("if: always() && steps.nightly.outputs.pages == 'true' && hashFiles(", "if: always() && hashFiles(",
     "uploads for Pages without"),
    ("always() && needs.nightly.outputs.pages == 'true' &&", "always() &&", "deploys to Pages without"),
], ids=["input-in-run", "secret-in-run", "real-report-uploaded-for-pages", "real-report-deployed"])
def test_a_copy_that_leaks_a_secret_or_publishes_a_real_cluster_report_is_caught(old, new, expected):
    text = WORKFLOW.read_text()
    assert old in text, f"the control's anchor {old!r} is gone from the workflow: update the control"
    problems = guest_rule_problems(text.replace(old, new, 1))
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize("env,pages", [
    pytest.param({}, "true", id="embedded"),
    pytest.param({"KUBECONFIG_FILE": "/tmp/kc"}, "false", id="existing-cluster"),
    pytest.param({"KUBECONFIG_FILE": "/tmp/kc", "PUBLISH_REAL_CLUSTER_REPORT": "false"}, "false",
                 id="existing-cluster-not-opted-in"),
    pytest.param({"KUBECONFIG_FILE": "/tmp/kc", "PUBLISH_REAL_CLUSTER_REPORT": "true"}, "true",
                 id="existing-cluster-opted-in"),
])
def test_the_nightly_script_publishes_a_real_clusters_report_only_on_opt_in(tmp_path, env, pages):
    """.ci/nightly decides before the main job runs; a main job that fails (or never ends) cannot
    change that decision."""
    out = tmp_path / "github_output"
    status, calls, _ = _nightly(tmp_path, {"run": 1}, PREVIOUS=str(tmp_path / "none"), GITHUB_OUTPUT=str(out),
                                **env)
    assert status == 1 and calls[0][0] == "run"
    # the decision first; the run's directory (for the upload steps) after the run
    assert out.read_text().splitlines() == [f"pages={pages}", "run=out/runs/night-1"]


def _nightly(tmp_path: Path, status: dict[str, int], **env: str) -> tuple[int, list[list[str]], Path]:
    """.ci/nightly in a copy of the repository's script, with ``./proof`` recording its arguments (and the
    PROFILE and ARGS it was given, as ``PROFILE=...``, ``ARGS=...`` after them)."""
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "nightly", repo / ".ci" / "nightly")
    log = tmp_path / "proof.log"
    (repo / "proof").write_text(
        "#!/usr/bin/env bash\n"
        "python3 -c 'import json,os,sys; e = os.environ.get; "
        "print(json.dumps(sys.argv[1:] + [\"PROFILE=\" + e(\"PROFILE\", \"\"), \"ARGS=\" + e(\"ARGS\", \"\")]))' "
        f"\"$@\" >> {log}\n"
        # a run makes its directory and points out/latest at it, as the plugin does (clusterproof.core.outputs)
        "case \"$1\" in run) mkdir -p out/runs/night-1 && ln -sfn runs/night-1 out/latest;; esac\n"
        f"case \"$1\" in run) exit {status.get('run', 0)};; report) exit {status.get('report', 0)};; esac\n")
    (repo / "proof").chmod(0o755)
    proc = subprocess.run([str(repo / ".ci" / "nightly")], cwd=repo, capture_output=True, text=True, timeout=60,
                          env={**{k: v for k, v in os.environ.items() if k not in NIGHTLY_ENV},
                               "ARGS": "--from-the-environment", **env})
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc.returncode, calls, repo


def test_the_nightly_script_compares_with_the_last_good_night_and_carries_the_history(tmp_path):
    prev = tmp_path / "prev"
    (prev / "history").mkdir(parents=True)
    (prev / "history" / "history-trend.json").write_text("[]")
    (prev / "summary.json").write_text("{}")
    status, calls, repo = _nightly(tmp_path, {}, PREVIOUS=str(prev), KUBECONFIG_FILE="/tmp/kc", PROFILE="smoke")
    assert status == 0
    assert calls[0] == ["run", "--baseline", f"{prev}/summary.json", "--kubeconfig", "/tmp/kc", "PROFILE=smoke",
                        "ARGS="]
    assert calls[1][0] == "report" and len(calls[1]) == 3
    assert (repo / "out" / "history" / "history-trend.json").exists()


@pytest.mark.parametrize("run,report,expected", [
    (1, 0, 1), (4, 0, 4), (6, 0, 6), (7, 0, 7), (8, 0, 8),   # the run's own code, unchanged, report built
    (0, 9, 9),                                               # only the report failed: 9
    (1, 9, 1),                                               # both: the run's code says more
])
def test_the_nightly_script_builds_the_report_and_passes_the_runs_exit_code_through(tmp_path, run, report, expected):
    status, calls, _ = _nightly(tmp_path, {"run": run, "report": report}, PREVIOUS=str(tmp_path / "none"))
    assert status == expected and [c[0] for c in calls] == ["run", "report"]
    assert calls[0] == ["run", "PROFILE=nightly", "ARGS="]
