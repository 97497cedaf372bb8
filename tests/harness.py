"""Run a suite as a separate pytest process, as a user would, and read its verdicts.

Why a subprocess: a negative control must show what an SRE would see -- the
exit code, the one-line errors and each test's failure message -- from the
same command line a user types, against a real (deliberately broken) cluster.
"""
from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class SuiteRun:
    returncode: int
    output: str
    failures: dict[str, str]   # test id -> failure message
    passed: list[str]

    def failed(self, test_prefix: str) -> dict[str, str]:
        return {k: v for k, v in self.failures.items() if k.startswith(test_prefix)}


def run_pytest(args: list[str], tmp_path: Path, timeout: float = 900) -> SuiteRun:
    junit = tmp_path / "junit.xml"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:randomly", f"--junitxml={junit}",
           f"--alluredir={tmp_path / 'allure'}", "-q", *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    failures, passed = {}, []
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            name = case.get("name")
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            if bad is not None:
                failures[name] = bad.get("message", "") + "\n" + (bad.text or "")
            elif case.find("skipped") is None:
                passed.append(name)
    return SuiteRun(proc.returncode, proc.stdout + proc.stderr, failures, passed)


def allure_results(tmp_path: Path) -> dict[str, dict]:
    """Allure result files of a run_pytest() call, by test name (with parameters)."""
    import json
    out = {}
    for f in (tmp_path / "allure").glob("*-result.json"):
        r = json.loads(f.read_text())
        out[r["name"]] = r
    return out
