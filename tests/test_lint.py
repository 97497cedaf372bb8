"""The tree is clean under the project's ruff configuration (pyproject.toml ``[tool.ruff]``).

One line per finding (file:line:col rule message); the negative control
plants a finding of each kind the configuration selects and sees it reported.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clusterproof import CHECKOUT

pytestmark = pytest.mark.unit

RUFF = Path(sys.executable).parent / "ruff"


def ruff(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    if not RUFF.exists():
        pytest.fail(f"ruff is not installed in {RUFF.parent} (it is pinned in requirements.txt: make setup)",
                    pytrace=False)
    return subprocess.run([str(RUFF), "check", "--output-format", "concise", "--no-cache", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_tree_is_clean_under_ruff():
    r = ruff(".", cwd=CHECKOUT)
    findings = [line for line in r.stdout.splitlines() if line and not line.startswith(("Found ", "[*]", "All "))]
    assert r.returncode == 0 and not findings, "ruff: " + "\n".join(findings or [r.stderr.strip()])


def test_ruff_reports_what_the_configuration_selects(tmp_path):
    """Negative control: an unused import (F), a line past 120 columns (E501), unsorted imports (I) and
    a mutable default (B) are each found, with the project's own configuration."""
    shutil.copy(CHECKOUT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "planted.py").write_text(
        "import sys\nimport os\n\n\n"
        f"X = {'1' * 130}\n\n\n"
        "def f(a=[]):\n    return a\n")
    out = ruff(".", cwd=tmp_path).stdout
    for rule in ("F401", "E501", "I001", "B006"):
        assert rule in out, f"ruff did not report {rule}:\n{out}"
