"""Every self-test says what it needs, as one tier marker, and the unit tier needs nothing but the venv.

- A test without a tier, with two, or of the unit tier asking for a cluster fails the collection in one line
  (tests/conftest.py ``tier_problems``); the negative control collects tests/poison/untiered.py, whose one test
  has no tier, and must see the run end in one line naming it.
- The unit tier runs from a home with no cache (no binary built from a Go module, no Go module downloaded, the
  module proxy off): it passes and builds nothing. How long it takes is measured, not asserted here (a time bound
  on a machine the other self-tests load would judge the load): docs/benchmarks.md.
"""
from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.conftest import CLUSTER_FIXTURES, TIERS, tier_problems
from tests.harness import ROOT, assert_one_line, run_pytest


def _item(nodeid: str, markers: list[str], fixtures: tuple[str, ...] = ()) -> SimpleNamespace:
    marks = [SimpleNamespace(name=m) for m in markers]
    return SimpleNamespace(nodeid=nodeid, iter_markers=lambda: iter(marks), fixturenames=list(fixtures))


@pytest.mark.unit
def test_each_self_test_needs_exactly_one_tier_and_a_unit_one_no_cluster():
    items = [_item("t.py::ok", ["unit", "parametrize"]), _item("t.py::none", ["smoke"]),
             _item("t.py::two", ["unit", "cluster"]),
             _item("t.py::unit_with_cluster", ["unit"], ("tmp_path", "cluster")),
             _item("t.py::cluster_with_cluster", ["cluster"], ("cluster",))]
    assert tier_problems(items) == [
        f"t.py::none: no tier marker (one of {', '.join(TIERS)}: tests/conftest.py TIERS)",
        "t.py::two: tiers cluster and unit at once",
        "t.py::unit_with_cluster: marked unit but asks for cluster (mark it cluster)"]
    assert "cluster" in CLUSTER_FIXTURES


@pytest.mark.control
def test_a_self_test_without_a_tier_fails_the_collection_in_one_line(tmp_path):
    run = run_pytest(["--collect-only", "tests/poison/untiered.py"], tmp_path, timeout=120)
    assert run.returncode == 4, run.output[-2000:]
    assert_one_line(run, "1 self-test(s) without a proper tier: tests/poison/untiered.py::test_without_a_tier: no tier "
                         "marker (one of unit, cluster, control, host")


@pytest.mark.control
def test_the_unit_tier_needs_nothing_but_the_venv(tmp_path):
    """From an empty home (no ~/.cache/clusterproof, no Go module or build cache) with the module proxy off: every
    unit test passes, and nothing was built or downloaded."""
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "GOPROXY": "off", "GOFLAGS": "-mod=mod",
           "CLUSTERPROOF_OUTPUT_DIR": str(tmp_path / "out")}
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests", "-m", "unit", "-q", "-p", "no:randomly",
                           "-p", "no:cacheprovider", "--timeout", "120"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert " passed" in proc.stdout and "deselected" in proc.stdout, proc.stdout[-1000:]
    built = [p.relative_to(home) for p in home.rglob("*") if p.is_file() and "clusterproof/bin" in str(p)]
    assert not built, f"the unit tier built {built[:5]}"
    assert not (home / "go" / "pkg" / "mod").exists(), "the unit tier downloaded Go modules"


@pytest.mark.unit
def test_every_self_test_module_has_its_seconds_in_durations_json():
    """The workers' order (tests/conftest.py) reads each module's seconds: a module missing counts as 300 s, so the
    file is regenerated from a gate's junit files (tests/durations.py) whenever a module is added."""
    from tests.conftest import module_seconds
    missing = sorted({p.name for p in (ROOT / "tests").glob("test_*.py")} - set(module_seconds()))
    assert not missing, f"tests/durations.json lacks {missing}: python tests/durations.py out/runs/*/junit.xml " \
                        "after a ./proof test"


def _child_modules() -> list[str]:
    """The modules under tests/ that a self-test runs in a child pytest (not collected by ``pytest tests``, whose
    files are test_*.py): each defines checks, so each carries tiers too. The control's untiered module aside."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py")
                  if not p.name.startswith("test_") and p.name != "untiered.py"
                  and any(line.startswith(("def test_", "async def test_")) for line in p.read_text().splitlines()))


@pytest.mark.control
def test_every_module_a_self_test_runs_as_a_child_has_its_tiers(tmp_path):
    """The fresh-clone gate of 55a0463 went red on five of them (tests/poison/, tests/data/, tests/liveness_run.py):
    a child run collects them, and the tier check refused them. Collected here all at once."""
    modules = _child_modules()
    assert len(modules) >= 8, modules
    run = run_pytest(["--collect-only", *modules], tmp_path, timeout=120)
    assert run.returncode == 0, run.output[-2000:]
