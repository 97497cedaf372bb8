"""Each embedded Go component runs with the Go runtime settings of its profile (component_go_env).

Why a self-test on the real cluster: the settings reach a component only through kwokctl's
componentsPatches (extraEnvs) and its binary runtime's process start; a key that is parsed, written
and recorded but never reaches the process would leave the bring-up figures and the report's
environment saying one thing while the components run another.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from clusterproof.cluster.kwok import describe_go_env

pytestmark = pytest.mark.cluster


def _go_runtime(pid: int) -> dict[str, str]:
    """GOGC and GOMEMLIMIT in a process's environment (those it has)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    env = dict(e.decode(errors="replace").split("=", 1) for e in raw if b"=" in e)
    return {k: v for k, v in env.items() if k in ("GOGC", "GOMEMLIMIT")}


def test_every_component_runs_with_its_profiles_gogc_and_gomemlimit_and_the_report_says_so(cluster, profile):
    pids = cluster.kwok.pids()
    want = {name: dict(env) for name, env in profile.component_go_env.items()}
    assert want, "the profile sets no component's Go runtime: nothing to check (the shipped profiles set five)"
    have = {name: _go_runtime(pids[name]) for name in want if name in pids}
    assert set(have) == set(want), f"components not running: {sorted(set(want) - set(have))} (running: {sorted(pids)})"
    assert have == want, f"the components' environments differ from the profile's component_go_env: {have} != {want}"
    # components the profile leaves alone get Go's defaults, not another's settings
    others = {n: _go_runtime(p) for n, p in pids.items() if n not in want and Path(f"/proc/{p}").exists()}
    assert not any(others.values()), f"components without settings got some: {others}"
    assert cluster.describe().get("go.runtime") == describe_go_env(want)
