"""The plugin's options: prefixed ``--cp-``, the old names kept as aliases, and no collision with another plugin.

pytest-profiling owns ``--profile``: with such a plugin loaded, clusterproof
registers only ``--cp-profile`` (and keeps its value apart: every dest is
``cp_*``), instead of the whole command line failing on a conflict.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.selftest

FAKE_PROFILING = '''
def pytest_addoption(parser):
    parser.getgroup("profiling").addoption("--profile", action="store_true", help="FAKE-PROFILING")
'''


def _pytest(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(tmp_path),
                                                                            "PATH": "/usr/bin:/bin"})


def test_the_old_names_are_aliases_of_the_prefixed_ones(tmp_path):
    out = _pytest(tmp_path, "--help").stdout
    for name in ("profile", "set", "kubeconfig", "allow-destructive", "prometheus-url", "baseline", "output-dir"):
        assert f"--cp-{name}" in out and f"--{name}" in out, f"--cp-{name} / --{name} missing from --help"


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
