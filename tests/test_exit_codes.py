"""Self-tests of the exit codes: one table (docs/exit-codes.md), kept in step with the source, and passed through.

The source is scanned (Python by AST, the bash scripts by pattern) for every
code it can end with: ``sys.exit(N)``, ``SystemExit(N)``, ``pytest.exit(...,
returncode=N)``, ``return N`` in a command's ``main`` (and the functions it
returns the result of), ``clusterproof.core.exitcodes`` names wherever they are
used, ``*_EXIT = N`` constants, and ``exit N`` / ``NAME=N`` in ``./proof`` and
``.ci/*``. Every such code is in the table; every code in the table is returned
by pytest or found by the scan; no code of ours is one of pytest's 2, 3 or 5.
The scanner is shown to find a planted code (its negative control).

Then the codes are seen passing through ``./proof`` for real: bad input (4)
before pytest starts, nothing selected (5) and a red check (1) from pytest
itself, a failed set-up (8), an unknown subcommand (4); ``./proof test`` stops
at its first failing step with that step's code (the suites without a latency
SLO beside the self-tests, those with one alone: its list is exactly the suites
that read a latency SLO bound); and ``make run``, calling
``./proof run``, turns them all into 2 -- why ./proof exists. The Makefile's
set-up (``make -s venv``) is replaced by a stub on PATH in these runs: it is
not what is tested, and a real one could reinstall the venv.
"""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from clusterproof.core import exitcodes
from clusterproof.core.waiting import wait_for
from tests.harness import LATENCY_SLOS

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "docs" / "exit-codes.md"
PYTEST_CODES = {int(c) for c in pytest.ExitCode}
SOURCES = [p for d in ("clusterproof", "fixtures", "suites", "load") for p in sorted((ROOT / d).rglob("*.py"))] \
    + [ROOT / "conftest.py"]
SCRIPTS = [ROOT / "proof", *sorted((ROOT / ".ci").iterdir())]
CONSTANTS = {name: v for name, v in vars(exitcodes).items() if name.isupper() and isinstance(v, int)}


def table_codes() -> dict[int, str]:
    """``{code: meaning}`` from the table's rows (``| N | meaning | ...``)."""
    rows = re.findall(r"^\|\s*(\d+)\s*\|\s*([^|]+)\|", TABLE.read_text(), re.M)
    return {int(code): meaning.strip() for code, meaning in rows}


def _int(node: ast.AST, aliases: dict[str, int]) -> int | None:
    """The code an expression names: a literal, ``exitcodes.NAME``, or a module constant that is one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Attribute) and node.attr in CONSTANTS and isinstance(node.value, ast.Name) \
            and node.value.id == "exitcodes":
        return CONSTANTS[node.attr]
    if isinstance(node, ast.Attribute) and node.attr in aliases:   # compare.REGRESSION_EXIT
        return aliases[node.attr]
    if isinstance(node, ast.Name) and node.id in aliases:
        return aliases[node.id]
    return None


def _ints(node: ast.AST, aliases: dict[str, int]) -> set[int]:
    """The codes an expression can be: ``_int``, or either side of ``A if c else B`` / ``A or B``."""
    if isinstance(node, ast.IfExp):
        return _ints(node.body, aliases) | _ints(node.orelse, aliases)
    if isinstance(node, ast.BoolOp):
        return set().union(*(_ints(v, aliases) for v in node.values))
    code = _int(node, aliases)
    return set() if code is None else {code}


def python_codes(source: str, where: str, aliases: dict[str, int]) -> set[tuple[int, str]]:
    """Every (code, where) one module's source can end a process with."""
    tree = ast.parse(source)
    found: set[tuple[int, str]] = set()
    top = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in ("exit", "SystemExit", "Failed") and node.args:
                code = _int(node.args[0], aliases)
                if code is not None:
                    found.add((code, f"{where}:{node.lineno}"))
            for kw in node.keywords:
                if kw.arg == "returncode" and _int(kw.value, aliases) is not None:
                    found.add((_int(kw.value, aliases), f"{where}:{node.lineno}"))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "exitcodes" \
                and node.attr in CONSTANTS:
            found.add((CONSTANTS[node.attr], f"{where}:{node.lineno}"))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "exitstatus"
                                                for t in node.targets):   # session.exitstatus = ...
            found |= {(c, f"{where}:{node.lineno}") for c in _ints(node.value, aliases)}
    # return N in main (and in the top-level functions main returns the result of, and nested bodies)
    todo, seen = ["main"], set()
    while todo:
        fn = top.get(todo.pop())
        if fn is None or fn.name in seen:
            continue
        seen.add(fn.name)
        for node in ast.walk(fn):
            if isinstance(node, ast.Return) and node.value is not None:
                found |= {(c, f"{where}:{node.lineno}") for c in _ints(node.value, aliases)}
                if isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name):
                    todo.append(node.value.func.id)
    return found


def exit_aliases() -> dict[str, int]:
    """Module constants named ``*_EXIT`` (REGRESSION_EXIT, LIVENESS_EXIT) and the codes they hold."""
    aliases: dict[str, int] = {}
    for path in SOURCES:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                    and node.targets[0].id.endswith("_EXIT"):
                code = _int(node.value, {})
                assert code is not None, f"{path}: {node.targets[0].id} is not a code of clusterproof.core.exitcodes"
                aliases[node.targets[0].id] = code
    return aliases


def bash_codes(text: str, where: str) -> set[tuple[int, str]]:
    found = set()
    for i, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0]
        for m in re.finditer(r"\bexit\s+(\d+)\b", code):
            found.add((int(m.group(1)), f"{where}:{i}"))
        m = re.match(r"\s*([A-Z_]+)=(\d+)\s*(#|$)", line)
        if m and f"${m.group(1)}" in text.replace("${", "$").replace("}", "") and m.group(1) != "PROFILE":
            found.add((int(m.group(2)), f"{where}:{i}"))
    return found


def returned_codes() -> set[tuple[int, str]]:
    aliases = exit_aliases()
    found = set()
    for path in SOURCES:
        if path.name == "exitcodes.py":
            continue
        found |= python_codes(path.read_text(), str(path.relative_to(ROOT)), aliases)
    for path in SCRIPTS:
        found |= bash_codes(path.read_text(), str(path.relative_to(ROOT)))
    return found


@pytest.mark.unit
def test_the_scanner_finds_a_planted_code():
    planted = ("import sys\nfrom clusterproof.core import exitcodes\n"
               "def _usage():\n    return 12\n"
               "def main():\n    if x:\n        return _usage()\n    def body():\n        return 13\n"
               "    pytest.exit('x', returncode=14)\n    raise SystemExit(15)\n    return exitcodes.LEASE_LOST\n"
               "    return A_EXIT if y else 0\n"
               "def hook(session):\n    session.exitstatus = 21\n"
               "if __name__ == '__main__':\n    sys.exit(16)\n")
    assert {c for c, _ in python_codes(planted, "planted.py", {"A_EXIT": 20})} == {12, 13, 14, 15, 16, 7, 20, 21, 0}
    assert {c for c, _ in bash_codes('X_FAILED=17   # doc\nexit "$X_FAILED"\nexit 18  # two\n# exit 19\n',
                                     "s")} == {17, 18}


@pytest.mark.control
def test_every_code_the_source_returns_is_in_the_table():
    table = table_codes()
    missing = sorted(f"{where}: exit {code}" for code, where in returned_codes() if code not in table)
    assert not missing, "codes returned but not in docs/exit-codes.md:\n" + "\n".join(missing)


@pytest.mark.control
def test_the_table_lists_no_code_nobody_returns():
    returned = {code for code, _ in returned_codes()} | PYTEST_CODES
    orphans = sorted(set(table_codes()) - returned)
    assert not orphans, f"docs/exit-codes.md lists codes nothing returns: {orphans}"


@pytest.mark.control
def test_no_code_of_ours_gives_pytests_2_3_or_5_another_meaning():
    reused = sorted(f"{where}: exit {code}" for code, where in returned_codes() if code in (2, 3, 5))
    assert not reused, "pytest's 2 (interrupted), 3 (internal error), 5 (nothing collected):\n" + "\n".join(reused)


@pytest.mark.unit
def test_the_table_and_the_code_side_are_one():
    assert set(table_codes()) == set(exitcodes.VERDICTS) == set(CONSTANTS.values())
    assert {int(c): c.name for c in pytest.ExitCode}.keys() <= set(exitcodes.VERDICTS)
    for name, script in (("SETUP_FAILED", "proof"), ("REPORT_FAILED", "proof"), ("REPORT_FAILED", ".ci/nightly"),
                         ("USAGE", "proof")):
        assert f"{name}={CONSTANTS[name]}" in (ROOT / script).read_text(), f"{script}: {name} is not {CONSTANTS[name]}"


# --- ./proof for real --------------------------------------------------------------------------------

CHILD_ENV_DROP = ("PROFILE", "ARGS", "GITHUB_STEP_SUMMARY", "GITHUB_ACTIONS", "CLUSTERPROOF_OUTPUT_DIR")


def _stub_make(tmp_path: Path, status: int = 0) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "make").write_text(f"#!/usr/bin/env bash\necho \"make $*\" >> {tmp_path / 'make.log'}\nexit {status}\n")
    (bin_dir / "make").chmod(0o755)
    return bin_dir


def _proof(tmp_path: Path, *args: str, make_status: int = 0, timeout: float = 600, **env: str):
    bin_dir = _stub_make(tmp_path, make_status)
    child = {k: v for k, v in os.environ.items() if k not in CHILD_ENV_DROP}
    child.update({"PATH": f"{bin_dir}:{os.environ['PATH']}", "PROFILE": "smoke",
                  "CLUSTERPROOF_OUTPUT_DIR": str(tmp_path / "out"), **env})
    return subprocess.run([str(ROOT / "proof"), *args], cwd=tmp_path, env=child, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.unit
def test_proof_run_ends_with_4_on_bad_input_before_pytest_starts(tmp_path):
    run = _proof(tmp_path, "run", "--cp-set", "no_such_key=1")
    assert run.returncode == 4, run.stdout[-2000:] + run.stderr[-2000:]
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "no_such_key" in lines[0] and "Traceback" not in run.stderr, run.stderr
    assert not (tmp_path / "out" / "runs").exists(), "pytest ran"


@pytest.mark.control
def test_proof_run_passes_pytests_own_code_through_nothing_selected_is_5(tmp_path):
    run = _proof(tmp_path, "run", "-q", "-k", "no_check_is_named_like_this_xyz")
    assert run.returncode == 5, run.stdout[-3000:] + run.stderr[-2000:]
    assert "deselected" in run.stdout


@pytest.mark.control
def test_a_red_check_exits_1_through_proof_with_its_junit_xml_in_the_run_directory(tmp_path):
    """No cluster: a check in a file of its own, run by ``./proof run FILE`` (a test path replaces the
    default ``suites``) with this checkout's pytest.ini -- the same pass-through a red suite check takes."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_red.py").write_text("def test_green():\n    pass\n\n"
                                         "def test_red():\n    assert 1 + 1 == 3, 'arithmetic is broken'\n")
    run = _proof(tmp_path, "run", "-q", "-p", "no:randomly", "-c", str(ROOT / "pytest.ini"), f"--rootdir={project}",
                 str(project / "test_red.py"))
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    junit, = (tmp_path / "out" / "runs").glob("*/junit.xml")
    text = junit.read_text()
    assert 'tests="2"' in text and 'failures="1"' in text and "arithmetic is broken" in text, text[:2000]


@pytest.mark.unit
def test_a_failed_set_up_is_8_and_an_unknown_command_4(tmp_path):
    run = _proof(tmp_path, "run", make_status=2)
    assert run.returncode == exitcodes.SETUP_FAILED and "set-up failed" in run.stderr, run.stderr
    assert (tmp_path / "make.log").read_text().split() == ["make", "-s", "venv"]
    bad = _proof(tmp_path, "rnu")
    assert bad.returncode == 4 and "unknown command rnu" in bad.stderr, bad.stderr


def _fake_repo(tmp_path: Path, python_status: dict[str, int]) -> Path:
    """A copy of ./proof whose .venv/bin/python records its arguments and exits as ``python_status`` says
    (by the first argument it matches), and a make stub."""
    repo = tmp_path / "repo"
    (repo / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(ROOT / "proof", repo / "proof")
    cases = "".join(f"  *'{k}'*) exit {v};;\n" for k, v in python_status.items())
    (repo / ".venv" / "bin" / "python").write_text(
        "#!/usr/bin/env bash\n"
        # one write a call: the two steps started together append to one log
        "python3 -c 'import json,sys; sys.stdout.write(json.dumps(sys.argv[1:]) + chr(10))' "
        f"\"$@\" >> {tmp_path / 'python.log'}\n"
        f"case \"$*\" in\n{cases}esac\nexit 0\n")
    (repo / ".venv" / "bin" / "python").chmod(0o755)
    return repo


def _calls(tmp_path: Path) -> list[list[str]]:
    log = tmp_path / "python.log"
    return [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []


SLO_SUITES = ["suites/test_api_overload.py", "suites/test_burst_pod_creation.py", "suites/test_cluster_scale.py"]
# ... and the suite whose bounds are a fraction of a second, alone with them (./proof ALONE_SUITES)
ALONE = [*SLO_SUITES, "suites/test_prometheus_limits.py"]
BESIDE = ["-m", "pytest", "suites", *[f"--ignore={s}" for s in ALONE], "--cp-profile", "smoke"]
HOST_STATE = "tests/test_host_state.py"
GUEST = "tests/test_permissions.py"
SELF = ["-m", "pytest", "tests", f"--ignore={HOST_STATE}", f"--ignore={GUEST}", "--cp-profile", "smoke", "-n", "5",
        "--dist", "loadfile", "--no-loadscope-reorder"]


@pytest.mark.parametrize("failing,code,steps", [
    (None, 0, 7),
    ("clusterproof.prometheus.history", 8, 1),
    ("pytest tests --ignore", 4, 3),
    ("pytest suites --ignore", 1, 3),
    (f"pytest {HOST_STATE}", 1, 5),
    (f"pytest {GUEST}", 1, 5),
    ("pytest suites/test_api_overload.py", 1, 6),
    ("test_cluster_scale.py --cp-profile nightly", 7, 7),
])
@pytest.mark.control
def test_proof_test_runs_its_steps_and_stops_at_the_first_failing_one_with_its_code(tmp_path, failing, code, steps):
    """The history; the suites without a latency SLO beside the self-tests (started together: either may
    log first); the host-state self-test beside the guest runs (it compares the machine's global state, which
    their cluster without a real node leaves alone; the guest runs, run every suite, whose time-bound checks
    would judge the workers' load); the suites with a latency SLO alone on smoke; the 7,500-node bring-up
    check. A pair ends with the first code that is not 0, the foreground's first."""
    repo = _fake_repo(tmp_path, {failing: code} if failing else {})
    bin_dir = _stub_make(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("CLUSTERPROOF_TEST_WORKERS", "CLUSTERPROOF_OUTPUT_DIR")}
    run = subprocess.run([str(repo / "proof"), "test"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={**env, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert run.returncode == code, run.stdout + run.stderr
    assert (tmp_path / "make.log").read_text().split() == ["make", "-s", "setup"]
    calls = _calls(tmp_path)
    for pair in (slice(1, 3), slice(3, 5)):     # the two of a pair start together: either may log first
        calls[pair] = sorted(calls[pair])
    assert calls == [
        ["-m", "clusterproof.prometheus.history", "--cp-profile", "smoke"], *sorted([BESIDE, SELF]),
        *sorted([["-m", "pytest", HOST_STATE, "--cp-profile", "smoke"],
                 ["-m", "pytest", GUEST, "--cp-profile", "smoke"]]),
        ["-m", "pytest", *ALONE, "--cp-profile", "smoke"],
        ["-m", "pytest", "suites/test_cluster_scale.py", "--cp-profile", "nightly"]][:steps]
    if steps > 1:
        assert "proof test: .venv/bin/python -m pytest suites --ignore" in run.stdout, run.stdout
        assert (repo / "out" / "suites-on-smoke.log").exists()
    if steps > 3:
        assert (repo / "out" / "host-state.log").exists()
    if failing:
        assert f"exited {code}" in run.stderr and failing in run.stderr.split("exited")[0], run.stderr


@pytest.mark.control
def test_proof_test_forwards_sigterm_to_the_suites_beside_the_self_tests(tmp_path):
    """The run beside the self-tests starts with SIGINT ignored (a background job of a script): a SIGTERM to
    ./proof reaches it, ./proof waits for it to end (its teardown) and exits with its code (2, interrupted)."""
    repo = _fake_repo(tmp_path, {})
    log = tmp_path / "beside.log"
    python = repo / ".venv" / "bin" / "python"
    python.write_text(python.read_text().replace(
        "case \"$*\" in\n",
        "case \"$*\" in\n"
        f"  *'pytest suites --ignore'*) trap 'echo TERM >> {log}; exit 2' TERM; sleep 30 & wait $!; exit 0;;\n"
        "  *'pytest tests'*) sleep 3;;\n"))
    bin_dir = _stub_make(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("CLUSTERPROOF_TEST_WORKERS", "CLUSTERPROOF_OUTPUT_DIR")}
    proc = subprocess.Popen([str(repo / "proof"), "test"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**env, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    wait_for(lambda: len(_calls(tmp_path)) >= 3, timeout=20, interval=0.1, what="both steps started")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2, out
    assert log.read_text() == "TERM\n", out
    assert "exited 2" in out and "--cp-profile nightly" not in out, out


@pytest.mark.unit
def test_proof_tests_alone_step_holds_every_suite_that_judges_a_latency_slo():
    """A suite that reads a latency SLO bound (tests/harness.py LATENCY_SLOS) must run alone, never beside
    the self-tests' load: ./proof's SLO_SUITES is exactly those suites."""
    listed = re.search(r"^SLO_SUITES=\(([^)]*)\)", (ROOT / "proof").read_text(), re.M)
    assert listed, "./proof has no SLO_SUITES=(...) line"
    judging = sorted(f"suites/{p.name}" for p in (ROOT / "suites").glob("test_*.py")
                     if any(key in p.read_text() for key in LATENCY_SLOS))
    assert sorted(listed.group(1).split()) == judging == SLO_SUITES, (
        f"./proof SLO_SUITES {listed.group(1).split()} against the suites that judge a latency SLO {judging}")


@pytest.mark.control
def test_proof_run_mirrors_make_runs_steps_with_profile_args_and_its_own_arguments(tmp_path):
    repo = _fake_repo(tmp_path, {"pytest": 6})
    bin_dir = _stub_make(tmp_path)
    run = subprocess.run([str(repo / "proof"), "run", "-k", "gang"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                                          "PROFILE": "smoke", "ARGS": "--cp-set nodes=500"})
    assert run.returncode == 6, run.stdout + run.stderr
    assert _calls(tmp_path) == [
        ["-m", "clusterproof.prepare", "--cp-profile", "smoke", "suites", "--cp-set", "nodes=500", "-k", "gang"],
        ["-m", "pytest", "--cp-profile", "smoke", "suites", "--cp-set", "nodes=500", "-k", "gang"]]


@pytest.mark.unit
def test_make_run_turns_every_code_into_2_which_is_why_proof_exists(tmp_path):
    """The Makefile's run target is an alias of ./proof run; GNU make itself ends with 2 on a failed recipe."""
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(ROOT / "Makefile", repo / "Makefile")
    (repo / "proof").write_text("#!/usr/bin/env bash\nexit 6\n")
    (repo / "proof").chmod(0o755)
    run = subprocess.run(["make", "-s", "run"], cwd=repo, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "make exits 2 for ANY failure" in (ROOT / "Makefile").read_text()
