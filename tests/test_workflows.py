"""Self-tests of the nightly pipeline: the workflow passes two real linters, and .ci/nightly does its steps.

actionlint (built from the module proxy, clusterproof.provision.toolchain.ACTIONLINT) checks
.github/workflows/nightly.yml -- expressions, inputs, action inputs, cron,
permissions -- and must catch a broken copy of it (the negative control).
zizmor (pinned in requirements.txt) audits the workflows for security -- template injection, unpinned
actions, secrets chosen by an expression or read outside an environment, credentials left in the
checkout, broad permissions -- offline, and must catch a known-bad copy of each kind.
Rules of this project's own that neither knows fully are checked here, with broken copies
too: no ``${{ }}`` inside a ``run:`` script (inputs and secrets reach scripts
only through ``env:``); both GitHub Pages steps require .ci/nightly's
``pages`` decision (a real cluster's report is published only on opt-in); the one secret,
CLUSTERPROOF_KUBECONFIG, is read by name and only in the environment cluster-validation; and every
action is pinned to the commit this file records for its tag (PINS).
.ci/nightly is exercised with ``./proof`` replaced by a recorder: which
arguments reach the main job (baseline, kubeconfig), that the history is
carried over, that the report is built, and that the main job's exit code
comes out unchanged (1, 4, 6...; 9 only when the run passed and the report
failed: docs/exit-codes.md). (The real steps ran as docs/baselines.md "The nightly pipeline" says.)
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from clusterproof.provision import toolchain

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
WORKFLOW = WORKFLOWS / "nightly.yml"
CI = WORKFLOWS / "ci.yml"
# What .ci/nightly reads from its environment: only what a test gives it (not this machine's).
NIGHTLY_ENV = ("PROFILE", "ARGS", "PREVIOUS", "KUBECONFIG_FILE", "PUBLISH_REAL_CLUSTER_REPORT", "GITHUB_OUTPUT",
               "CLUSTERPROOF_OUTPUT_DIR")


@pytest.fixture(scope="module")
def actionlint() -> Path:
    return toolchain.ensure(toolchain.ACTIONLINT, progress=print).path("actionlint")


def _lint(actionlint: Path, path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(actionlint), "-no-color", str(path)], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


@pytest.mark.cluster
@pytest.mark.parametrize("path", [WORKFLOW, CI], ids=lambda p: p.name)
def test_the_workflows_pass_actionlint(actionlint, path):
    run = _lint(actionlint, path)
    assert run.returncode == 0, f"actionlint found problems in {path}:\n{run.stdout}{run.stderr}"


@pytest.mark.parametrize("old,new,expected", [
    ("if: inputs.existing_cluster\n", "if: inputs.existing_clustr\n", 'property "existing_clustr" is not defined'),
    ('cron: "17 2 * * *"', 'cron: "17 25 * * *"', "invalid CRON format"),
    ("timeout-minutes: 90", "timeout-minutes: ninety", "timeout-minutes"),
], ids=["undefined-input", "bad-cron", "bad-timeout"])
@pytest.mark.cluster
def test_actionlint_catches_a_broken_copy_of_the_workflow(actionlint, tmp_path, old, new, expected):
    text = WORKFLOW.read_text()
    assert old in text, f"the control's anchor {old!r} is gone from the workflow: update the control"
    broken = tmp_path / ".github" / "workflows" / "nightly.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text(text.replace(old, new, 1))
    run = _lint(actionlint, broken)
    assert run.returncode != 0 and expected in run.stdout, run.stdout + run.stderr


ZIZMOR = Path(sys.executable).parent / "zizmor"
ZIZMOR_FINDING = re.compile(r"^(?:error|warning|help|info|note)\[([\w-]+)\]", re.M)


def _zizmor(workflows: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    """zizmor over a directory of workflows: the run and the audits it reported (one entry per finding).

    --offline: the online audits (known-vulnerable actions, impostor commits) ask the GitHub API, which a
    self-test cannot reach. --persona auditor: every audit, the suspicious ones too (secrets-outside-env is
    one). --no-config: nothing outside the workflow can silence a finding; the only way is an inline
    ``# zizmor: ignore[audit]`` beside its reason. --strict-collection: a workflow zizmor cannot parse is an
    error, not a file skipped with a warning and no finding."""
    if not ZIZMOR.exists():
        pytest.fail(f"zizmor is not installed in {ZIZMOR.parent} (it is pinned in requirements.txt: make setup)",
                    pytrace=False)
    run = subprocess.run([str(ZIZMOR), "--offline", "--no-config", "--persona", "auditor", "--strict-collection",
                          "--format", "plain", "--color", "never", str(workflows)],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    return run, ZIZMOR_FINDING.findall(run.stdout)


@pytest.mark.unit
def test_the_workflows_pass_zizmor():
    run, findings = _zizmor(WORKFLOWS)
    assert run.returncode == 0 and not findings and "No findings" in run.stdout, (
        f"zizmor found problems in {WORKFLOWS} (exit {run.returncode}):\n{run.stdout}{run.stderr}")


@pytest.mark.parametrize("old,new,audit", [
    ("${{ secrets.CLUSTERPROOF_KUBECONFIG }}", "${{ secrets[inputs.profile] }}", "overprovisioned-secrets"),
    ("actions/checkout@11d5960a326750d5838078e36cf38b85af677262 # v4.4.0", "actions/checkout@v4", "unpinned-uses"),
    ("run: .ci/nightly", "run: PROFILE=${{ inputs.profile }} .ci/nightly", "template-injection"),
    ("\n        with:\n          persist-credentials: false", "", "artipacked"),
    ("    environment: ${{ inputs.existing_cluster && 'cluster-validation' || '' }}\n", "", "secrets-outside-env"),
], ids=["secret-chosen-by-input", "action-pinned-by-tag", "input-in-run", "credentials-left-in-checkout",
        "secret-outside-environment"])
@pytest.mark.unit
def test_zizmor_catches_a_known_bad_copy_of_the_workflow(tmp_path, old, new, audit):
    """Negative control: each copy brings back one hole zizmor must find (the first is the workflow's own
    past: whoever dispatched it could load any repository secret by name)."""
    text = WORKFLOW.read_text()
    assert old in text, f"the control's anchor {old!r} is gone from the workflow: update the control"
    broken = tmp_path / ".github" / "workflows"
    broken.mkdir(parents=True)
    (broken / "nightly.yml").write_text(text.replace(old, new, 1))
    run, findings = _zizmor(broken)
    assert run.returncode != 0 and audit in findings, (
        f"zizmor did not report {audit} for a copy of the workflow with {new or 'no'!r} instead of {old!r} "
        f"(exit {run.returncode}, findings {findings}):\n{run.stdout}{run.stderr}")


# Which tag each pinned commit is, read from a snapshot of the action's repository (git rev-list -n1 <tag>,
# annotated tags peeled to their commit) on 2026-11-27: for each, the newest release of the major version the
# workflow named before it was pinned, the commit that major's tag pointed to then. A new pin changes both.
PINS = {
    "actions/checkout": ("v4.4.0", "11d5960a326750d5838078e36cf38b85af677262"),
    "actions/setup-go": ("v5.6.0", "40f1582b2485089dde7abd97c1529aa768e1baff"),
    "actions/setup-python": ("v5.6.0", "a26af69be951a213d495a4c3e4e4022e16d87065"),
    "actions/setup-java": ("v4.9.1", "cf277c60eb25467037889841efdb72551f06f6c3"),
    "actions/setup-node": ("v4.4.0", "49933ea5288caeca8642d1e84afbd3f7d6820020"),
    "actions/cache": ("v4.3.0", "0057852bfaa89a56745cba8c7296529d2fc39830"),
    "actions/upload-artifact": ("v4.6.2", "ea165f8d65b6e75b540449e92b4886f43607fa02"),
    "actions/upload-pages-artifact": ("v3.0.1", "56afc609e74202658d3ffba0e8f6dda462b719fa"),
    "actions/deploy-pages": ("v4.0.5", "d6db90164ac5ed86f2b6aed7e0febac5b3c0c03e"),
}
PINNED = re.compile(r"(?P<action>[\w.-]+/[\w./-]+)@(?P<sha>[0-9a-f]{40})")
# A uses: line and its trailing comment (YAML drops comments; the tag is only there).
USES_LINE = re.compile(r"^\s*(?:-\s+)?uses:\s*(?P<ref>[^\s#]+)[ \t]*(?:#[ \t]*(?P<tag>\S+))?", re.M)


def pin_problems(text: str) -> list[str]:
    """Every ``uses:`` (of a step or of a job) names a commit by its full SHA, the one PINS records for the tag
    in its trailing comment: a tag or a branch can be moved to other code; a commit cannot."""
    doc = yaml.safe_load(text)
    refs = [str(step["uses"]) for job in (doc.get("jobs") or {}).values()
            for step in [job, *(job.get("steps") or [])] if "uses" in step]
    tags = {}
    for line in USES_LINE.finditer(text):
        tags.setdefault(line["ref"], set()).add(line["tag"])
    problems = []
    for ref in refs:
        pinned = PINNED.fullmatch(ref)
        if not pinned:
            problems.append(f"uses: {ref} is not pinned to a commit (action@<40-hex SHA> # <tag>)")
            continue
        recorded = PINS.get(pinned["action"])
        if recorded is None:
            problems.append(f"uses: {ref}: {pinned['action']} has no recorded pin (PINS in tests/test_workflows.py)")
        elif pinned["sha"] != recorded[1]:
            problems.append(f"uses: {ref} is not the commit recorded for {pinned['action']} {recorded[0]} "
                            f"({recorded[1]})")
        elif tags.get(ref, {None}) != {recorded[0]}:
            said = ", ".join(sorted(tag or "no tag" for tag in tags.get(ref, {None})))
            problems.append(f"uses: {ref} says {said} in its comment, but that commit is {recorded[0]}")
    return problems


@pytest.mark.parametrize("path", sorted(WORKFLOWS.glob("*.y*ml")), ids=lambda p: p.name)
@pytest.mark.unit
def test_every_action_is_pinned_to_its_recorded_commit(path):
    assert pin_problems(path.read_text()) == []


@pytest.mark.parametrize("old,new,expected", [
    ("actions/checkout@11d5960a326750d5838078e36cf38b85af677262 # v4.4.0", "actions/checkout@v4",
     "is not pinned to a commit"),
    ("actions/setup-go@40f1582b2485089dde7abd97c1529aa768e1baff", "actions/setup-go@40f1582", "is not pinned"),
    ("actions/cache@0057852bfaa89a56745cba8c7296529d2fc39830", "actions/cache@main", "is not pinned"),
    ("actions/deploy-pages@d6db90164ac5ed86f2b6aed7e0febac5b3c0c03e",
     "actions/deploy-pages@0000000000000000000000000000000000000000", "is not the commit recorded"),
    ("actions/setup-java@cf277c60eb25467037889841efdb72551f06f6c3 # v4.9.1",
     "actions/setup-java@cf277c60eb25467037889841efdb72551f06f6c3 # v4.9.0", "says v4.9.0 in its comment"),
    ("actions/setup-node@49933ea5288caeca8642d1e84afbd3f7d6820020 # v4.4.0",
     "actions/setup-node@49933ea5288caeca8642d1e84afbd3f7d6820020", "says no tag in its comment"),
    ("actions/checkout@11d5960a326750d5838078e36cf38b85af677262",
     "someone/checkout@11d5960a326750d5838078e36cf38b85af677262", "has no recorded pin"),
], ids=["tag", "short-sha", "branch", "other-commit", "wrong-tag-comment", "no-tag-comment", "unknown-action"])
@pytest.mark.unit
def test_a_copy_with_an_action_not_pinned_to_its_recorded_commit_is_caught(old, new, expected):
    text = WORKFLOW.read_text()
    assert old in text, f"the control's anchor {old!r} is gone from the workflow: update the control"
    problems = pin_problems(text.replace(old, new, 1))
    assert any(expected in p for p in problems), problems


PAGES_STEP_GATE = "steps.nightly.outputs.pages == 'true'"
PAGES_JOB_GATE = "needs.nightly.outputs.pages == 'true'"
# The one secret the workflows read, the environment that holds it, and the input that selects that environment.
SECRET = "CLUSTERPROOF_KUBECONFIG"
SECRET_ENVIRONMENTS = ("cluster-validation", "${{ inputs.existing_cluster && 'cluster-validation' || '' }}")
SECRET_STEP_GATE = "inputs.existing_cluster"
SECRETS_REF = re.compile(r"\bsecrets\b(?P<how>\s*\[|\.\w+)?")


def _secret_refs(part: object) -> list[re.Match]:
    """The references to the secrets context in the expressions of a part of a workflow."""
    return [ref for expression in re.findall(r"\$\{\{(.*?)\}\}", json.dumps(part))
            for ref in SECRETS_REF.finditer(expression)]


def guest_rule_problems(text: str) -> list[str]:
    """What breaks the project's workflow rules (module doc) in a workflow's text."""
    doc = yaml.safe_load(text)
    problems = []
    # The secret only in the one step that needs it: not in the workflow's or a job's env, seen by every step.
    outside_steps = [{k: v for k, v in doc.items() if k != "jobs"}]
    outside_steps += [{k: v for k, v in job.items() if k != "steps"} for job in (doc.get("jobs") or {}).values()]
    if any(_secret_refs(part) for part in outside_steps):
        problems.append("a secret is read outside a step (in the workflow's or a job's keys: every step sees it)")
    for job_name, job in (doc.get("jobs") or {}).items():
        if "secrets" in job:
            problems.append(f"job {job_name}: passes secrets on (secrets:) to a reusable workflow")
        for i, step in enumerate(job.get("steps") or []):
            where = f"job {job_name}, step {step.get('name') or step.get('id') or i}"
            if "${{" in str(step.get("run", "")):
                problems.append(f"{where}: an expression inside run: (pass the value through env:)")
            for ref in _secret_refs(step):
                if ref["how"] != f".{SECRET}":
                    read = "secrets[...]" if (ref["how"] or "").strip() == "[" else ref[0].strip()
                    problems.append(f"{where}: reads {read} (only secrets.{SECRET}, by name: a "
                                    "secret chosen by an expression lets whoever dispatches load any secret)")
                    continue
                if str(job.get("environment", "")) not in SECRET_ENVIRONMENTS:
                    problems.append(f"{where}: reads secrets.{SECRET} outside the environment "
                                    f"{SECRET_ENVIRONMENTS[0]} (whose reviewers approve the run)")
                if str(step.get("if", "")).strip() != SECRET_STEP_GATE:
                    problems.append(f"{where}: reads secrets.{SECRET} without if: {SECRET_STEP_GATE}")
            uses = str(step.get("uses", ""))
            if uses.startswith("actions/upload-pages-artifact@") and PAGES_STEP_GATE not in str(step.get("if", "")):
                problems.append(f"{where}: uploads for Pages without {PAGES_STEP_GATE}")
            if uses.startswith("actions/deploy-pages@") and PAGES_JOB_GATE not in str(job.get("if", "")):
                problems.append(f"job {job_name}: deploys to Pages without {PAGES_JOB_GATE}")
    if "${{ steps.nightly.outputs.pages }}" not in str((doc["jobs"]["nightly"].get("outputs") or {}).get("pages")):
        problems.append("job nightly does not pass on .ci/nightly's pages decision (outputs.pages)")
    return problems


@pytest.mark.unit
def test_the_nightly_workflow_keeps_secrets_out_of_scripts_and_real_cluster_reports_off_pages():
    assert guest_rule_problems(WORKFLOW.read_text()) == []


@pytest.mark.parametrize("old,new,expected", [
    ('echo "::error::the environment cluster-validation has no secret',
     'echo "::error::the environment ${{ inputs.profile }} has no secret', "an expression inside run:"),
    ("run: .ci/nightly", "run: PUBLISH=${{ secrets.PAGES_TOKEN }} .ci/nightly", "an expression inside run:"),
    ("${{ secrets.CLUSTERPROOF_KUBECONFIG }}", "${{ secrets[inputs.profile] }}", "reads secrets[...]"),
    ("${{ secrets.CLUSTERPROOF_KUBECONFIG }}", "${{ secrets.PAGES_TOKEN }}", "reads secrets.PAGES_TOKEN"),
    ("${{ secrets.CLUSTERPROOF_KUBECONFIG }}", "${{ toJSON(secrets) }}", "reads secrets (only"),
    ("    environment: ${{ inputs.existing_cluster && 'cluster-validation' || '' }}\n", "",
     "outside the environment cluster-validation"),
    ("'cluster-validation' || '' }}", "'cluster-validaton' || '' }}", "outside the environment cluster-validation"),
    ("if: inputs.existing_cluster\n", "if: always()\n", "without if: inputs.existing_cluster"),
    ("      PREVIOUS: out/nightly/previous\n", "      PREVIOUS: out/nightly/previous\n"
     "      KUBECONFIG_CONTENT: ${{ secrets.CLUSTERPROOF_KUBECONFIG }}\n", "a secret is read outside a step"),
    ("if: always() && steps.nightly.outputs.pages == 'true' && hashFiles(", "if: always() && hashFiles(",
     "uploads for Pages without"),
    ("always() && needs.nightly.outputs.pages == 'true' &&", "always() &&", "deploys to Pages without"),
], ids=["input-in-run", "secret-in-run", "secret-chosen-by-input", "other-secret", "every-secret",
        "secret-outside-environment", "secret-in-another-environment", "secret-read-on-every-run",
        "secret-in-the-jobs-env", "real-report-uploaded-for-pages", "real-report-deployed"])
@pytest.mark.unit
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
@pytest.mark.unit
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


@pytest.mark.unit
def test_the_nightly_script_compares_with_the_last_good_night_and_carries_the_history(tmp_path):
    prev = tmp_path / "prev"
    (prev / "history").mkdir(parents=True)
    (prev / "history" / "history-trend.json").write_text("[]")
    (prev / "summary.json").write_text("{}")
    status, calls, repo = _nightly(tmp_path, {}, PREVIOUS=str(prev), KUBECONFIG_FILE="/tmp/kc", PROFILE="smoke")
    assert status == 0
    assert calls[0] == ["run", "--cp-baseline", f"{prev}/summary.json", "--cp-kubeconfig", "/tmp/kc", "PROFILE=smoke",
                        "ARGS="]
    assert calls[1][0] == "report" and len(calls[1]) == 3
    assert (repo / "out" / "history" / "history-trend.json").exists()


@pytest.mark.parametrize("run,report,expected", [
    (1, 0, 1), (4, 0, 4), (6, 0, 6), (7, 0, 7), (8, 0, 8),   # the run's own code, unchanged, report built
    (0, 9, 9),                                               # only the report failed: 9
    (1, 9, 1),                                               # both: the run's code says more
])
@pytest.mark.cluster
def test_the_nightly_script_builds_the_report_and_passes_the_runs_exit_code_through(tmp_path, run, report, expected):
    status, calls, _ = _nightly(tmp_path, {"run": run, "report": report}, PREVIOUS=str(tmp_path / "none"))
    assert status == expected and [c[0] for c in calls] == ["run", "report"]
    assert calls[0] == ["run", "PROFILE=nightly", "ARGS="]


# --- CI on every change (.github/workflows/ci.yml) -----------------------------------------------------------

README = ROOT / "README.md"
UNIT_COMMAND = "./proof test --unit"


def ci_rule_problems(text: str) -> list[str]:
    """What breaks the CI workflow's own rules (its header): every push to main and every pull request, as itself;
    read-only; superseded runs cancelled; no expression in a script, no secret; the unit job the README's command
    with no binary cache; the gate .ci/run after the fast jobs, with the binaries restored by the pinned versions."""
    doc = yaml.safe_load(text)
    on = doc.get(True, doc.get("on")) or {}      # YAML 1.1 reads the key `on` as a boolean
    problems = []
    if set(on) != {"push", "pull_request"}:
        problems.append(f"runs on {sorted(on)}, not on push and pull_request alone (pull_request_target would run "
                        "a pull request's code with the repository's rights)")
    if doc.get("permissions") != {"contents": "read"}:
        problems.append(f"permissions {doc.get('permissions')}: the token needs contents: read and nothing else")
    if (doc.get("concurrency") or {}).get("cancel-in-progress") is not True:
        problems.append("a newer push does not cancel the run it supersedes (concurrency.cancel-in-progress)")
    if "secrets" in text:
        problems.append("reads a secret")
    jobs = doc.get("jobs") or {}
    for name, job in jobs.items():
        if "permissions" in job:
            problems.append(f"job {name}: permissions of its own")
        for step in job.get("steps") or []:
            if "${{" in str(step.get("run", "")):
                problems.append(f"job {name}: an expression inside run: (pass the value through env:)")
    unit = jobs.get("unit") or {}
    if not any(str(s.get("run", "")).strip() == UNIT_COMMAND for s in unit.get("steps") or []):
        problems.append(f"job unit does not run the README's {UNIT_COMMAND}")
    if any(str(s.get("uses", "")).startswith("actions/cache@") for s in unit.get("steps") or []):
        problems.append("job unit restores a cache: the unit tier must pass with nothing but the venv")
    gate = jobs.get("gate") or {}
    if not any(str(s.get("run", "")).strip() == ".ci/run" for s in gate.get("steps") or []):
        problems.append("job gate does not run .ci/run")
    if set(gate.get("needs") or []) != set(jobs) - {"gate"}:
        problems.append("job gate does not wait for every fast job")
    keys = [str((s.get("with") or {}).get("key", "")) for s in gate.get("steps") or []
            if str(s.get("uses", "")).startswith("actions/cache@") and
            "clusterproof/bin" in str((s.get("with") or {}).get("path", ""))]
    if not any("clusterproof/provision/toolchain.py" in k for k in keys):
        problems.append("job gate does not restore the binaries under a key of the pinned versions")
    return problems


@pytest.mark.unit
def test_the_ci_workflow_checks_every_change_read_only_and_runs_the_readmes_commands():
    assert ci_rule_problems(CI.read_text()) == []
    assert UNIT_COMMAND in README.read_text(), f"the README does not give {UNIT_COMMAND}, which the unit job runs"
    assert (ROOT / ".ci" / "run").read_text().rstrip().endswith("exec ./proof test")


@pytest.mark.parametrize("old,new,expected", [
    ("  pull_request:\n", "  pull_request_target:\n", "pull_request_target would run"),
    ("  contents: read                 # to check the repository out; nothing else",
     "  contents: write", "the token needs contents: read"),
    ("cancel-in-progress: true", "cancel-in-progress: false", "does not cancel"),
    ("run: ./proof test --unit", "run: .venv/bin/pytest tests -m unit", "does not run the README's"),
    ("run: .ci/run", "run: ./proof test ${{ github.event.inputs.args }}", "an expression inside run:"),
    ("    needs: [ruff, unit, workflows, wheel]", "    needs: [ruff]", "does not wait for every fast job"),
    ("key: clusterproof-bin-${{ runner.os }}-${{ hashFiles('clusterproof/provision/toolchain.py', ",
     "key: clusterproof-bin-${{ runner.os }}-${{ hashFiles(", "under a key of the pinned versions"),
], ids=["pull-request-target", "write-permission", "no-cancel", "other-unit-command", "expression-in-run",
        "gate-first", "cache-key-without-versions"])
@pytest.mark.unit
def test_a_copy_of_the_ci_workflow_that_breaks_a_rule_is_caught(old, new, expected):
    text = CI.read_text()
    assert old in text, f"the control's anchor {old!r} is gone from the workflow: update the control"
    problems = ci_rule_problems(text.replace(old, new, 1))
    assert any(expected in p for p in problems), problems
