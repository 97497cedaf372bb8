"""Self-tests of the nightly pipeline: the workflow passes a real linter, and .ci/nightly does its steps.

actionlint (built from the module proxy, fixtures.toolchain.ACTIONLINT) checks
.github/workflows/nightly.yml -- expressions, inputs, action inputs, cron,
permissions -- and must catch a broken copy of it (the negative control).
.ci/nightly is exercised with ``make`` replaced by a recorder on PATH: which
arguments reach the main job (baseline, kubeconfig), that the history is
carried over, and that the report is built and the main job's status kept
when the run fails. (The real steps ran as README "Nightly pipeline" says.)
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fixtures import toolchain

pytestmark = pytest.mark.selftest
ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "nightly.yml"


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


def _nightly(tmp_path: Path, make_status: dict[str, int], **env: str) -> tuple[int, list[list[str]], Path]:
    """.ci/nightly in a copy of the repository's script, with ``make`` recording its arguments."""
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "nightly", repo / ".ci" / "nightly")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "make.log"
    (bin_dir / "make").write_text(
        "#!/usr/bin/env bash\n"
        f"python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' \"$@\" >> {log}\n"
        f"case \"$1\" in run) exit {make_status.get('run', 0)};; report) exit {make_status.get('report', 0)};; esac\n")
    (bin_dir / "make").chmod(0o755)
    proc = subprocess.run([str(repo / ".ci" / "nightly")], cwd=repo, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", **env})
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc.returncode, calls, repo


def test_the_nightly_script_compares_with_the_last_good_night_and_carries_the_history(tmp_path):
    prev = tmp_path / "prev"
    (prev / "history").mkdir(parents=True)
    (prev / "history" / "history-trend.json").write_text("[]")
    (prev / "summary.json").write_text("{}")
    status, calls, repo = _nightly(tmp_path, {}, PREVIOUS=str(prev), KUBECONFIG_FILE="/tmp/kc", PROFILE="smoke")
    assert status == 0
    assert calls[0] == ["run", "PROFILE=smoke", f"ARGS=--baseline {prev}/summary.json --kubeconfig /tmp/kc"]
    assert calls[1] == ["report"]
    assert (repo / "reports" / "history" / "history-trend.json").exists()


def test_the_nightly_script_builds_the_report_and_keeps_the_status_of_a_failed_night(tmp_path):
    status, calls, _ = _nightly(tmp_path, {"run": 2}, PREVIOUS=str(tmp_path / "none"))
    assert status == 2 and [c[0] for c in calls] == ["run", "report"]
    assert calls[0] == ["run", "PROFILE=nightly", "ARGS="]
    status, _, _ = _nightly(tmp_path / "again", {"report": 2}, PREVIOUS=str(tmp_path / "none"))
    assert status == 3
