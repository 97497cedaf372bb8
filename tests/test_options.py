"""The plugin's options: prefixed ``--cp-``, the old names kept as aliases, and no collision with another plugin.

pytest-profiling owns ``--profile``: with such a plugin loaded, clusterproof
registers only ``--cp-profile`` (and keeps its value apart: every dest is
``cp_*``), instead of the whole command line failing on a conflict.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

FAKE_PROFILING = '''
def pytest_addoption(parser):
    parser.getgroup("profiling").addoption("--profile", action="store_true", help="FAKE-PROFILING")
'''


def _pytest(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(tmp_path),
                                                                            "PATH": "/usr/bin:/bin"})


@pytest.mark.control
def test_the_old_names_are_aliases_of_the_prefixed_ones(tmp_path):
    out = _pytest(tmp_path, "--help").stdout
    for name in ("profile", "set", "kubeconfig", "allow-destructive", "prometheus-url", "baseline", "output-dir"):
        assert f"--cp-{name}" in out and f"--{name}" in out, f"--cp-{name} / --{name} missing from --help"


@pytest.mark.control
def test_a_plugin_that_owns_profile_leaves_clusterproof_the_prefixed_name(tmp_path):
    (tmp_path / "fakeprofiling.py").write_text(FAKE_PROFILING)
    (tmp_path / "test_x.py").write_text(
        "def test_x(pytestconfig):\n"
        "    assert pytestconfig.option.profile is True\n"
        "    assert pytestconfig.option.cp_profile == 'smoke'\n")
    r = _pytest(tmp_path, "-p", "fakeprofiling", "--help")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "--cp-profile=" in r.stdout and "FAKE-PROFILING" in r.stdout
    assert "--cp-profile=PROFILE, --profile" not in r.stdout
    r = _pytest(tmp_path, "-p", "fakeprofiling", "--profile", "--cp-profile", "smoke", "-q", "test_x.py")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


OPTIONS_SEEN = '''
def test_the_options(pytestconfig):
    assert pytestconfig.option.cp_set == ["nodes=200", "teams=a"]
    assert pytestconfig.option.cp_profile == "smoke"
'''


@pytest.mark.control
def test_an_old_name_still_works_and_warns_once_naming_the_new_one(tmp_path):
    """``--set`` twice (and ``--profile`` once): the run is the same as with the --cp- names, and each old name
    gives one DeprecationWarning that names its replacement."""
    (tmp_path / "test_x.py").write_text(OPTIONS_SEEN)
    r = _pytest(tmp_path, "-q", "-p", "no:randomly", "--set", "nodes=200", "--set=teams=a", "--profile", "smoke",
                "--cp-output-dir", str(tmp_path / "out"), "test_x.py")
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
    for old in ("set", "profile"):
        said = f"DeprecationWarning: clusterproof: --{old} is deprecated, use --cp-{old} (--{old} is removed in 0.23)"
        assert r.stdout.count(said) == 1, r.stdout[-3000:]


@pytest.mark.control
def test_the_new_names_warn_nothing_even_where_warnings_are_errors(tmp_path):
    (tmp_path / "test_x.py").write_text(OPTIONS_SEEN)
    r = _pytest(tmp_path, "-q", "-p", "no:randomly", "-W", "error::DeprecationWarning", "--cp-set", "nodes=200",
                "--cp-set=teams=a", "--cp-profile", "smoke", "--cp-output-dir", str(tmp_path / "out"), "test_x.py")
    assert r.returncode == 0 and "1 passed" in r.stdout and "deprecated" not in r.stdout, r.stdout[-3000:]


@pytest.mark.control
def test_an_option_added_since_has_no_unprefixed_name(tmp_path):
    """Only the names that had one keep an alias (clusterproof.fixtures.ALIASED): --cp-doctor has none."""
    out = _pytest(tmp_path, "--help").stdout
    assert "--cp-doctor" in out and " --doctor" not in out, out


# A harness option written without its prefix: ``--set x``, ``--profile=y``, not ``--cp-set`` nor ``kubectl --context``.
_OLD_SPELLING = r"(?<![\w-])--({})(?=[ =`]|$)"   # as written in prose and command lines (argv lists name aliases)
# Lines that name another program's own flag of the same name (kubectl, kubelet, the preflight agent's CLI, the
# Coscheduling controller's argv, Kueue's and JobSet's argv, kwokctl) or the aliases themselves
# (fixtures/__init__.py, this module).
_OTHER_PROGRAMS = ("kubectl", "kubelet", "preflight.agent", "componentsPatches", "--metricsAddr", "--zap-log-level",
                   "kwokctl merges")
_ALIAS_FILES = ("fixtures/__init__.py", "tests/test_options.py")


@pytest.mark.unit
def test_the_project_writes_only_the_prefixed_names():
    """Docs, CI, suites and self-tests show today's names (a user copies them): an old spelling there is a
    defect of the file, named with its line. The aliases' own module and checks, and the pre-issue-35 RBAC
    copies (tests/data), are the exceptions."""
    import re
    from pathlib import Path

    from clusterproof.fixtures import ALIASED
    root = Path(__file__).resolve().parents[1]
    pattern = re.compile(_OLD_SPELLING.format("|".join(re.escape(n) for n in ALIASED)))
    files = [root / "README.md", *(root / ".ci").rglob("*"), *(root / "docs").rglob("*.md"),
             *(root / "suites").rglob("*.py"), *(root / "tests").glob("*.py"), *(root / "fixtures").rglob("*.py"),
             *(root / "clusterproof").rglob("*.py")]
    found = [f"{f.relative_to(root)}:{i}: {line.strip()[:120]}"
             for f in files if f.is_file() and str(f.relative_to(root)) not in _ALIAS_FILES
             for i, line in enumerate(f.read_text(errors="replace").splitlines(), 1)
             if pattern.search(line) and not any(p in line for p in _OTHER_PROGRAMS)]
    assert not found, "old option spellings (write --cp-<name>):\n" + "\n".join(found)
