"""Unit tests of pure helpers (no cluster): profiles, quantiles, sweeping, waiting."""
from __future__ import annotations

import datetime as dt
import math
import socket

import pytest

from fixtures import apimetrics
from fixtures.errors import HarnessError
from fixtures.profile import load_profile, node_plan
from fixtures.run import CREATED, OWNER_HOST, OWNER_PID, is_abandoned
from fixtures.waiting import WaitTimeout, wait_for

pytestmark = pytest.mark.selftest


@pytest.mark.parametrize("name,nodes", [pytest.param("smoke", 100, id="smoke"),
                                         pytest.param("nightly", 7500, id="nightly")])
def test_node_plan_adds_up_to_the_profile_node_count(name, nodes):
    p = load_profile(name)
    plan = node_plan(p)
    assert sum(pool.count for pool in plan) == nodes
    teams = [pool for pool in plan if pool.name.startswith("team-")]
    assert [pool.name for pool in teams] == [f"team-{t}" for t in p.teams]
    assert all(pool.taints[0].key == p.team_taint_key for pool in teams)
    assert not next(pool for pool in plan if pool.name == "shared").taints


def test_overrides_are_typed_and_unknown_keys_rejected():
    small = ["nodes=7", "teams=a", "burst_jobs=1", "burst_job_size=1", "burst_users=1",
             "burst_locust_processes=1"]
    assert load_profile("smoke", small).nodes == 7
    with pytest.raises(HarnessError, match="unknown key 'node'"):
        load_profile("smoke", ["node=7"])
    with pytest.raises(HarnessError, match="team_fraction must be between 0 and 1"):
        load_profile("smoke", ["team_fraction=2"])
    with pytest.raises(HarnessError, match="not a valid label/taint key"):
        load_profile("smoke", ["team_taint_key=Not A Key"])


def test_quantile_interpolates_like_prometheus():
    # 100 calls: 50 under 0.1 s, 49 more under 0.5 s, 1 under 1 s.
    b = {0.1: 50, 0.5: 99, 1.0: 100, math.inf: 100}
    assert apimetrics.quantile(0.5, b) == pytest.approx(0.1)
    assert apimetrics.quantile(0.99, b) == pytest.approx(0.5)
    assert apimetrics.quantile(0.995, b) == pytest.approx(0.75)
    # Beyond the last finite bucket the last bound is all we know.
    assert apimetrics.quantile(0.99, {1.0: 0, 60.0: 0, math.inf: 10}) == 60.0


def test_histogram_delta_keeps_only_series_with_new_calls():
    text = ('# TYPE apiserver_request_duration_seconds histogram\n'
            'apiserver_request_duration_seconds_bucket{verb="POST",group="",resource="nodes",'
            'subresource="",scope="cluster",component="apiserver",dry_run="",version="v1",le="1"} {a}\n'
            'apiserver_request_duration_seconds_bucket{verb="POST",group="",resource="nodes",'
            'subresource="",scope="cluster",component="apiserver",dry_run="",version="v1",le="+Inf"} {a}\n'
            'apiserver_request_duration_seconds_count{verb="POST",group="",resource="nodes",'
            'subresource="",scope="cluster",component="apiserver",dry_run="",version="v1"} {a}\n'
            'apiserver_request_duration_seconds_sum{verb="POST",group="",resource="nodes",'
            'subresource="",scope="cluster",component="apiserver",dry_run="",version="v1"} 1\n')
    before = apimetrics.histograms(text.replace("{a}", "3"))
    after = apimetrics.histograms(text.replace("{a}", "10"))
    d = apimetrics.delta(after, before)
    [lat] = apimetrics.latencies(d, ("POST",))
    assert (lat.verb, lat.resource, lat.count) == ("POST", "nodes", 7)
    assert apimetrics.delta(before, before) == {}


def test_sweeper_only_takes_dead_or_expired_owners():
    now = dt.datetime(2026, 1, 1, 12, tzinfo=dt.timezone.utc)
    host = socket.gethostname()[:63]
    fresh = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    old = (now - dt.timedelta(hours=7)).strftime("%Y-%m-%dT%H:%M:%SZ")
    import os
    assert not is_abandoned({OWNER_HOST: host, OWNER_PID: str(os.getpid()), CREATED: fresh}, 6, now)
    assert is_abandoned({OWNER_HOST: host, OWNER_PID: "999999999", CREATED: fresh}, 6, now)
    assert not is_abandoned({OWNER_HOST: "elsewhere", OWNER_PID: "1", CREATED: fresh}, 6, now)
    assert is_abandoned({OWNER_HOST: "elsewhere", OWNER_PID: "1", CREATED: old}, 6, now)
    assert not is_abandoned({}, 6, now)


def test_wait_for_is_bounded_and_reports_the_last_state():
    seen = iter(range(1000))
    with pytest.raises(WaitTimeout, match=r"counter reaches 10\^6: not reached within 0.2 s; last seen: \d+"):
        wait_for(lambda: next(seen), until=lambda n: n >= 10**6, timeout=0.2, interval=0.01,
                 what="counter reaches 10^6")
    assert wait_for(lambda: 5, timeout=1, what="five") == 5


class _Item:
    def __init__(self, destructive):
        self.destructive, self.added = destructive, []

    def get_closest_marker(self, name):
        return object() if name == "destructive" and self.destructive else None

    def add_marker(self, marker):
        self.added.append(marker)


@pytest.mark.parametrize("real,allowed,skipped", [
    pytest.param(True, False, True, id="real-cluster-without-opt-in-skips"),
    pytest.param(True, True, False, id="real-cluster-with-allow-destructive-runs"),
    pytest.param(False, False, False, id="simulated-cluster-runs")])
def test_destructive_checks_need_opt_in_on_real_hardware(real, allowed, skipped):
    import types

    import conftest
    from fixtures.stash import REAL_HARDWARE
    config = types.SimpleNamespace(stash={REAL_HARDWARE: real},
                                   option=types.SimpleNamespace(allow_destructive=allowed))
    harmless, destructive = _Item(False), _Item(True)
    conftest.pytest_collection_modifyitems(config, [harmless, destructive])
    assert not harmless.added
    assert bool(destructive.added) == skipped
    if skipped:
        assert "--allow-destructive" in destructive.added[0].kwargs["reason"]
