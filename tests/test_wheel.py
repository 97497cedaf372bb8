"""The distribution as a team gets it: a wheel, installed into a fresh venv outside this repository,
running the example team suite (docs/examples/team-suite) with plain ``pytest`` and no conftest of
ours, and one shipped check from the installed package.

Why: everything else here runs from the checkout, where the editable install maps ``suites/``,
``fixtures/`` and ``load/`` into the package and every data file is at hand. Only
an installed wheel shows that the package data is in it (profiles, RBAC manifests, pause.c, the
checker and mocknvml sources), that nothing generic lands in site-packages, and that the pytest11
entry point alone brings the fixtures and options.

An installed run is as safe as a checkout run: the plugin itself sets the bound on every check
(pytest-timeout, 3600 s unless the user says otherwise), keeps locust's pytest plugin out and makes
markers strict -- none of it from a pytest.ini, which an installed run does not have. A team check that
sleeps forever is cut at a short ``--timeout``; the default is read from the run's own header.

Cost: one wheel and one venv for the module (the pip cache makes the install a few seconds when
the lock's wheels are cached; the build downloads setuptools for its isolated build env), then one
embedded cluster of the team's profile (real_nodes: 0) and three runs against the session cluster.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tests.harness import ROOT

pytestmark = pytest.mark.cluster

EXAMPLE = ROOT / "docs" / "examples" / "team-suite"
GENERIC = {"fixtures", "reports", "load", "tests", "bench", "suites", "conftest.py"}


def _env() -> dict[str, str]:
    """The child's environment: nothing that points at this checkout or this venv. Byte code is written
    (into the temporary venv): the install skips compiling every module (half its time), and the runs
    compile only what they import, once."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTHONHOME",
                         "PYTHONDONTWRITEBYTECODE")}


def _run(cmd: list, cwd: Path, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env={**_env(), **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)


def _source_copy(dest: Path) -> Path:
    """The checkout's files as git sees them (tracked and untracked-not-ignored, as in the working tree):
    setuptools builds in the source directory (build/, *.egg-info), and a stale build/lib there would
    put a deleted module into the wheel."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file() and not src.is_symlink():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(wheel, venv): the checkout's wheel, installed with the lock as constraints into a fresh venv."""
    work = tmp_path_factory.mktemp("wheel")
    timings = {}
    t0 = time.monotonic()
    src = _source_copy(work / "src")
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", work / "dist", src], work)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    wheel = next((work / "dist").glob("clusterproof-*.whl"))
    timings["build"] = time.monotonic() - t0
    t0 = time.monotonic()
    venv = work / "venv"
    made = _run([sys.executable, "-m", "venv", venv], work)
    assert made.returncode == 0, made.stderr
    inst = _run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
                 "--no-compile", wheel, "-c", ROOT / "requirements.txt"], work, timeout=900)
    assert inst.returncode == 0, inst.stdout[-3000:] + inst.stderr[-3000:]
    timings["venv + install"] = time.monotonic() - t0
    print(f"\nwheel: {', '.join(f'{k} {v:.1f} s' for k, v in timings.items())}", file=sys.stderr)
    return wheel, venv


@pytest.fixture(scope="module")
def team_dir(tmp_path_factory):
    """The example team suite, as a team has it: a directory of its own, outside this repository."""
    d = tmp_path_factory.mktemp("team") / "team-suite"
    shutil.copytree(EXAMPLE, d, ignore=shutil.ignore_patterns("__pycache__", "README.md"))
    assert not any(p.name in ("pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml")
                   for parent in d.parents for p in parent.glob("*") if p.is_file()), \
        "a pytest config above the team's directory would change its run"
    return d


def test_the_wheel_holds_the_package_and_its_data_and_nothing_generic(installed):
    wheel, venv = installed
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert len(top) == 2 and "clusterproof" in top and (top - {"clusterproof"}).pop().endswith(".dist-info"), top
    for data in ("clusterproof/config/profiles/base.yaml", "clusterproof/config/profiles/smoke.yaml",
                 "clusterproof/kube/rbac.yaml", "clusterproof/kube/rbac-destructive.yaml",
                 "clusterproof/provision/pause.c", "clusterproof/preflight/checker/Dockerfile",
                 "clusterproof/preflight/checker/checker.py", "clusterproof/preflight/checker/mocknvml/go.mod",
                 "clusterproof/suites/test_cluster_scale.py", "clusterproof/fixtures/__init__.py",
                 "clusterproof/load/burst.py"):
        assert data in names, f"{data} is not in the wheel"
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert not {p.name for p in site.iterdir()} & GENERIC, sorted(p.name for p in site.iterdir())
    # Paths resolved through __file__ point into site-packages and exist there.
    probe = _run([venv / "bin" / "python", "-c",
                  "import clusterproof, clusterproof.config.profile as p, clusterproof.provision.images as i,"
                  "clusterproof.provision.toolchain as t, clusterproof.core.locust as l;"
                  "print(clusterproof.CHECKOUT);"
                  "[print(x, x.exists()) for x in "
                  "(p.BASE, i.PAUSE_SOURCE, i.PREFLIGHT_DIR, t.MOCKNVML_DIR, l.LOAD_DIR)];"
                  "print(sorted(g.__name__ for g in p.profile_model().__key_groups__))"], site.parent)
    assert probe.returncode == 0, probe.stderr
    lines = probe.stdout.splitlines()
    assert lines[0] == "None", f"the installed package thinks it is a checkout: {lines[0]}"
    for line in lines[1:-1]:
        path, exists = line.rsplit(" ", 1)
        assert path.startswith(str(site)) and exists == "True", line
    assert "TaintKeys" in lines[-1] and "ClusterKeys" in lines[-1], lines[-1]


def test_the_wheel_carries_its_licence(installed):
    """Apache-2.0, as the Kubernetes ecosystem uses: the licence expression in the metadata and the text in the
    wheel, so a team may adopt it."""
    wheel, _ = installed
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
        licences = [n for n in z.namelist() if n.endswith("/LICENSE") and ".dist-info/" in n]
        assert licences and "Apache License" in z.read(licences[0]).decode()[:200], z.namelist()[-10:]
    assert "License-Expression: Apache-2.0" in text, text[:800]


def test_the_console_command_helps_and_refuses_an_unknown_job_in_one_line(installed, tmp_path):
    _, venv = installed
    helped = _run([venv / "bin" / "clusterproof", "--help"], tmp_path)
    assert helped.returncode == 0 and "clusterproof run" in helped.stdout and "bench" in helped.stdout, helped
    bad = _run([venv / "bin" / "clusterproof", "no-such-job"], tmp_path)
    assert bad.returncode != 0 and bad.stdout == "", bad
    assert bad.stderr.strip().count("\n") == 0 and "unknown job 'no-such-job'" in bad.stderr, bad.stderr


def _team_copy(tmp_path: Path, **files: str) -> Path:
    """The example team suite in a directory of its own, with ``files`` (name: text) added."""
    d = tmp_path / "team-suite"
    shutil.copytree(EXAMPLE, d, ignore=shutil.ignore_patterns("__pycache__", "README.md"))
    for name, text in files.items():
        (d / name).write_text(text)
    return d


def _bound(out: str) -> tuple[str, str]:
    """(timeout, method) from pytest-timeout's lines in a run's header."""
    timeout = re.search(r"^timeout: (\S+)s$", out, re.M)
    method = re.search(r"^timeout method: (\S+)$", out, re.M)
    return (timeout[1] if timeout else "none", method[1] if method else "none")


def test_an_installed_run_is_bounded_by_the_plugin_unless_the_user_says_otherwise(installed, team_dir, tmp_path):
    """No pytest.ini anywhere: the plugin's 3600 s (signal method, so fixtures still tear down), for a team's
    plain pytest and for clusterproof run; the user's --timeout, PYTEST_TIMEOUT and ini ``timeout`` win."""
    _, venv = installed
    for cmd, cwd in (([venv / "bin" / "pytest", "--co"], team_dir),
                     ([venv / "bin" / "clusterproof", "run", "--co", "-k", "every_node_is_ready"], tmp_path)):
        run = _run(cmd, cwd)
        assert run.returncode == 0 and _bound(run.stdout) == ("3600.0", "signal"), run.stdout[-3000:] + run.stderr
    given = _run([venv / "bin" / "pytest", "--co", "--timeout", "7"], team_dir)
    assert _bound(given.stdout) == ("7.0", "signal"), given.stdout[-2000:]
    env = _run([venv / "bin" / "pytest", "--co"], team_dir, env={"PYTEST_TIMEOUT": "11"})
    assert _bound(env.stdout) == ("11.0", "signal"), env.stdout[-2000:]
    own = _team_copy(tmp_path, **{"pytest.ini": "[pytest]\ntimeout = 13\ntimeout_method = thread\n"})
    ini = _run([venv / "bin" / "pytest", "--co"], own)
    assert _bound(ini.stdout) == ("13.0", "thread"), ini.stdout[-2000:]


HANGS = """import time


def test_the_team_check_hangs(profile):
    time.sleep(3600)
"""


def test_a_hung_team_check_is_cut_at_the_bound(installed, tmp_path):
    """A check that would sleep an hour fails at the bound with pytest-timeout's message, and the run goes on
    to its end (its summary line): the bound is the run's own, not a killed process."""
    _, venv = installed
    team = _team_copy(tmp_path, **{"test_hangs.py": HANGS})
    t0 = time.monotonic()
    run = _run([venv / "bin" / "pytest", "-q", "-p", "no:randomly", "--timeout", "5", "test_hangs.py"], team,
               timeout=300)
    took = time.monotonic() - t0
    out = run.stdout + run.stderr
    assert run.returncode == 1 and "Failed: Timeout (>5.0s) from pytest-timeout" in out, out[-3000:]
    assert "1 failed" in run.stdout and took < 120, f"{took:.0f} s\n{out[-2000:]}"


def test_locusts_pytest_plugin_is_kept_out_of_an_installed_run(installed, team_dir, tmp_path):
    """locust's plugin (fixtures "session" and "fastsession"; locust's import monkey-patches the process with
    gevent) is blocked by the plugin whichever of the two entry points loads first: this venv's own order,
    then locust's forced first (autoload off, ``-p locust`` before the plugin). The control: without
    clusterproof's plugin (and the team's conftest, which needs it) the fixture is there."""
    _, venv = installed
    team = _team_copy(tmp_path, **{"test_wants_locust.py": "def test_wants_locusts_session(session):\n    pass\n"})
    fixtures = _run([venv / "bin" / "pytest", "--fixtures"], team_dir)
    assert fixtures.returncode == 0 and "pytest_locust" not in fixtures.stdout, fixtures.stdout[-3000:]
    assert "namespace" in fixtures.stdout and "figures" in fixtures.stdout, fixtures.stdout[-3000:]
    no_autoload = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    for args, env in ((["-p", "no:randomly"], {}),
                      (["-p", "locust", "-p", "clusterproof.fixtures", "-p", "timeout"], no_autoload)):
        run = _run([venv / "bin" / "pytest", "-q", *args, "test_wants_locust.py"], team, env=env)
        assert run.returncode == 1 and "fixture 'session' not found" in run.stdout, run.stdout[-3000:]
    bare = tmp_path / "bare"         # no team conftest: it uses clusterproof's hooks, absent in the control
    bare.mkdir()
    (bare / "test_wants_locust.py").write_text((team / "test_wants_locust.py").read_text())
    control = _run([venv / "bin" / "pytest", "-q", "-p", "locust", "--fixtures", "test_wants_locust.py"], bare,
                   env=no_autoload)
    assert "pytest_locust" in control.stdout, control.stdout[-3000:]


def test_markers_are_strict_in_an_installed_run(installed, tmp_path):
    """A misspelt marker is a collection error, and a -m expression naming no marker is bad input (4)."""
    _, venv = installed
    team = _team_copy(tmp_path, **{"test_typo.py": "import pytest\n\n\n@pytest.mark.smokee\ndef test_x():\n"
                                                  "    pass\n"})
    typo = _run([venv / "bin" / "pytest", "-q", "--co", "test_typo.py"], team)
    assert typo.returncode == 2 and "'smokee' not found in `markers` configuration option" in typo.stdout, typo
    expr = _run([venv / "bin" / "pytest", "-q", "--co", "-m", "smokee", "test_team_pods.py"], team)
    assert expr.returncode == 4 and "Unknown marker(s) in '-m' expression: smokee" in expr.stderr, expr


def test_the_team_suite_runs_against_an_embedded_cluster_with_its_own_key(installed, team_dir):
    _, venv = installed
    run = _run([venv / "bin" / "pytest", "-q", "-p", "no:randomly", "--cp-profile", "team.yaml"], team_dir,
               timeout=900)
    assert run.returncode == 0 and "2 passed" in run.stdout, run.stdout[-4000:] + run.stderr[-2000:]
    assert "starting embedded cluster" in run.stdout + run.stderr


def test_the_team_key_is_accepted_and_a_typo_refused_in_one_line(installed, team_dir):
    _, venv = installed
    ok = _run([venv / "bin" / "pytest", "--collect-only", "-q", "--cp-set", "team_pods=9"], team_dir)
    assert ok.returncode == 0 and "2 tests collected" in ok.stdout, ok.stdout + ok.stderr
    typo = _run([venv / "bin" / "pytest", "--collect-only", "-q", "--cp-set", "team_pod=9"], team_dir)
    assert typo.returncode == 4 and "Traceback" not in typo.stdout + typo.stderr, typo
    assert typo.stderr.strip().splitlines() == [
        f"ERROR: clusterproof: --cp-set team_pod=9: unknown key 'team_pod'; the keys are listed in "
        f"{next((venv / 'lib').glob('python3*/site-packages'))}/clusterproof/config/profiles/base.yaml"], typo.stderr
    bad = _run([venv / "bin" / "pytest", "--collect-only", "-q", "--cp-set", "team_pods=0"], team_dir)
    assert bad.returncode == 4 and "team_pods must be >= 1, got 0" in bad.stderr, bad


def test_the_team_suite_runs_against_a_kubeconfig(installed, team_dir, cluster, profile):
    _, venv = installed
    run = _run([venv / "bin" / "pytest", "-q", "-p", "no:randomly", "--cp-kubeconfig", cluster.kubeconfig,
                "--cp-profile", profile.name, "--cp-set", "real_nodes=0", "--cp-set", "team_pods=5"], team_dir)
    assert run.returncode == 0 and "2 passed" in run.stdout, run.stdout[-4000:] + run.stderr[-2000:]
    assert "starting embedded cluster" not in run.stdout + run.stderr


def test_a_shipped_check_runs_from_the_installed_package(installed, cluster, profile, tmp_path):
    """...and its figures carry the keys a checkout run gives them (tests/test_imports.py), so a baseline from
    one compares with the other."""
    _, venv = installed
    run = _run([venv / "bin" / "clusterproof", "run", "-q", "-p", "no:randomly", "-k", "test_every_node_is_ready",
                "--cp-kubeconfig", cluster.kubeconfig, "--cp-profile", profile.name, "--cp-set", "real_nodes=0",
                "--cp-summary", tmp_path / "summary.json"], tmp_path)
    out, final = run.stdout + run.stderr, (run.stdout.strip().splitlines() or [""])[-1]
    assert run.returncode == 0 and " passed" in final and "failed" not in final, out[-4000:]
    keys = set(json.loads((tmp_path / "summary.json").read_text())["figures"])
    assert "suites/test_cluster_scale.py::test_every_node_is_ready[shared] :: nodes not Ready or still tainted" \
        in keys, sorted(keys)


def test_the_docs_section_is_the_example():
    """docs/extending.md "Write your own check" shows the example's files as they are (cannot drift)."""
    page = (ROOT / "docs" / "extending.md").read_text()
    section = page[page.index("## Write your own check"):page.index("## Why this layout")]
    for name in ("conftest.py", "test_team_pods.py", "team.yaml"):
        assert (EXAMPLE / name).read_text().rstrip() in section, \
            f"docs/extending.md shows another {name} than {EXAMPLE}"
